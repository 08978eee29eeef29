"""The pieces every route family declares its routes with, and the JSON Schema of a model.

Each route family declares a table of ``Route``s beside its handlers (``OPENAPI_ROUTES`` in
``smgrl/http/routes/workers.py``, ``rl_routes.py``, ``dataplane.py``, ...); ``smgrl/http/openapi/document.py``
assembles ``/openapi.json`` from those tables and nothing else, so a route, its models and the
error codes it answers are written once. A route serving GET also serves HEAD unless it says
``head=False``: the HEAD operation is derived (same statuses and headers, no body).

Models are attrs classes declared with ``@model`` (a field is required unless declared
``field(optional=True)``; ``field("its description", minimum=0, ...)`` adds JSON Schema keywords,
``field(schema={...})`` replaces the schema its type gives) or, for a body that is free-form, a
plain JSON Schema dict (which may hold model classes). ``schema_of`` turns a type into JSON Schema;
a model class is a ``$ref`` to ``components/schemas/<its name>`` unless it was declared ``inline``.
The error codes are never written as strings where an error class exists: a ``Resp`` lists the
classes (``errors=``) and the RL envelope's enum is made from them (``smgrl/http/openapi/schemas.py``).

Pure: attrs and the standard library only.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

import attrs

STRING: dict = {"type": "string"}
INT: dict = {"type": "integer"}
BOOL: dict = {"type": "boolean"}
NUMBER: dict = {"type": "number"}
ANY: dict = {"description": "any JSON value"}
OBJECT: dict = {"type": "object"}

# -- models ---------------------------------------------------------------------------------------

_MODEL = "__openapi_model__"


def model(
    cls: type | None = None,
    *,
    description: str = "",
    additional: bool = False,
    inline: bool = False,
    name: str = "",
) -> Any:
    """Declare a documentation model: an attrs class whose fields (in order) are the properties.
    ``additional``: unknown properties are allowed; ``inline``: rendered in place, not as a $ref
    (OpenAPI 3.0 ignores ``nullable`` beside a $ref); ``name``: its name under components when it
    is not the class name (an error class of smgrl/core/errors.py has that name already)."""

    def wrap(c: type) -> type:
        out = attrs.define(c, kw_only=True, slots=False)
        meta = {
            "description": description,
            "additional": additional,
            "inline": inline,
            "name": name or c.__name__,
        }
        setattr(out, _MODEL, meta)
        return out

    return wrap(cls) if cls is not None else wrap


def doc(description: str = "", **keywords: Any) -> dict:
    """Field metadata: a description and extra JSON Schema keywords (``minimum=0``, ...); a
    ``schema=`` keyword replaces the schema derived from the type."""
    out: dict[str, Any] = dict(keywords)
    if description:
        out["description"] = description
    return {"openapi": out}


def field(description: str = "", *, optional: bool = False, **keywords: Any) -> Any:
    """An attrs field with JSON Schema metadata; ``optional`` fields are not ``required``."""
    if optional:
        return attrs.field(default=None, metadata=doc(description, **keywords))
    return attrs.field(metadata=doc(description, **keywords))


def is_model(obj: Any) -> bool:
    return isinstance(obj, type) and hasattr(obj, _MODEL)


def model_name(cls: type) -> str:
    return getattr(cls, _MODEL)["name"]


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def schema_of(tp: Any, found: dict[str, type] | None = None) -> dict:
    """The JSON Schema of a type annotation. Model classes met on the way are added to ``found``
    (name -> class) so that the document can list them under components."""
    if isinstance(tp, dict):
        return _walk_models(tp, found)
    if is_model(tp):
        if getattr(tp, _MODEL)["inline"]:
            return model_schema(tp, found)
        name = model_name(tp)
        if found is not None:
            found[name] = tp
        return ref(name)
    if tp is str:
        return dict(STRING)
    if tp is bool:
        return dict(BOOL)
    if tp is int:
        return dict(INT)
    if tp is float:
        return dict(NUMBER)
    if tp is Any:
        return dict(ANY)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        kinds = {type(a) for a in args}
        base = {str: STRING, int: INT, bool: BOOL}[kinds.pop()] if len(kinds) == 1 else {}
        return {**base, "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            inner = schema_of(rest[0], found)
            if "$ref" in inner:
                raise TypeError(f"nullable $ref of {rest[0]!r}: declare the model inline")
            return {**inner, "nullable": True}
        return {"anyOf": [schema_of(a, found) for a in args]}
    if origin is list:
        return {"type": "array", "items": schema_of(args[0], found)} if args else {"type": "array"}
    if origin is dict:
        return {"type": "object", "additionalProperties": schema_of(args[1], found)}
    if tp is dict:
        return dict(OBJECT)
    raise TypeError(f"no JSON Schema for {tp!r}")


def model_schema(cls: type, found: dict[str, type] | None = None) -> dict:
    """The object schema of a model class (its fields in declaration order)."""
    meta = getattr(cls, _MODEL)
    hints = typing.get_type_hints(cls, include_extras=False)
    props: dict[str, dict] = {}
    required: list[str] = []
    for f in attrs.fields(cls):
        extra = dict(f.metadata.get("openapi", {}))
        base = (
            _walk_models(extra.pop("schema"), found) if "schema" in extra else schema_of(hints[f.name], found)
        )
        props[f.name] = {**base, **extra}
        if f.default is attrs.NOTHING:
            required.append(f.name)
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    out["additionalProperties"] = meta["additional"]
    if meta["description"]:
        out["description"] = meta["description"]
    return out


def _walk_models(node: Any, found: dict[str, type] | None) -> Any:
    """A JSON Schema dict whose values may hold model classes: each becomes its schema."""
    if is_model(node) or isinstance(node, type) or typing.get_origin(node) is not None:
        return schema_of(node, found)
    if isinstance(node, dict):
        return {k: _walk_models(v, found) for k, v in node.items()}
    if isinstance(node, list):
        return [_walk_models(v, found) for v in node]
    return node


# -- routes ---------------------------------------------------------------------------------------


@attrs.frozen
class RlOnly:
    """A parameter, schema alternative or description part that exists only with --enable-rl: the
    document of a gateway without it leaves it out."""

    value: Any


@attrs.frozen
class Param:
    """A path, query or header parameter (path parameters are always required)."""

    name: str
    where: Literal["path", "query", "header"]
    description: str = ""
    schema: Any = STRING
    required: bool = False
    example: Any = None
    allow_empty: bool = False

    def render(self, found: dict[str, type] | None = None) -> dict:
        out: dict[str, Any] = {
            "name": self.name,
            "in": self.where,
            "required": self.required or self.where == "path",
        }
        if self.allow_empty:
            out["allowEmptyValue"] = True
        if self.description:
            out["description"] = self.description
        out["schema"] = _walk_models(self.schema, found)
        if self.example is not None:
            out["example"] = self.example
        return out


def path_param(name: str, description: str, **kw: Any) -> Param:
    return Param(name, "path", description, **kw)


@attrs.frozen
class Body:
    """A request body: a model (or schema) per media type."""

    schema: Any
    required: bool = True
    description: str = ""
    media: str = "application/json"


@attrs.frozen
class Resp:
    """One status of an operation. ``content``: media type -> model or schema (``json(...)``);
    ``errors``: the error classes (anything with ``code``) this status answers with, which the
    tests hold against the classes each family raises; ``name``: a shared response, rendered as a
    ``$ref`` to ``components/responses/<name>``."""

    description: str
    content: Mapping[str, Any] = attrs.field(factory=dict)
    headers: Mapping[str, dict] = attrs.field(factory=dict)
    errors: tuple = ()
    name: str = ""

    def codes(self) -> set[str]:
        return {codes_of(e) for e in self.errors}


def codes_of(error: Any) -> str:
    if isinstance(error, RlOnly):
        error = error.value
    return error if isinstance(error, str) else error.code


def as_json(schema: Any) -> dict:
    return {"application/json": schema}


TEXT = {"text/plain; charset=utf-8": STRING}
HTML = {"text/html; charset=utf-8": STRING}

Security = Literal["control", "data", "open"]


@attrs.frozen
class Route:
    """One operation (method + path) as /openapi.json describes it.

    ``security``: ``control`` (a control-plane key; ``role`` ``read`` adds the 401, ``admin`` the
    401 and 403), ``data`` (a data-plane key; the family declares its own 401) or ``open``.
    ``rl_only``: served (and documented) only with --enable-rl (D1). ``name``: the handler's name,
    for a family that routes by name (``allow_table(..., by_name=True)``)."""

    method: str
    path: str
    operation_id: str
    tag: str
    summary: str
    responses: Mapping[str, Resp]
    description: str = ""
    security: Security = "control"
    role: Literal["read", "admin", ""] = ""
    params: tuple[Param, ...] = ()
    body: Body | None = None
    head: bool = True
    rl_only: bool = False
    name: str = ""

    def codes(self) -> set[str]:
        """Every error code the route documents."""
        return set().union(*(r.codes() for r in self.responses.values()))


def allow_table(routes: typing.Iterable[Route], *, by_name: bool = False) -> dict[str, str]:
    """path (or the route's ``name``) -> the methods its routes serve, in table order (a GET's HEAD
    after it): the ``allow`` of the path's 405, for a family that checks methods itself."""
    out: dict[str, list[str]] = {}
    for r in routes:
        key = r.name if by_name else r.path
        out.setdefault(key, []).extend([r.method, "HEAD"] if r.method == "GET" and r.head else [r.method])
    return {path: ",".join(methods) for path, methods in out.items()}


def evolve(route: Route, **changes: Any) -> Route:
    return attrs.evolve(route, **changes)

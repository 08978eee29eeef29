"""The pieces /openapi.json is generated from (smgrl/http/openapi/apidoc.py): attrs models to JSON Schema,
and the builder (smgrl/http/openapi/document.py) that turns route tables into operations."""

from __future__ import annotations

from typing import Any, Literal

import pytest

from smgrl.core.errors import InvalidSelector, NoWorkersMatch
from smgrl.core.view import RL_WORKER_ENTRY_ADDITIONS, RL_WORKER_ENTRY_FIELDS
from smgrl.http.openapi import document as openapi
from smgrl.http.openapi.apidoc import (
    ANY,
    Body,
    Param,
    Resp,
    RlOnly,
    Route,
    allow_table,
    as_json,
    field,
    model,
    model_schema,
    schema_of,
)
from smgrl.http.openapi.schemas import RlWorkerEntry, rl_error


@model(inline=True)
class _Inner:
    n: int


@model(name="Named", description="a named model")
class _Named:
    a: str


@pytest.mark.parametrize(
    ("tp", "schema"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (bool, {"type": "boolean"}),
        (float, {"type": "number"}),
        (Any, ANY),
        (dict, {"type": "object"}),
        (str | None, {"type": "string", "nullable": True}),
        (Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}),
        (Literal[1], {"type": "integer", "enum": [1]}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (dict[str, int], {"type": "object", "additionalProperties": {"type": "integer"}}),
        (str | int, {"anyOf": [{"type": "string"}, {"type": "integer"}]}),
        (_Named, {"$ref": "#/components/schemas/Named"}),
        (list[_Named], {"type": "array", "items": {"$ref": "#/components/schemas/Named"}}),
        (
            _Inner | None,
            {
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
                "additionalProperties": False,
                "nullable": True,
            },
        ),
        (
            {"anyOf": [_Named, {"type": "string"}]},
            {"anyOf": [{"$ref": "#/components/schemas/Named"}, {"type": "string"}]},
        ),
    ],
)
def test_schema_of(tp, schema):
    assert schema_of(tp) == schema


def test_a_nullable_reference_is_refused():
    # OpenAPI 3.0 ignores `nullable` beside a $ref: such a model must be declared inline.
    with pytest.raises(TypeError, match="inline"):
        schema_of(_Named | None)
    with pytest.raises(TypeError):
        schema_of(set[int])


def test_model_schema_fields_in_order_required_unless_optional():
    @model(additional=True, description="d")
    class M:
        b: int = field("the b", minimum=1)
        a: str | None
        c: list[_Named] = field(optional=True)
        d: dict = field(optional=True, schema={"type": "object", "additionalProperties": True})

    found: dict[str, type] = {}
    assert model_schema(M, found) == {
        "type": "object",
        "properties": {
            "b": {"type": "integer", "minimum": 1, "description": "the b"},
            "a": {"type": "string", "nullable": True},
            "c": {"type": "array", "items": {"$ref": "#/components/schemas/Named"}},
            "d": {"type": "object", "additionalProperties": True},
        },
        "required": ["b", "a"],
        "additionalProperties": True,
        "description": "d",
    }
    assert list(found) == ["Named"]  # met on the way: listed under components


def test_rl_error_lists_exactly_the_codes_and_their_context():
    schema = rl_error(InvalidSelector, NoWorkersMatch, "internal_error")
    assert schema["properties"]["error"]["enum"] == ["invalid_selector", "no_workers_match", "internal_error"]
    assert set(schema["properties"]) == {"error", "message", "offset", "selector"}
    assert schema["required"] == ["error", "message"]


def test_the_discovery_row_model_is_the_views_field_list():
    """RlWorkerEntry's properties are smgrl/core/view.py's row fields, in SMG's order."""
    schema = model_schema(RlWorkerEntry)
    assert tuple(schema["properties"]) == RL_WORKER_ENTRY_FIELDS + RL_WORKER_ENTRY_ADDITIONS
    assert tuple(schema["required"]) == RL_WORKER_ENTRY_FIELDS


def _table():
    get = Route(
        "GET",
        "/things/{id}",
        "getThing",
        "t",
        "A thing",
        {
            "200": Resp("The thing.", as_json(_Named)),
            "404": Resp("No such thing.", as_json(rl_error("nope"))),
        },
        role="read",
        params=(Param("id", "path", "the id"), RlOnly(Param("x-policy", "header", "rl only"))),
    )
    post = Route(
        "POST",
        "/things",
        "postThing",
        "t",
        "Make a thing",
        {"201": Resp("Made.", as_json({"anyOf": [_Named, RlOnly(rl_error("rl_only_code"))]}))},
        role="admin",
        body=Body(_Inner),
        head=True,  # ignored: only a GET has a HEAD
    )
    sse = Route(
        "GET", "/stream", "getStream", "t", "A stream", {"200": Resp("s")}, security="open", head=False
    )
    return (get, post, sse)


def test_the_builder_derives_head_auth_and_drops_rl_only_parts(monkeypatch):
    monkeypatch.setattr(openapi, "families", lambda: [_table()])
    doc = openapi.document(True)
    paths = doc["paths"]
    assert set(paths) == {"/things/{id}", "/things", "/stream"}
    assert set(paths["/things/{id}"]) == {"get", "head"} and set(paths["/things"]) == {"post"}
    assert set(paths["/stream"]) == {"get"}
    get, head = paths["/things/{id}"]["get"], paths["/things/{id}"]["head"]
    assert head["operationId"] == "headThing" and head["summary"] == "HEAD of A thing"
    assert "content" in get["responses"]["200"] and "content" not in head["responses"]["200"]
    assert head["responses"]["200"]["headers"] == get["responses"]["200"]["headers"]
    # role read: the shared 401; role admin: 401 and 403; open: no auth answer, no security
    assert get["responses"]["401"] == {"$ref": "#/components/responses/Unauthorized"}
    assert "403" not in get["responses"] and "403" in paths["/things"]["post"]["responses"]
    assert "401" not in paths["/stream"]["get"]["responses"] and paths["/stream"]["get"]["security"] == []
    assert [p["name"] for p in get["parameters"]] == ["id", "x-policy"]
    assert get["parameters"][0]["required"] is True  # a path parameter always is
    # every model met is under components, and every response carries x-request-id
    assert set(doc["components"]["schemas"]) >= {"Named", "ApiKeyError"}
    assert "_Inner" not in doc["components"]["schemas"]  # inline
    assert all("x-request-id" in r["headers"] for r in get["responses"].values() if "headers" in r)
    assert "rl_only_code" in str(paths["/things"]["post"])

    plain = openapi.document(False)["paths"]
    assert [p["name"] for p in plain["/things/{id}"]["get"]["parameters"]] == ["id"]
    assert "rl_only_code" not in str(plain["/things"]["post"])


def test_a_route_in_two_tables_is_refused(monkeypatch):
    get = _table()[0]
    monkeypatch.setattr(openapi, "families", lambda: [(get,), (get,)])
    with pytest.raises(ValueError, match="two route tables"):
        openapi.document(True)


def test_allow_table_is_the_tables_methods_in_order():
    assert allow_table(_table()) == {"/things/{id}": "GET,HEAD", "/things": "POST", "/stream": "GET"}


@pytest.mark.parametrize(
    ("name", "fields", "aliases"),
    [("WorkerSpec", "WORKER_SPEC", "WORKER_SPEC_ALIASES"), ("WorkerUpdate", "WORKER_UPDATE", None)],
)
def test_the_workers_body_models_say_what_the_body_reader_takes(name, fields, aliases):
    # One schema for the /workers bodies: the document's properties, their enums, nullability and
    # integer bounds are the serde kinds the reader checks (an enum value the reader takes, such as
    # the `encode` worker type, was once missing from the document).
    from smgrl.http.bodies import workers_body

    kinds = getattr(workers_body, fields)
    alias_of = getattr(workers_body, aliases) if aliases else {}
    props = openapi.document()["components"]["schemas"][name]["properties"]
    assert props
    limits = {"u16": 65535, "u32": 4294967295}
    for shown, prop in props.items():
        kind = kinds[alias_of.get(shown, shown)]
        assert prop.get("nullable", False) == kind.startswith("opt_"), shown
        base = kind.removeprefix("opt_")
        if base.startswith("enum:"):
            assert prop["enum"] == base[5:].split(","), shown
        elif base in limits:
            assert (prop["type"], prop["minimum"], prop["maximum"]) == ("integer", 0, limits[base]), shown
        else:
            want = {"str": "string", "f32": "number", "map_str": "object", "usize": "integer"}[base]
            assert prop["type"] == want, shown

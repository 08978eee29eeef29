"""Typed request-body checks shared by the flavours; each flavour renders the errors its way.

A spec maps field name -> (allowed types, default); ``REQUIRED`` marks a field without default.
Errors are pydantic-shaped dicts ({"type", "loc", "msg", "input"}) because that is what
SGLang and vLLM put in their 400 messages.
"""

from __future__ import annotations

import json
from typing import Any

REQUIRED: Any = object()
STR = (str,)
INT = (int,)
FLOAT = (int, float)
BOOL = (bool,)
LIST = (list,)
DICT = (dict,)
OPT_STR = (str, type(None))
OPT_INT = (int, type(None))
OPT_FLOAT = (int, float, type(None))
OPT_LIST = (list, type(None))
OPT_DICT = (dict, type(None))
ANY = (object,)

Spec = dict[str, tuple[tuple[type, ...], Any]]

_TYPE_MSG = {
    str: ("string_type", "Input should be a valid string"),
    int: ("int_type", "Input should be a valid integer"),
    float: ("float_type", "Input should be a valid number"),
    bool: ("bool_type", "Input should be a valid boolean"),
    list: ("list_type", "Input should be a valid list"),
    dict: ("dict_type", "Input should be a valid dictionary"),
}


def loose_json(body: bytes) -> Any:
    """The body as JSON, or None when it is empty or not JSON (the caller then refuses it its way)."""
    try:
        return json.loads(body) if body else None
    except ValueError:
        return None


def missing_body() -> dict[str, Any]:
    return {"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}


def decode_object(
    body: bytes, content_type: str | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(object, error) for a JSON-object body, following FastAPI's body rules.

    No content type: parsed as JSON. A non-JSON content type: the raw bytes reach validation and
    fail. Empty body: the required body is missing.
    """
    if not body:
        return None, missing_body()
    if content_type is not None:
        main = content_type.split(";", 1)[0].strip().lower()
        if not (main == "application/json" or (main.startswith("application/") and main.endswith("+json"))):
            return None, {
                "type": "model_attributes_type",
                "loc": ["body"],
                "msg": "Input should be a valid dictionary or object to extract fields from",
                "input": body.decode("utf-8", "replace"),
            }
    try:
        value = json.loads(body)
    except ValueError as exc:
        return None, {
            "type": "json_invalid",
            "loc": ["body", 0],
            "msg": "JSON decode error",
            "input": {},
            "ctx": {"error": str(exc)},
        }
    if not isinstance(value, dict):
        return None, {
            "type": "model_attributes_type",
            "loc": ["body"],
            "msg": "Input should be a valid dictionary or object to extract fields from",
            "input": value,
        }
    return value, None


def check(obj: dict[str, Any], spec: Spec) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Values with defaults filled in (unknown keys ignored), and the list of errors."""
    values: dict[str, Any] = {}
    errors: list[dict[str, Any]] = []
    for name, (types, default) in spec.items():
        if name not in obj:
            if default is REQUIRED:
                errors.append(
                    {"type": "missing", "loc": ["body", name], "msg": "Field required", "input": obj}
                )
            else:
                values[name] = default
            continue
        value = obj[name]
        if not _is_instance(value, types):
            kind, msg = _TYPE_MSG.get(types[0], ("value_error", "Invalid value"))
            errors.append({"type": kind, "loc": ["body", name], "msg": msg, "input": value})
            continue
        values[name] = value
    return values, errors


def literal_error(name: str, value: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
    expected = " or ".join([", ".join(repr(a) for a in allowed[:-1]), repr(allowed[-1])])
    return {
        "type": "literal_error",
        "loc": ["body", name],
        "msg": f"Input should be {expected}",
        "input": value,
        "ctx": {"expected": expected},
    }


def pydantic_text(errors: list[dict[str, Any]]) -> str:
    """Roughly str(RequestValidationError): a count line, then one repr per error."""
    noun = "error" if len(errors) == 1 else "errors"
    lines = [f"{len(errors)} validation {noun}:"]
    for err in errors:
        shown = {**err, "loc": tuple(err["loc"])}
        lines.append(f"  {shown!r}")
    return "\n".join(lines) + "\n"


def _is_instance(value: Any, types: tuple[type, ...]) -> bool:
    if object in types:
        return True
    if isinstance(value, bool):
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)

"""What ``smgrl journal verify`` checks beyond the hash chain (pure): event schemas, snapshots.

Schemas: a catalogued type must decode into its class (no missing or unknown fields), and every
field must hold a value of its annotated type. ``Literal`` fields are checked for their base type
only: the catalogue's literals are documentation, and a stricter check would condemn journals for
a value the gateway legitimately writes. A type the catalogue does not know, or a newer schema of
a known type, was written by a newer smgrl: reported, not a failure.
"""

from __future__ import annotations

import functools
import types
import typing
from collections.abc import Mapping
from typing import Any

import attrs

from journal.codec import UnknownEvent
from smgrl.events import decode, event_class

__all__ = ["diff_paths", "payload_problem"]


def _conforms(value: Any, hint: Any) -> bool:
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, a) for a in args)
    if origin is typing.Literal:
        return any(isinstance(value, type(a)) for a in args)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if not isinstance(value, dict):
            return False
        if not args:
            return True
        return all(_conforms(k, args[0]) and _conforms(v, args[1]) for k, v in value.items())
    if origin is tuple or hint is tuple:
        if not isinstance(value, (tuple, list)):
            return False
        if args and len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True  # an annotation this checker does not model: do not guess


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def payload_problem(type_: str, schema: int, payload: str) -> tuple[str, str] | None:
    """``("error"|"newer", why)`` when a stored event does not fit this smgrl's catalogue, else None."""
    cls = event_class(type_)
    if cls is None:
        return "newer", f"event type {type_!r} is not in this smgrl's catalogue"
    if schema > cls.SCHEMA:
        return "newer", f"{type_} schema {schema} is newer than this smgrl's ({cls.SCHEMA})"
    event = decode(type_, schema, payload)
    if isinstance(event, UnknownEvent):
        if isinstance(event.payload, str):
            return "error", f"{type_}: payload is not JSON"
        if not isinstance(event.payload, dict):
            return "error", f"{type_}: payload is not a JSON object"
        fields = {f.name for f in attrs.fields(cls)}
        required = {f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING}
        extra, missing = set(event.payload) - fields, required - set(event.payload)
        return (
            "error",
            f"{type_}: payload does not fit its schema (unknown {sorted(extra)}, missing {sorted(missing)})",
        )
    hints = _hints(cls)
    for f in attrs.fields(cls):
        value = getattr(event, f.name)
        if isinstance(value, tuple):
            value = list(value)
        if not _conforms(value, hints.get(f.name, Any)):
            return "error", f"{type_}: field {f.name!r} holds {type(value).__name__} {value!r:.60}"
    return None


def diff_paths(a: Any, b: Any, path: str = "", *, limit: int = 5) -> list[str]:
    """Where two JSON values differ (dotted paths, at most ``limit``)."""
    out: list[str] = []
    _diff(a, b, path, out, limit)
    return out


def _diff(a: Any, b: Any, path: str, out: list[str], limit: int) -> None:
    if len(out) >= limit:
        return
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in a or key not in b:
                out.append(sub)
            else:
                _diff(a[key], b[key], sub, out, limit)
            if len(out) >= limit:
                return
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{path}[{i}]", out, limit)
    elif a != b:
        out.append(path or "(root)")

"""The kinds of serde_body's schemas: serde's integer limits, SMG's chat roles and nested structs,
and the JSON Schema each kind is documented with (pure)."""

from __future__ import annotations

from typing import Any

__all__ = ["CHAT_ROLES", "INT_LIMITS", "MAX_DEPTH", "SIGNED_LIMITS", "STRUCTS", "WS", "kind_schema"]

WS = b" \t\n\r"
MAX_DEPTH = 128
INT_LIMITS = {"u16": 0xFFFF, "u32": 0xFFFFFFFF, "usize": 0xFFFFFFFFFFFFFFFF, "u64": 0xFFFFFFFFFFFFFFFF}
SIGNED_LIMITS = {"i32": 2**31, "i64": 2**63}


# SMG's ChatMessage variants (the ``role`` tag), in its order.
CHAT_ROLES = ("system", "user", "assistant", "tool", "function", "developer", "root")
# Nested structs whose required fields matter: name -> (typed fields, required, field count).
STRUCTS = {"ModelCard": ({"id": "str"}, ("id",), 15)}


def kind_schema(kind: str) -> dict[str, Any]:
    """The JSON Schema (OpenAPI 3.0) of the values a field of ``kind`` takes: what /openapi.json
    says of a body the serde reader checks. The kinds the /workers bodies use."""
    if kind.startswith("opt_"):
        base = _BASE[kind[4:]] if kind[4:] in _BASE else _bounded(kind[4:])
        bounds = {k: v for k, v in base.items() if k in ("minimum", "maximum")}
        rest = {k: v for k, v in base.items() if k not in bounds}
        return {**rest, "nullable": True, **bounds}
    if kind.startswith("enum:"):
        return {"type": "string", "enum": kind[5:].split(",")}
    return dict(_BASE[kind]) if kind in _BASE else _bounded(kind)


_BASE: dict[str, dict[str, Any]] = {
    "str": {"type": "string"},
    "f32": {"type": "number"},
    "map_str": {"type": "object", "additionalProperties": {"type": "string"}},
}


def _bounded(kind: str) -> dict[str, Any]:
    if kind == "usize":  # 2^64 - 1 is past what a JSON Schema reader takes as an integer
        return {"type": "integer", "minimum": 0}
    if kind in INT_LIMITS:
        return {"type": "integer", "minimum": 0, "maximum": INT_LIMITS[kind]}
    raise ValueError(f"no JSON Schema for the serde kind {kind!r}")

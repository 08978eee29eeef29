"""Parse a ``/workers`` JSON body exactly as SMG's axum ``Json<T>`` extractor does (pure).

SMG answers a bad body with serde_json's error text, wrapped by ``serde_path_to_error`` (a field
path prefix) and axum (``Failed to ...``): clients and operators see e.g. ``labels.x: invalid
type: integer `1`, expected a string at line 1 column 35``. Python's json reports other texts and
positions, and reads the whole document before any type check, so this is a small streaming
parser with serde_json's rules: errors in document order, serde's messages, its line/column
convention (column = bytes since the start of the line; a *peek* error points one past the
consumed text), a recursion limit of 128, and typed fields checked as they are met.

A schema maps known field names to a type; unknown fields are parsed for syntax only (serde's
``IgnoredAny``). Types: ``str``, ``opt_str``, ``u16|u32|usize`` (``opt_`` prefix allows null),
``f32``, ``map_str`` (``opt_map_str``), ``seq``, ``enum:<a>,<b>``, ``struct:<Name>``; for the
OpenAI request structs (``smgrl.http.bodies.dataplane_body``) also ``i32|i64|u64``, ``bool`` (``bool_nf``:
null reads as false), ``map_f32``, ``map`` (any map), ``untagged:<Name>`` (a value checked by
``untagged_ok`` after it is read, as serde buffers an untagged enum) and ``messages`` (a sequence
of the internally tagged ``ChatMessage``, tag ``role``). With ``track_any`` the path follows
unknown fields into their nested containers (serde_path_to_error over a ``Value``), as SMG's
``#[serde(flatten)] other`` map does.

Two readers, one answer: ``fast_parse`` parses with the ``json`` module and checks the schema on
the result (the normal path, for bodies that are fine); ``parse_struct`` falls back to the
byte-by-byte serde reader only when the fast path declines, i.e. to render the error text of a
body that failed (or to decide the rare valid body the fast path leaves to it: invalid UTF-8 in
an ignored string, a repeated key, a surrogate escape). tests/unit/test_serde_body.py checks, on
generated bodies, that the fast path accepts exactly what the serde reader accepts, with the same
value.
"""

from __future__ import annotations

from typing import Any

from smgrl.http.bodies.serde_fast import fast_parse, field_ok
from smgrl.http.bodies.serde_kinds import MAX_DEPTH
from smgrl.http.bodies.serde_reader import _Err, _Parser

# The reading of serde bodies, in three modules: serde_kinds (the schema's kinds and limits),
# serde_reader (the byte-by-byte serde reader), serde_fast (json plus the schema's checks).
__all__ = ["MAX_DEPTH", "SerdeError", "fast_parse", "field_ok", "parse_struct", "serde_struct"]


class SerdeError(Exception):
    """``syntax`` is True for serde's Syntax/Eof categories (axum: "Failed to parse the request
    body as JSON"), False for Data ("Failed to deserialize the JSON body into the target type")."""

    def __init__(self, message: str, syntax: bool, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.syntax = syntax
        self.path = path  # where serde_path_to_error says the error is ("" = the root)


def parse_struct(
    data: bytes,
    name: str,
    fields: dict[str, str],
    required: tuple[str, ...] = (),
    field_count: int | None = None,
    aliases: dict[str, str] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """The body as ``{field: value}`` for the schema's known fields (``aliases`` maps other
    accepted names onto them); SerdeError with SMG's text. ``options``: ``serde_struct``'s
    (``flatten``, ``untagged_ok``). The fast path answers; the serde reader only when it declines."""
    parsed = fast_parse(data, fields, required, aliases, **options)
    if parsed is not None:
        return parsed[1]
    return serde_struct(data, name, fields, required, field_count, aliases, **options)


# parse_struct's signature on purpose: its fallback, and callable alone (tests compare the two paths).
def serde_struct(
    data: bytes,
    name: str,
    fields: dict[str, str],
    required: tuple[str, ...] = (),
    field_count: int | None = None,
    aliases: dict[str, str] | None = None,
    *,
    flatten: bool = False,
    untagged_ok=None,
) -> dict[str, Any]:
    """``parse_struct`` by the serde-compatible reader alone (errors in serde's order and text).
    ``flatten``: the struct keeps its unknown fields in a ``#[serde(flatten)]`` map of ``Value``
    (SMG's OpenAI requests); ``untagged_ok(name, value)``: does a value match an untagged enum."""
    p = _Parser(data, track_any=flatten, untagged_ok=untagged_ok)
    try:
        out = p.struct(name, fields, required, aliases or {})
        if p.ws() is not None:
            raise p.peek_err("trailing characters")
        return out
    except _Err as exc:
        msg = exc.msg.replace("{n}", str(field_count if field_count is not None else len(fields)))
        located = f"{msg} at {p.position(exc.pos if exc.pos is not None else p.i)}"
        path = ".".join(p.path)
        raise SerdeError(f"{path}: {located}" if path else located, exc.syntax, path) from None

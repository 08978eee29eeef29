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

import decimal
import json
import re
from typing import Any

WS = b" \t\n\r"
MAX_DEPTH = 128
_INT_LIMITS = {"u16": 0xFFFF, "u32": 0xFFFFFFFF, "usize": 0xFFFFFFFFFFFFFFFF, "u64": 0xFFFFFFFFFFFFFFFF}
_SIGNED_LIMITS = {"i32": 2**31, "i64": 2**63}


# SMG's ChatMessage variants (the ``role`` tag), in its order.
CHAT_ROLES = ("system", "user", "assistant", "tool", "function", "developer", "root")
# Nested structs whose required fields matter: name -> (typed fields, required, field count).
STRUCTS = {"ModelCard": ({"id": "str"}, ("id",), 15)}


class SerdeError(Exception):
    """``syntax`` is True for serde's Syntax/Eof categories (axum: "Failed to parse the request
    body as JSON"), False for Data ("Failed to deserialize the JSON body into the target type")."""

    def __init__(self, message: str, syntax: bool, path: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.syntax = syntax
        self.path = path  # where serde_path_to_error says the error is ("" = the root)


class _Err(Exception):
    def __init__(self, msg: str, syntax: bool, pos: int | None) -> None:
        self.msg, self.syntax, self.pos = msg, syntax, pos


def _float_text(value: float) -> str:
    """Rust's ``{}`` for f64 with serde's ``WithDecimalPoint``: plain digits, always a point."""
    text = format(decimal.Decimal(repr(value)), "f")
    return text if "." in text else text + ".0"


class _Parser:
    def __init__(self, data: bytes, track_any: bool = False, untagged_ok=None) -> None:
        self.d = data
        self.i = 0
        self.depth = 0
        self.path: list[str] = []
        self.track_any = track_any
        self.flatten = track_any  # the structs with a flatten map are the ones that track it
        # untagged_ok(name, value) -> bool: does a buffered value match an untagged enum?
        self.untagged_ok = untagged_ok

    # -- positions -----------------------------------------------------------------------------

    def position(self, index: int) -> str:
        line_start = self.d.rfind(b"\n", 0, index) + 1
        line = self.d.count(b"\n", 0, index) + 1
        return f"line {line} column {index - line_start}"

    def err(self, msg: str, syntax: bool = True) -> _Err:  # at the consumed position
        return _Err(msg, syntax, self.i)

    def peek_err(self, msg: str, syntax: bool = True) -> _Err:  # one past it
        return _Err(msg, syntax, min(self.i + 1, len(self.d)))

    # -- scanning ------------------------------------------------------------------------------

    def ws(self) -> int | None:
        d = self.d
        while self.i < len(d) and d[self.i] in WS:
            self.i += 1
        return d[self.i] if self.i < len(d) else None

    def string(self, validate: bool = True) -> str:
        """At an opening quote: consume the string and return it. Unvalidated (an ignored value,
        serde's IgnoredAny), a ``\\u`` escape only needs four hex digits, and the value is the
        one ``json`` reads (lone surrogates kept; invalid UTF-8, which only serde accepts here,
        replaced), so both readers give an ignored value alike."""
        start = self.i
        self.i += 1
        out = bytearray()
        d = self.d
        while True:
            if self.i >= len(d):
                raise self.err("EOF while parsing a string")
            c = d[self.i]
            self.i += 1
            if c == 0x22:
                if not validate:
                    return json.loads(d[start : self.i].decode("utf-8", "replace"))
                try:
                    return out.decode("utf-8")
                except UnicodeDecodeError:
                    raise self.err("invalid unicode code point") from None
            if c == 0x5C:
                if self.i >= len(d):
                    raise self.err("EOF while parsing a string")
                e = d[self.i]
                self.i += 1
                simple = {
                    0x22: b'"',
                    0x5C: b"\\",
                    0x2F: b"/",
                    0x62: b"\b",
                    0x66: b"\f",
                    0x6E: b"\n",
                    0x72: b"\r",
                    0x74: b"\t",
                }
                if e in simple:
                    out += simple[e]
                elif e == 0x75:
                    if validate:
                        out += self._unicode_escape()
                    else:
                        self._hex4()
                else:
                    raise self.err("invalid escape")
            elif c < 0x20:
                self.i -= 1  # serde points at the control character itself
                raise self.err("control character (\\u0000-\\u001F) found while parsing a string")
            else:
                out.append(c)

    def _hex4(self) -> int:
        # serde reads the four digits at once, then checks them.
        if self.i + 4 > len(self.d):
            self.i = len(self.d)
            raise self.err("EOF while parsing a string")
        digits = self.d[self.i : self.i + 4].decode("latin-1")
        self.i += 4
        if any(c not in "0123456789abcdefABCDEF" for c in digits):
            raise self.err("invalid escape")
        return int(digits, 16)

    def _unicode_escape(self) -> bytes:
        n = self._hex4()
        if 0xDC00 <= n <= 0xDFFF:
            raise self.err("lone leading surrogate in hex escape")
        if 0xD800 <= n <= 0xDBFF:
            for expected in b"\\u":
                if self.i >= len(self.d):
                    raise self.err("EOF while parsing a string")
                self.i += 1
                if self.d[self.i - 1] != expected:
                    raise self.err("unexpected end of hex escape")
            low = self._hex4()
            if not 0xDC00 <= low <= 0xDFFF:
                raise self.err("lone leading surrogate in hex escape")
            n = 0x10000 + ((n - 0xD800) << 10) + (low - 0xDC00)
        return chr(n).encode("utf-8")

    def number(self) -> int | float:
        d, start = self.d, self.i
        if d[self.i] == 0x2D:
            self.i += 1
        if self.i >= len(d):
            raise self.err("EOF while parsing a value")
        c = d[self.i]
        self.i += 1
        if c == 0x30:
            if self.i < len(d) and 0x30 <= d[self.i] <= 0x39:
                raise self.peek_err("invalid number")
        elif not 0x31 <= c <= 0x39:
            raise self.err("invalid number")
        while self.i < len(d) and 0x30 <= d[self.i] <= 0x39:
            self.i += 1
        is_float = False
        if self.i < len(d) and d[self.i] == 0x2E:
            is_float = True
            self.i += 1
            self._digits(d)
        if self.i < len(d) and d[self.i] in b"eE":
            is_float = True
            self.i += 1
            if self.i < len(d) and d[self.i] in b"+-":
                self.i += 1
            self._digits(d)
        text = d[start : self.i].decode("ascii")
        # More than 20 digits is beyond u64 anyway: serde reads it as f64, and int() would
        # raise ValueError past Python's 4300-digit limit (a 500, not serde's error).
        if not is_float and len(text) <= 21:
            value = int(text)
            if value == 0 and text.startswith("-"):
                return -0.0
            if -(2**63) <= value < 2**64:
                return value
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise self.err("number out of range")
        return value

    def _digits(self, d: bytes) -> None:
        """One or more digits (a fraction's or an exponent's), with serde's errors."""
        if self.i >= len(d):
            raise self.err("EOF while parsing a value")
        if not 0x30 <= d[self.i] <= 0x39:
            self.i += 1
            raise self.err("invalid number")
        while self.i < len(d) and 0x30 <= d[self.i] <= 0x39:
            self.i += 1

    def ident(self, rest: bytes, value: Any) -> Any:
        self.i += 1
        for expected in rest:
            if self.i >= len(self.d):
                raise self.err("EOF while parsing a value")
            got = self.d[self.i]
            self.i += 1
            if got != expected:
                raise self.err("expected ident")
        return value

    def any_value(self) -> Any:
        """A value of any shape (serde_json's ``Value``/``IgnoredAny``), syntax-checked."""
        c = self.ws()
        if c is None:
            raise self.peek_err("EOF while parsing a value")
        if c == 0x22:
            # A serde_json ``Value`` (track_any) checks its strings; ``IgnoredAny`` does not.
            return self.string(validate=self.track_any)
        if c == 0x2D or 0x30 <= c <= 0x39:
            return self.number()
        if c == 0x74:
            return self.ident(b"rue", True)
        if c == 0x66:
            return self.ident(b"alse", False)
        if c == 0x6E:
            return self.ident(b"ull", None)
        if c == 0x5B:
            if not self.track_any:
                return self._container(b"]", "list", lambda: self.any_value())
            if not self.path:
                self.path.append("")
            base = self.path[-1]
            items: list[Any] = []

            def element():
                self.path[-1] = f"{base}[{len(items)}]"
                items.append(self.any_value())
                self.path[-1] = base

            self._container(b"]", "list", element)
            return items
        if c == 0x7B:
            out = {}

            def entry():
                key = self.string(validate=self.track_any)
                self.colon()
                if self.track_any:
                    self.path.append(key)
                out[key] = self.any_value()
                if self.track_any:
                    self.path.pop()

            self._container(b"}", "object", entry, keys=True)
            return out
        raise self.peek_err("expected value")

    def colon(self) -> None:
        c = self.ws()
        if c == 0x3A:
            self.i += 1
        elif c is None:
            raise self.peek_err("EOF while parsing an object")
        else:
            raise self.peek_err("expected `:`")

    def _container(self, close: bytes, kind: str, item, keys: bool = False) -> list:
        self.depth += 1
        if self.depth >= MAX_DEPTH:
            raise self.peek_err("recursion limit exceeded")
        self.i += 1
        items = []
        first = True
        while True:
            c = self.ws()
            if c == close[0]:
                self.i += 1
                break
            if c is None:
                raise self.peek_err(f"EOF while parsing {'an object' if keys else 'a list'}")
            if not first:
                if c != 0x2C:
                    raise self.peek_err(f"expected `,` or `{close.decode()}`")
                self.i += 1
                c = self.ws()
                if c == close[0]:
                    raise self.peek_err("trailing comma")
                if c is None:
                    raise self.peek_err("EOF while parsing a value")
            first = False
            if keys and c != 0x22:
                raise self.peek_err("key must be a string")
            items.append(item())
        self.depth -= 1
        return items

    # -- typed values --------------------------------------------------------------------------

    def unexpected(self) -> str:
        """Consume a scalar (not a container) and describe it as serde's ``Unexpected``."""
        c = self.ws()
        if c == 0x5B:
            return "sequence"
        if c == 0x7B:
            return "map"
        value = self.any_value()
        if value is None:
            return "null"
        if isinstance(value, bool):
            return f"boolean `{'true' if value else 'false'}`"
        if isinstance(value, int):
            return f"integer `{value}`"
        if isinstance(value, float):
            return f"floating point `{_float_text(value)}`"
        return f"string {json.dumps(value, ensure_ascii=False)}"

    def invalid_type(self, expected: str) -> _Err:
        what = self.unexpected()
        return self.err(f"invalid type: {what}, expected {expected}", syntax=False)

    def typed(self, kind: str) -> Any:
        c = self.ws()
        if c is None:
            raise self.peek_err("EOF while parsing a value")
        if kind.startswith("opt_"):
            if c == 0x6E:
                return self.ident(b"ull", None)
            kind = kind[4:]
        if kind == "str":
            if c == 0x22:
                return self.string()
            raise self.invalid_type("a string")
        if kind in _INT_LIMITS or kind in _SIGNED_LIMITS:
            return self._integer(kind, c)
        if kind in ("bool", "bool_nf"):
            if kind == "bool_nf" and c == 0x6E:
                self.ident(b"ull", None)
                return False
            if c == 0x74:
                return self.ident(b"rue", True)
            if c == 0x66:
                return self.ident(b"alse", False)
            raise self.invalid_type("a boolean")
        if kind == "map":
            if c != 0x7B:
                raise self.invalid_type("a map")
            return self.any_value()
        if kind.startswith("untagged:"):
            # serde buffers the value, then tries each variant: the error has no position of
            # its own (the enclosing container's end stamps it).
            value = self.any_value()
            if self.untagged_ok is not None and not self.untagged_ok(kind[9:], value):
                name = kind[9:].partition("|")[0]  # "|...": smgrl's own variants of it
                raise _Err(f"data did not match any variant of untagged enum {name}", False, None)
            return value
        if kind == "messages":
            return self._messages(c)
        if kind == "f32":
            if c == 0x2D or 0x30 <= c <= 0x39:
                return self.number()
            raise self.invalid_type("f32")
        if kind in ("map_str", "map_f32"):
            if c != 0x7B:
                raise self.invalid_type("a map")
            value_kind = "str" if kind == "map_str" else "f32"
            out: dict[str, Any] = {}
            # serde_path_to_error names a map entry whose key is not read yet `?`.
            self.path.append("?")

            def entry():
                key = self.string()
                self.path.pop()  # between key and value the path is the map's own
                self.colon()
                self.path.append(key)
                out[key] = self.typed(value_kind)
                self.path[-1] = "?"

            self._container(b"}", "object", entry, keys=True)
            self.path.pop()
            return out
        if kind.startswith("seq"):
            if c != 0x5B:
                raise self.invalid_type("a sequence")
            element = kind.partition(":")[2]
            if not element:
                return self.any_value()
            items = []
            base = self.path.pop()

            def item():
                self.path.append(f"{base}[{len(items)}]")
                items.append(self.typed(element))
                self.path.pop()

            self._container(b"]", "list", item)
            self.path.append(base)
            return items
        if kind.startswith("struct:"):
            name = kind[7:]
            if name in STRUCTS:
                fields, required, count = STRUCTS[name]
                try:
                    return self.struct(name, fields, required, {})
                except _Err as exc:
                    exc.msg = exc.msg.replace("{n}", str(count))
                    raise
            if c != 0x7B:
                raise self.invalid_type(f"struct {name}")
            return self.any_value()
        if kind.startswith("enum:"):
            return self._enum(kind[5:].split(","), c)
        return self.any_value()

    def _integer(self, kind: str, c: int) -> int:
        if not (c == 0x2D or 0x30 <= c <= 0x39):
            raise self.invalid_type(kind)
        value = self.number()
        if isinstance(value, float):
            raise self.err(
                f"invalid type: floating point `{_float_text(value)}`, expected {kind}", syntax=False
            )
        if kind in _SIGNED_LIMITS:
            bound = _SIGNED_LIMITS[kind]
            if not -bound <= value < bound:
                raise self.err(f"invalid value: integer `{value}`, expected {kind}", syntax=False)
        elif not 0 <= value <= _INT_LIMITS[kind]:
            raise self.err(f"invalid value: integer `{value}`, expected {kind}", syntax=False)
        return value

    def _messages(self, c: int) -> list:
        """``Vec<ChatMessage>``: ``ChatMessage`` is internally tagged by ``role`` (serde reads
        the map until the tag, buffering the rest, and checks the variant as soon as the tag is
        read); its ``content`` is the untagged ``MessageContent``. Only the tag and the content's
        shape are checked here; the rest of a message is the engine's to judge."""
        if c != 0x5B:
            raise self.invalid_type("a sequence")
        base = self.path.pop()
        items: list[Any] = []
        error: _Err | None = None

        def item():
            self.path.append(f"{base}[{len(items)}]")
            if self.ws() != 0x7B:
                raise self.invalid_type("internally tagged enum ChatMessage")
            message = self._message()
            if not isinstance(message.get("content"), (str, list, type(None))):
                raise _Err("data did not match any variant of untagged enum MessageContent", False, None)
            items.append(message)
            self.path.pop()

        try:
            self._container(b"]", "list", item)
        except _Err as exc:
            if exc.pos is not None:
                raise
            error = exc
        if error is not None:
            # serde_json ends the sequence (``end_seq``) before it stamps a position.
            c = self.ws()
            if c == 0x5D:
                self.i += 1
            error.pos = self.i
            raise error
        self.path.append(base)
        return items

    def _keys(self):
        """Inside an object whose ``{`` is consumed: yield each key, read (the caller reads the
        colon and the value); stop before the ``}``, which the caller consumes. serde's checks
        and texts for a struct's and a map's keys alike."""
        first = True
        while True:
            c = self.ws()
            if c == 0x7D:
                return
            if c is None:
                raise self.peek_err("EOF while parsing an object")
            if not first:
                if c != 0x2C:
                    raise self.peek_err("expected `,` or `}`")
                self.i += 1
                c = self.ws()
                if c == 0x7D:
                    raise self.peek_err("trailing comma")
                if c is None:
                    raise self.peek_err("EOF while parsing a value")
            first = False
            if c != 0x22:
                raise self.peek_err("key must be a string")
            yield self.string()

    def _message(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        error: _Err | None = None
        self.depth += 1
        if self.depth >= MAX_DEPTH:
            raise self.peek_err("recursion limit exceeded")
        self.i += 1
        saved = self.track_any
        self.track_any = True  # the buffered content is a serde Content: paths are tracked
        try:
            for key in self._keys():
                self.colon()
                self.path.append(key)
                if key == "role" and "role" not in out:
                    out["role"] = self._enum(list(CHAT_ROLES), self.ws())
                else:
                    out[key] = self.any_value()
                self.path.pop()
            if "role" not in out:
                raise _Err("missing field `role`", False, None)
        except _Err as exc:
            error = exc
        finally:
            self.track_any = saved
        self._end_map(error)
        return out

    def _enum(self, variants: list[str], c: int) -> str:
        if c == 0x7B:  # {"variant": ...}: the key names the variant
            self.i += 1
            if self.ws() != 0x22:
                raise self.peek_err("key must be a string")
            name = self.string()
        elif c == 0x22:
            name = self.string()
        else:
            raise self.peek_err("expected value")
        if name not in variants:
            listed = ", ".join(f"`{v}`" for v in variants)
            raise self.err(f"unknown variant `{name}`, expected one of {listed}", syntax=False)
        if c == 0x7B:
            raise self.err(f"invalid type: map, expected unit variant {name}", syntax=False)
        return name

    def struct(
        self, name: str, fields: dict[str, str], required: tuple[str, ...], aliases: dict[str, str]
    ) -> dict[str, Any]:
        c = self.ws()
        if c is None:
            raise self.peek_err("EOF while parsing a value")
        if c == 0x5B and self.flatten:
            # A struct with a ``#[serde(flatten)]`` field is read as a map only (serde_json's
            # ``peek_invalid_type``: the ``[`` is not consumed).
            raise _Err(f"invalid type: sequence, expected struct {name}", False, self.i)
        if c == 0x5B:
            # serde derives visit_seq too: an array is read positionally; the empty one is short.
            self.i += 1
            if self.ws() == 0x5D:
                self.i += 1
                raise _Err(f"invalid length 0, expected struct {name} with {{n}} elements", False, None)
            raise self.err(f"invalid type: sequence, expected struct {name}", syntax=False)
        if c != 0x7B:
            raise self.invalid_type(f"struct {name}")
        out: dict[str, Any] = {}
        error: _Err | None = None
        self.depth += 1
        self.i += 1
        try:
            for key in self._keys():
                canonical = aliases.get(key, key)
                if canonical in fields and canonical in out:
                    raise _Err(f"duplicate field `{canonical}`", False, None)
                self.colon()
                self.path.append(key)
                value = self.typed(fields[canonical]) if canonical in fields else self.any_value()
                self.path.pop()
                if canonical in fields:
                    out[canonical] = value
            missing = [f for f in required if f not in out]
            if missing:
                raise _Err(f"missing field `{missing[0]}`", False, None)
        except _Err as exc:
            error = exc
        self._end_map(error)
        return out

    def _end_map(self, error: _Err | None) -> None:
        """Leave an object read by ``_keys``: serde_json ends the map even after an error
        (consuming the `}` when it is next), and only then stamps a position on errors that have
        none (missing / duplicate field)."""
        if self.ws() == 0x7D:
            self.i += 1
        self.depth -= 1
        if error is not None:
            if error.pos is None:
                error.pos = self.i
            raise error


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


# -- the fast path: json + schema checks ---------------------------------------------------------


class _Decline(Exception):
    """The fast path cannot give serde's answer for this body; the serde reader will."""


def _int(text: str) -> int | float:
    # serde's number rules, as _Parser.number applies them: -0 is a float, integers outside
    # i64/u64 are read as f64 (and a non-finite one is an error).
    if len(text) <= 21:
        value = int(text)
        if value == 0 and text[0] == "-":
            return -0.0
        if -(2**63) <= value < 2**64:
            return value
    return _float(text)


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Decline  # serde: "number out of range"
    return value


def _constant(text: str) -> Any:
    raise _Decline  # NaN / Infinity: json's extension, not JSON


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        # A repeated key: serde errors on a repeated struct field but keeps the last value of an
        # ignored or map one. Rare; the serde reader knows which is which.
        raise _Decline
    return out


# Two decoders. The exact one applies serde's number rules and refuses repeated keys, but its
# Python hooks run per integer and per object (4x slower on a 4,000-token-id prompt); the plain
# one is json's C parser with a hook per float only (floats are few), used when nothing in the
# body would read differently: no integer spelled -0 or with 19+ digits (serde: a float), no
# \\u escape (which could spell a repeated key), no nested struct in the schema, and no known
# top-level field named twice (counted in the text). The scans also hit inside strings: then
# the exact decoder runs, which is never wrong, only slower.
_EXACT = json.JSONDecoder(
    parse_int=_int, parse_float=_float, parse_constant=_constant, object_pairs_hook=_object
)
_PLAIN = json.JSONDecoder(parse_float=_float, parse_constant=_constant)
_NEGATIVE_ZERO = re.compile(rb"-0(?![.0-9eE])")
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_INTEGER = b"0" * 19


def _used_as_key_twice(key: str, text: str) -> bool:
    # Only a key is followed by ':' (a string value never is), at this level or a nested one: a
    # nested namesake is a false alarm, which only sends the body to the serde reader.
    return len(re.findall(f'"{re.escape(key)}"[ \\t\\n\\r]*:', text)) > 1


def _plain_numbers(data: bytes) -> bool:
    # ``b"-" in`` is a memchr: most bodies (token ids) hold no minus sign at all.
    if b"-" in data and b"-0" in data and _NEGATIVE_ZERO.search(data):
        return False
    return _LONG_INTEGER not in data.translate(_DIGITS_AS_ZERO)


def _depth(value: Any) -> int:
    """Containers on the deepest path (serde's recursion limit counts them)."""
    if type(value) is dict:
        return 1 + max(map(_depth, value.values()), default=0)
    if type(value) is list:
        return 1 + max(map(_depth, value), default=0)
    return 0


def fast_parse(
    data: bytes,
    fields: dict[str, str],
    required: tuple[str, ...] = (),
    aliases: dict[str, str] | None = None,
    *,
    flatten: bool = False,
    untagged_ok=None,
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the whole parsed document, ``parse_struct``'s value) by ``json`` plus schema checks, or
    None where only the serde reader can answer (every body serde refuses, and a few rare ones
    it accepts). The document keeps unknown fields: the data plane reads a few of them."""
    aliases = aliases or {}
    try:
        # Strict UTF-8 first: json.loads(bytes) would also take UTF-16/32 and a BOM; serde not.
        text = data.decode("utf-8")
        escapes = "\\u" in text
        exact = escapes or not _plain_numbers(data)
        doc = (_EXACT if exact else _PLAIN).decode(text)
        if not exact and type(doc) is dict:
            for key in doc:
                kind = fields.get(aliases.get(key, key) if aliases else key)
                if kind is None:
                    continue
                if "struct:" in kind:  # a nested struct: its fields may repeat too
                    doc = _EXACT.decode(text)
                    break
                if text.count(f'"{key}"') > 1 and _used_as_key_twice(key, text):
                    return None  # perhaps the field twice (serde refuses it; json keeps the last)
        if text.count("[") + text.count("{") >= MAX_DEPTH and _depth(doc) >= MAX_DEPTH:
            return None
        if escapes and ("\\ud" in text or "\\uD" in text):
            # json keeps a lone surrogate escape as a lone code point, serde refuses it in every
            # string it checks; a pair (an emoji escaped by an ensure_ascii encoder) json joins.
            # So a code point UTF-8 cannot encode is a lone one (UnicodeEncodeError: ValueError).
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        return doc, _Fast(untagged_ok).struct(doc, fields, required, aliases)
    except (ValueError, RecursionError, _Decline):  # JSONDecodeError, UnicodeDecodeError: ValueError
        return None


def field_ok(kind: str, value: Any, untagged_ok=None) -> bool:
    """Whether an already parsed value fits a field's kind (the fast path's check of one field)."""
    try:
        _Fast(untagged_ok).typed(value, kind)
    except _Decline:
        return False
    return True


def _number(value: Any) -> bool:
    return type(value) is int or type(value) is float


class _Fast:
    """The schema checks of ``_Parser.typed`` on a parsed value: its value, or ``_Decline``."""

    def __init__(self, untagged_ok) -> None:
        self.untagged_ok = untagged_ok

    def struct(
        self, value: Any, fields: dict[str, str], required: tuple[str, ...], aliases: dict[str, str]
    ) -> dict:
        if type(value) is not dict:
            raise _Decline
        out: dict[str, Any] = {}
        for key, item in value.items():
            canonical = aliases.get(key, key) if aliases else key
            kind = fields.get(canonical)
            if kind is None:
                continue  # an unknown field: any JSON value (serde's IgnoredAny, or a Value)
            if canonical in out:
                raise _Decline  # a field given under its name and an alias
            out[canonical] = self.typed(item, kind)
        for field in required:
            if field not in out:
                raise _Decline
        return out

    def typed(self, value: Any, kind: str) -> Any:
        check = _PLAIN_KINDS.get(kind)
        if check is not None:  # the common kinds, by one lookup
            if check(value):
                return False if value is None and kind == "bool_nf" else value
            raise _Decline
        if kind.startswith("opt_"):
            if value is None:
                return None
            kind = kind[4:]
        if kind == "str":
            if type(value) is str:
                return value
        elif kind in _INT_LIMITS:
            if type(value) is int and 0 <= value <= _INT_LIMITS[kind]:
                return value
        elif kind in _SIGNED_LIMITS:
            if type(value) is int and -_SIGNED_LIMITS[kind] <= value < _SIGNED_LIMITS[kind]:
                return value
        elif kind in ("bool", "bool_nf"):
            if type(value) is bool:
                return value
            if kind == "bool_nf" and value is None:
                return False
        elif kind == "f32":
            if _number(value):
                return value
        elif kind == "map":
            if type(value) is dict:
                return value
        elif kind in ("map_str", "map_f32"):
            check = (lambda v: type(v) is str) if kind == "map_str" else _number
            if type(value) is dict and all(map(check, value.values())):
                return value
        elif kind.startswith("untagged:"):
            if self.untagged_ok is None or self.untagged_ok(kind[9:], value):
                return value
        elif kind == "messages":
            if type(value) is list and all(map(_message_ok, value)):
                return value
        elif kind.startswith("seq"):
            if type(value) is list:
                element = kind.partition(":")[2]
                return [self.typed(item, element) for item in value] if element else value
        elif kind.startswith("struct:"):
            struct = STRUCTS.get(kind[7:])
            if struct is not None:
                return self.struct(value, struct[0], struct[1], {})
            if type(value) is dict:
                return value
        elif kind.startswith("enum:"):
            if type(value) is str and value in kind[5:].split(","):
                return value
        else:
            return value
        raise _Decline


def _is_int(low: int, high: int):
    return lambda value: type(value) is int and low <= value <= high


def _optional(check):
    return lambda value: value is None or check(value)


_PLAIN_KINDS = {
    "str": lambda value: type(value) is str,
    "bool": lambda value: type(value) is bool,
    "f32": _number,
    "map": lambda value: type(value) is dict,
    **{kind: _is_int(0, limit) for kind, limit in _INT_LIMITS.items()},
    **{kind: _is_int(-bound, bound - 1) for kind, bound in _SIGNED_LIMITS.items()},
}
_PLAIN_KINDS.update({"opt_" + kind: _optional(check) for kind, check in _PLAIN_KINDS.items()})
_PLAIN_KINDS["bool_nf"] = _PLAIN_KINDS["opt_bool"]


def _message_ok(message: Any) -> bool:
    # ChatMessage as _Parser._messages reads it: a map tagged by a known role, whose content
    # (when given) is a string, a list or null.
    return (
        type(message) is dict
        and type(message.get("role")) is str
        and message["role"] in CHAT_ROLES
        and type(message.get("content")) in (str, list, type(None))
    )

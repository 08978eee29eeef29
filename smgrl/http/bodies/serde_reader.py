"""The byte-by-byte serde reader of serde_body (pure): serde_json's rules, messages and positions.

``_Parser`` reads a document in order and raises ``_Err`` (a message, its category and the byte it
points at); ``serde_body.serde_struct`` renders it as SMG's text. See serde_body's docstring.
"""

from __future__ import annotations

import decimal
import json
from typing import Any

from smgrl.http.bodies.serde_kinds import CHAT_ROLES, INT_LIMITS, MAX_DEPTH, SIGNED_LIMITS, STRUCTS, WS

__all__: list[str] = []


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
        if kind in INT_LIMITS or kind in SIGNED_LIMITS:
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
        if kind in SIGNED_LIMITS:
            bound = SIGNED_LIMITS[kind]
            if not -bound <= value < bound:
                raise self.err(f"invalid value: integer `{value}`, expected {kind}", syntax=False)
        elif not 0 <= value <= INT_LIMITS[kind]:
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

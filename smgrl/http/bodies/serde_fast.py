"""The fast path of serde_body (pure): ``json`` plus the schema's checks, for bodies that are fine.

It answers with serde's value or declines (None) where only the serde reader
(``serde_reader._Parser``) can give serde's answer. See serde_body's docstring.
"""

from __future__ import annotations

import json
import re
from typing import Any

from smgrl.http.bodies.serde_kinds import CHAT_ROLES, INT_LIMITS, MAX_DEPTH, SIGNED_LIMITS, STRUCTS

__all__ = ["fast_parse", "field_ok"]


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
        elif kind in INT_LIMITS:
            if type(value) is int and 0 <= value <= INT_LIMITS[kind]:
                return value
        elif kind in SIGNED_LIMITS:
            if type(value) is int and -SIGNED_LIMITS[kind] <= value < SIGNED_LIMITS[kind]:
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
    **{kind: _is_int(0, limit) for kind, limit in INT_LIMITS.items()},
    **{kind: _is_int(-bound, bound - 1) for kind, bound in SIGNED_LIMITS.items()},
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

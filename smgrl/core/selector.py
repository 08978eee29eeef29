"""Label selectors: ``k=v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``; a comma means AND.

Wire-compatible with SMG 1.13.0's ``crates/rl/src/selector.rs`` (docs/rl-control-plane.md, "Selectors"): the same grammar,
the same error reasons and the same **byte** offsets, because clients compare the
``invalid selector at byte N: <reason>`` message verbatim.

Two Rust behaviours are reproduced on purpose rather than approximated with Python builtins:

- whitespace is Rust's ``char::is_whitespace`` (the Unicode ``White_Space`` property), which is
  not ``str.isspace``: Python also counts U+001C..U+001F as whitespace, Rust does not;
- offsets count UTF-8 bytes of the trimmed text, not code points.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

# Unicode White_Space, i.e. Rust's `char::is_whitespace` (and what `str::trim` strips).
RUST_WHITESPACE = frozenset(
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    "\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)
_RUST_WHITESPACE_STR = "".join(sorted(RUST_WHITESPACE))

_KEY_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_./-")
_NOT_BARE = frozenset(',()"') | RUST_WHITESPACE

OPS = ("=", "!=", "in", "notin")

EXPECTED_KEY = "expected key"
EXPECTED_KEY_AFTER_COMMA = "expected key after `,`"
EXPECTED_OPERATOR = "expected operator (`=`, `!=`, `in`, `notin`)"
EXPECTED_VALUE_AFTER_EQ = "expected value after `=`"
EXPECTED_VALUE = "expected value"
EXPECTED_COMMA_OR_END = "expected `,` or end of selector"
EXPECTED_OPEN_PAREN = "expected `(`"
EXPECTED_COMMA_OR_CLOSE = "expected `,` or `)`"
UNTERMINATED_QUOTE = "unterminated quoted value"
INVALID_ESCAPE = "invalid escape in quoted value"


def rust_trim(text: str) -> str:
    """``str::trim`` from Rust: strip Unicode ``White_Space`` from both ends."""
    return text.strip(_RUST_WHITESPACE_STR)


def utf8_len(text: str) -> int:
    """Length of ``text`` in UTF-8 bytes (lone surrogates count 3, as WTF-8 would)."""
    return len(text.encode("utf-8", "surrogatepass"))


class SelectorError(ValueError):
    """A selector that does not parse; ``offset`` is a UTF-8 byte offset into the trimmed text."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        self.reason = reason
        super().__init__(f"invalid selector at byte {offset}: {reason}")

    def __reduce__(
        self,
    ) -> tuple[Any, tuple[Any, ...]]:  # keep pickling (e.g. across processes) working with two args
        return (type(self), (self.offset, self.reason))


def str_tuple(values: Iterable[str]) -> tuple[str, ...]:
    """A tuple of strings (an attrs converter with a type mypy can read, unlike ``tuple``)."""
    return tuple(values)


@attrs.frozen
class Term:
    """One ANDed clause. ``values`` has exactly one item for ``=``/``!=``."""

    key: str
    op: str = attrs.field(validator=attrs.validators.in_(OPS))
    values: tuple[str, ...] = attrs.field(converter=str_tuple)

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.key)
        hit = actual is not None and actual in self.values
        # `!=` and `notin` are negations of presence-and-equality: a missing key matches them.
        return not hit if self.op in ("!=", "notin") else hit


@attrs.frozen
class Selector:
    """A parsed selector; ``source`` is the trimmed text (quoted in ``no_workers_match``)."""

    source: str
    terms: tuple[Term, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(term.matches(labels) for term in self.terms)


class _Scanner:
    """A cursor over the text; ``pos`` is a code-point index, converted to bytes on error."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.pos = 0

    def fail(self, reason: str) -> SelectorError:
        return SelectorError(utf8_len(self.src[: self.pos]), reason)

    def at_end(self) -> bool:
        return self.pos >= len(self.src)

    def peek(self) -> str | None:
        return self.src[self.pos] if self.pos < len(self.src) else None

    def skip_ws(self) -> None:
        while self.pos < len(self.src) and self.src[self.pos] in RUST_WHITESPACE:
            self.pos += 1

    def eat(self, literal: str) -> bool:
        if self.src.startswith(literal, self.pos):
            self.pos += len(literal)
            return True
        return False

    def key(self) -> str:
        start = self.pos
        while self.pos < len(self.src) and self.src[self.pos] in _KEY_CHARS:
            self.pos += 1
        if self.pos == start:
            raise self.fail(EXPECTED_KEY)
        return self.src[start : self.pos]

    def word_op(self, word: str) -> bool:
        # `in`/`notin` count only when followed by whitespace or `(`: `engine inx (a)` fails at `i`.
        if not self.src.startswith(word, self.pos):
            return False
        end = self.pos + len(word)
        after = self.src[end] if end < len(self.src) else None
        if after is not None and (after == "(" or after in RUST_WHITESPACE):
            self.pos = end
            return True
        return False

    def op(self) -> str:
        if self.eat("!="):
            return "!="
        if self.eat("="):
            # The scanner is already past the first `=`: `engine==x` reports byte 7.
            if self.peek() == "=":
                raise self.fail(EXPECTED_VALUE_AFTER_EQ)
            return "="
        if self.word_op("notin"):
            return "notin"
        if self.word_op("in"):
            return "in"
        raise self.fail(EXPECTED_OPERATOR)

    def value(self) -> str:
        if self.peek() == '"':
            return self.quoted()
        start = self.pos
        while self.pos < len(self.src) and self.src[self.pos] not in _NOT_BARE:
            self.pos += 1
        if self.pos == start:
            raise self.fail(EXPECTED_VALUE)
        return self.src[start : self.pos]

    def quoted(self) -> str:
        self.pos += 1  # the opening quote
        out: list[str] = []
        while True:
            c = self.peek()
            if c is None:
                raise self.fail(UNTERMINATED_QUOTE)
            self.pos += 1
            if c == '"':
                return "".join(out)
            if c == "\\":
                # The escaped character is consumed before judging it, so the offset points
                # just past it (`k="a\n"` fails after the `n`; a trailing `\` fails at the end).
                escaped = self.peek()
                if escaped is not None:
                    self.pos += 1
                if escaped not in ('"', "\\"):
                    raise self.fail(INVALID_ESCAPE)
                out.append(escaped)
            else:
                out.append(c)

    def value_list(self) -> tuple[str, ...]:
        self.skip_ws()
        if not self.eat("("):
            raise self.fail(EXPECTED_OPEN_PAREN)
        values: list[str] = []
        while True:
            self.skip_ws()
            values.append(self.value())
            self.skip_ws()
            if self.eat(")"):
                return tuple(values)
            if not self.eat(","):
                raise self.fail(EXPECTED_COMMA_OR_CLOSE)

    def term(self) -> Term:
        self.skip_ws()
        key = self.key()
        self.skip_ws()
        op = self.op()
        if op in ("=", "!="):
            self.skip_ws()
            values: tuple[str, ...] = (self.value(),)
        else:
            values = self.value_list()
        return Term(key=key, op=op, values=values)


def parse_selector(text: str) -> Selector:
    """Parse a selector after Rust-trimming it; raise :class:`SelectorError` on any error.

    Empty or blank input is the caller's ``selector_required``; if it reaches here anyway it
    fails like the crate does, with ``expected key`` at byte 0.
    """
    src = rust_trim(text)
    sc = _Scanner(src)
    terms: list[Term] = []
    while True:
        terms.append(sc.term())
        sc.skip_ws()
        if sc.at_end():
            break
        if not sc.eat(","):
            raise sc.fail(EXPECTED_COMMA_OR_END)
        sc.skip_ws()
        if sc.at_end():
            raise sc.fail(EXPECTED_KEY_AFTER_COMMA)
    return Selector(source=src, terms=tuple(terms))


def quote_value(value: str) -> str:
    """``value`` as a quoted selector value that parses back to exactly ``value``."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

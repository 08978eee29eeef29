"""Integers from text a client wrote (query parameters, headers, environment, CLI arguments).

Python's ``int()`` accepts far more than a decimal integer: ``"1_0"`` (10), ``" 7 "``, ``"+5"``,
``"٣"`` (Arabic-Indic 3), and ``str.isdigit()`` is true for ``"²"``, which ``int()`` then refuses
with a ValueError (a 500 where a 400 was due). Every integer an API or CLI reads goes through
:func:`parse_uint` / :func:`parse_int`: plain ASCII digits, a leading ``-`` only where negative
is meaningful, nothing else; anything other than that is None for the caller to refuse with its
stable error code.
"""

from __future__ import annotations

__all__ = ["MAX_DIGITS", "parse_int", "parse_uint"]

# int() refuses 4,300+ digits (ValueError) and costs quadratic time below that; nothing smgrl
# reads needs more than 64 bits, so a longer run of digits is refused before int() sees it.
MAX_DIGITS = 20


def parse_uint(text: str | bytes | None) -> int | None:
    """A non-negative integer written as plain ASCII digits (leading zeros allowed), else None."""
    if type(text) is bytes and 0 < len(text) <= MAX_DIGITS and text.isdigit():
        # The common case (a content-length), in two C calls: bytes.isdigit() is ASCII only,
        # and int() reads bytes.
        return int(text)
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    if not text or not text.isascii() or not text.isdigit():
        return None
    digits = text.lstrip("0") or "0"
    if len(digits) > MAX_DIGITS:
        return None
    return int(digits)


def parse_int(text: str | bytes | None) -> int | None:
    """:func:`parse_uint`, or ``-`` followed by one."""
    if text is None:
        return None
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    if text.startswith("-"):
        value = parse_uint(text[1:])
        return None if value is None else -value
    return parse_uint(text)

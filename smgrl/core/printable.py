"""Text from outside made safe to print (pure): log lines and terminal output.

A client's request id or path, an engine's answer, a label: any of them may hold characters that
a terminal or a log reader acts on. ``UNSAFE`` is that set: C0 controls (newline, CR, tab, ESC
that starts CSI/OSC sequences, BEL), DEL, C1 controls (U+0080-U+009F: NEL, and the 8-bit CSI and
OSC), the Unicode line and paragraph separators, bidi embeddings/overrides/isolates (they reorder
what is shown), the BOM, and lone surrogates (which cannot even be encoded).
"""

from __future__ import annotations

import re

__all__ = ["UNSAFE", "escape", "escape_for_json", "escape_lines"]

UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")
_UNSAFE_BUT_NEWLINE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff\ud800-\udfff]"
)
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _code(match: re.Match[str]) -> str:
    ch = match.group()
    short = _SHORT.get(ch)
    if short is not None:
        return short
    point = ord(ch)
    return f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}"


def _json_code(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escape(text: str) -> str:
    """Every unsafe character as an escape: ``\\n``, ``\\r``, ``\\t``, ``\\x1b``, ``\\x85``,
    ``\\u2028``. One value stays on one line."""
    # str.isprintable() is False for every unsafe character: the common case costs one C scan.
    return text if text.isprintable() else UNSAFE.sub(_code, text)


def escape_lines(text: str) -> str:
    """Like ``escape`` but newlines stay: for output made of several lines (a table, a report)
    whose values were already escaped by ``escape``."""
    return text if text.isprintable() else _UNSAFE_BUT_NEWLINE.sub(_code, text)


def escape_for_json(text: str) -> str:
    """JSON text (``json.dumps`` output) with the unsafe characters json leaves raw (DEL, C1,
    separators, bidi, surrogates) as ``\\uXXXX``: json already escapes C0 controls, and the rest
    can only occur inside strings, where ``\\uXXXX`` means the same character. Newlines between
    the lines of an indented document stay."""
    return text if text.isprintable() else _UNSAFE_BUT_NEWLINE.sub(_json_code, text)

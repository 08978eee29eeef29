"""Parsing what users type (times, points in the journal, ranges) and formatting values (pure).

Times on the command line:

* ISO-8601: ``2026-11-29T11:55:33``, ``2026-11-29 11:55``, ``2026-11-29``, with ``Z`` or an
  offset; a time without an offset is UTC (every time smgrl prints is UTC);
* unix seconds: ``1764417333`` or ``1764417333.25`` (``@1764417333`` too);
* relative to now: ``30s``, ``15m``, ``2h``, ``1d`` (that long ago), ``now``.

A *point* (``workers --at``) is a sequence number when it is a bare integer, else a time (so a
unix time there needs its ``@``).
"""

from __future__ import annotations

import datetime as dt
import math
import re

import attrs

from journal.base import clamp_seq
from smgrl.core.numbers import parse_uint

__all__ = ["BadValue", "Point", "SeqRange", "fmt_ms", "fmt_ts", "parse_point", "parse_time", "seq_range"]

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_NUMBER = re.compile(r"^@?\d+(?:\.\d+)?$")


class BadValue(ValueError):
    """A value on the command line that cannot mean anything (the message says what was expected)."""


def parse_time(text: str, now: float) -> float:
    """Unix seconds for a time as typed (see the module docstring)."""
    raw = text.strip()
    if not raw:
        raise BadValue("empty time")
    if raw == "now":
        return now
    rel = _RELATIVE.match(raw)
    if rel:
        return now - float(rel.group(1)) * _UNITS[rel.group(2)]
    if _NUMBER.match(raw):
        return float(raw.lstrip("@"))
    iso = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    try:
        when = dt.datetime.fromisoformat(iso)
    except ValueError:
        raise BadValue(
            f"{text!r} is not a time (ISO-8601 like 2026-11-29T11:55:33Z, unix seconds, or 15m/2h/1d ago)"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


@attrs.frozen
class Point:
    """A position in the journal: a sequence number or a time (exactly one is set)."""

    seq: int | None = None
    ts: float | None = None


def parse_point(text: str, now: float) -> Point:
    raw = text.strip()
    seq = parse_uint(raw)
    if seq is not None:
        return Point(seq=clamp_seq(seq))
    return Point(ts=parse_time(raw, now))


@attrs.frozen
class SeqRange:
    """Events with ``after < seq`` and ``seq < before`` (``before`` None: no upper bound)."""

    after: int = 0
    before: int | None = None

    @property
    def until_seq(self) -> int | None:
        return None if self.before is None else self.before - 1

    def contains(self, seq: int) -> bool:
        return seq > self.after and (self.before is None or seq < self.before)


def seq_range(after: int | None, before: int | None) -> SeqRange:
    if after is not None and after < 0:
        raise BadValue(f"--after must be >= 0, got {after}")
    if before is not None and before < 1:
        raise BadValue(f"--before must be >= 1, got {before}")
    lo = clamp_seq(after or 0)
    if before is not None and before <= lo + 1:
        raise BadValue(f"empty range: no sequence number is > {lo} and < {before}")
    return SeqRange(lo, None if before is None else clamp_seq(before))


def time_window(since: float | None, until: float | None) -> None:
    if since is not None and until is not None and until <= since:
        raise BadValue("empty time range: --until must be later than --since")


def fmt_ts(ts: float | None) -> str:
    """UTC, millisecond precision: ``2026-11-29T11:55:33.123Z``."""
    if ts is None:
        return "-"
    # The whole second and microseconds as datetime.fromtimestamp rounds them (half to even,
    # carried into the second), without building a datetime per call (90,000 at ``ops --all``):
    # the text up to the second is made once per second (tests/journal_cli/test_values.py
    # compares with datetime).
    frac, whole = math.modf(ts)
    us = round(frac * 1e6)
    if us >= 1_000_000:
        us -= 1_000_000
        whole += 1.0
    elif us < 0:
        us += 1_000_000
        whole -= 1.0
    second = int(whole)
    if _last_second[0] != second:
        _last_second[:] = [second, dt.datetime.fromtimestamp(second, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.")]
    return _last_second[1] + f"{us // 1000:03d}Z"


_last_second: list = [None, ""]  # whole second -> its text


def fmt_ms(seconds: float | None) -> str:
    """A duration for people: ``850 ms``, ``1.25 s``, ``3m 05s``."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m"

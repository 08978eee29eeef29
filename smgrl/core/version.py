"""Weight versions: validation, ordering and passthrough observation (docs/data-plane.md, "Version policies").

Mirrors SMG's M2 ``crates/rl/src/version.rs``:

- one validator for every externally supplied version (API writes and versions observed in
  proxied refit bodies): trim, then refuse empty, over 128 bytes, or any byte outside
  printable ASCII ``0x21..0x7E`` (so a version always fits in ``x-smg-weight-version``);
- ordering: two numeric versions (``u64``) compare by value (``042 == 42``), two text versions
  lexically, a numeric/text pair lexically. That mixed rule makes the order non-transitive
  (``9 < 10``, ``10 < 1a``, ``1a < 9``), which is why :func:`fleet_max` never mixes kinds: it
  prefers the numeric versions whenever there are any. SMG logs one WARN per process the first
  time a mixed pair is compared; this module keeps no state, so callers use :func:`is_mixed`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, ClassVar

import attrs

from smgrl.core.selector import rust_trim

MAX_VERSION_BYTES = 128
UNVERSIONED_LABEL = "default"  # SGLang's placeholder before any refit: seeds as "no version"
_U64_MAX = 2**64 - 1
_I64_MIN = -(2**63)


class MalformedVersion(ValueError):
    """A version string SMG refuses (``invalid_version``, 400); ``reason`` is a stable log tag."""

    MESSAGES: ClassVar[dict[str, str]] = {
        "empty": "weight_version is empty",
        "too_long": f"weight_version exceeds {MAX_VERSION_BYTES} bytes",
        "not_printable_ascii": "weight_version contains a byte outside printable ASCII",
    }

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(self.MESSAGES[reason])

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.reason,))


def validate_version(v: str) -> str:
    """The trimmed version, or :class:`MalformedVersion` (checked in order: empty, length, bytes)."""
    trimmed = rust_trim(v)
    if not trimmed:
        raise MalformedVersion("empty")
    raw = trimmed.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_VERSION_BYTES:
        raise MalformedVersion("too_long")
    if not all(0x21 <= b <= 0x7E for b in raw):
        raise MalformedVersion("not_printable_ascii")
    return trimmed


def parse_u64(text: str) -> int | None:
    """Rust's ``str::parse::<u64>``: optional ``+``, then ASCII digits only, at most ``2**64-1``."""
    digits = text.removeprefix("+")
    if not digits or not (digits.isascii() and digits.isdigit()):
        return None
    value = int(digits)
    return value if value <= _U64_MAX else None


@attrs.frozen(eq=False, order=False)
class Version:
    """A trimmed version and its ``u64`` value when it has one; compares with A.2's rules."""

    raw: str
    numeric: int | None

    @classmethod
    def parse(cls, v: str) -> Version:
        raw = rust_trim(v)
        return cls(raw, parse_u64(raw))

    def _cmp(self, other: Version) -> int:
        if self.numeric is not None and other.numeric is not None:
            a, b = self.numeric, other.numeric
        else:
            # Rust compares `str` bytewise; UTF-8 byte order equals code-point order.
            a, b = self.raw, other.raw  # type: ignore[assignment]
        return (a > b) - (a < b)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Version) and self._cmp(other) == 0

    def __hash__(self) -> int:
        return hash(self.numeric) if self.numeric is not None else hash(self.raw)

    def __lt__(self, other: Version) -> bool:
        return self._cmp(other) < 0

    def __le__(self, other: Version) -> bool:
        return self._cmp(other) <= 0

    def __gt__(self, other: Version) -> bool:
        return self._cmp(other) > 0

    def __ge__(self, other: Version) -> bool:
        return self._cmp(other) >= 0

    def __str__(self) -> str:
        return self.raw


def version_key(v: str) -> Version:
    """A comparable :class:`Version` for ``v`` (usable as ``key=``; see the module note on mixing)."""
    return Version.parse(v)


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as ``a`` is older than, equal to or newer than ``b``."""
    return Version.parse(a)._cmp(Version.parse(b))


def is_mixed(a: str, b: str) -> bool:
    """True when exactly one of ``a``/``b`` is numeric (compared lexically; SMG warns once)."""
    return (Version.parse(a).numeric is None) != (Version.parse(b).numeric is None)


def fleet_max(versions: Iterable[str | None]) -> str | None:
    """The newest version of a model's fleet: numeric versions win over text ones when any exist."""
    parsed = [Version.parse(v) for v in versions if v is not None and rust_trim(v)]
    numeric = [v for v in parsed if v.numeric is not None]
    pool = numeric or parsed
    return max(pool).raw if pool else None


def label_version(label: str | None) -> str | None:
    """The version a registration label seeds: ``None`` for absent, empty or ``default``."""
    if label is None:
        return None
    trimmed = rust_trim(label)
    if not trimmed or trimmed == UNVERSIONED_LABEL:
        return None
    return trimmed


def json_number_text(value: object) -> str | None:
    """How serde_json prints a JSON number (``42``, ``-5``, ``1.5``, ``100.0``, ``1e20``); else None.

    Integers outside ``i64``/``u64`` are floats to serde_json; ``bool`` is not a number; a
    non-finite value cannot come out of a JSON parser that SMG would accept.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):
        if _I64_MIN <= value <= _U64_MAX:
            return str(value)
        try:
            value = float(value)
        except OverflowError:
            return None
    if not math.isfinite(value):
        return None
    return _ryu(value)


def _ryu(x: float) -> str:
    # repr() and ryu both print the shortest round-tripping digits; only the layout differs.
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    if x == 0:
        return f"{sign}0.0"
    _, digit_tuple, exp = Decimal(repr(abs(x))).normalize().as_tuple()
    digits = "".join(map(str, digit_tuple))
    k = int(exp)
    kk = len(digits) + k  # 10**(kk-1) <= |x| < 10**kk
    if 0 <= k and kk <= 16:
        body = digits + "0" * k + ".0"
    elif 0 < kk <= 16:
        body = f"{digits[:kk]}.{digits[kk:]}"
    elif -5 < kk <= 0:
        body = "0." + "0" * -kk + digits
    elif len(digits) == 1:
        body = f"{digits}e{kk - 1}"
    else:
        body = f"{digits[0]}.{digits[1:]}e{kk - 1}"
    return sign + body


def observed_version(value: object) -> str | None:
    """The version a proxied refit body carries, validated; ``None`` when it is unusable.

    Accepts a JSON string or number (numbers are stringified as SMG does); anything else, or
    a value that fails :func:`validate_version`, gives ``None``. Use :func:`observation_problem`
    for the WARN's ``reason`` tag.
    """
    text = value if isinstance(value, str) else json_number_text(value)
    if text is None:
        return None
    try:
        return validate_version(text)
    except MalformedVersion:
        return None


def observation_problem(value: object) -> str | None:
    """Why :func:`observed_version` refused ``value`` (``not_a_string_or_number``, ``empty``, ...)."""
    text = value if isinstance(value, str) else json_number_text(value)
    if text is None:
        return "not_a_string_or_number"
    try:
        validate_version(text)
    except MalformedVersion as e:
        return e.reason
    return None

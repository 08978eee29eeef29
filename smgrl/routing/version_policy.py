"""Version policies (docs/data-plane.md, "Version policies") and PSRL's ``x-version-tag`` floor. Pure.

``--rl-version-policy`` sets the default, the ``x-smg-version-policy`` header overrides it per
request (both need ``--enable-rl``; without it the header is ignored and nothing is filtered)::

    any                 every version is eligible (the default)
    latest-only         only engines at the model's fleet max; unversioned ones are dropped
                        when a max exists
    min-version:<v>     only engines at v or newer; unversioned ones are dropped
    max-staleness:<k>   only engines at most k versions behind the fleet max (numeric distance;
                        a non-numeric version other than the max itself counts as stale)

No fleet max (nothing versioned) -> everything is eligible. Ordering is ``smgrl.core.version``'s
(numbers by value, text lexically). The fleet max per model prefers numeric versions.

PSRL's ``x-version-tag: V`` is a per-trajectory floor applied on top: only engines at V or
newer; ``-1`` (PSRL's "unversioned") sets no floor. Held-out reasons: ``stale`` (versioned but
too old) and ``unversioned``.
"""

from __future__ import annotations

import functools
from typing import Literal

import attrs

from smgrl.core import MalformedVersion, Version, parse_u64, rust_trim, validate_version

Kind = Literal["any", "latest-only", "min-version", "max-staleness"]
UNVERSIONED_TAG = "-1"
EXPECTED = "expected `any`, `latest-only`, `min-version:<version>` or `max-staleness:<n>`"


class InvalidVersionPolicy(ValueError):
    pass


@attrs.frozen
class VersionPolicy:
    kind: Kind = "any"
    min_version: Version | None = None
    max_staleness: int | None = None

    @classmethod
    def parse(cls, text: str) -> VersionPolicy:
        raw = rust_trim(text)
        if raw in ("any", "latest-only"):
            return cls(raw)  # type: ignore[arg-type]
        name, sep, arg = raw.partition(":")
        if sep and name == "min-version":
            try:
                return cls("min-version", min_version=Version.parse(validate_version(arg)))
            except MalformedVersion as exc:
                raise InvalidVersionPolicy(f"invalid version policy `{raw}`: {exc}") from None
        if sep and name == "max-staleness":
            k = parse_u64(rust_trim(arg))
            if k is None:
                raise InvalidVersionPolicy(
                    f"invalid version policy `{raw}`: max-staleness needs a non-negative integer"
                )
            return cls("max-staleness", max_staleness=k)
        raise InvalidVersionPolicy(f"invalid version policy `{raw}`: {EXPECTED}")

    def __str__(self) -> str:
        if self.kind == "min-version":
            return f"min-version:{self.min_version}"
        if self.kind == "max-staleness":
            return f"max-staleness:{self.max_staleness}"
        return self.kind

    @property
    def filters(self) -> bool:
        return self.kind != "any"

    def hold_reason(self, version: str | None, fleet_max: str | None) -> str | None:
        """Why an engine at ``version`` is not eligible under this policy, or None."""
        if self.kind == "any":
            return None
        if self.kind == "min-version":
            if version is None:
                return "unversioned"
            return None if Version.parse(version) >= self.min_version else "stale"  # type: ignore[operator]
        if fleet_max is None:
            return None  # nothing versioned: everything is eligible
        if version is None:
            return "unversioned"
        v, top = Version.parse(version), Version.parse(fleet_max)
        if v == top:
            return None
        if self.kind == "latest-only":
            return "stale"
        # max-staleness: numeric distance to the max; any non-numeric version counts stale.
        if v.numeric is None or top.numeric is None:
            return "stale"
        return None if top.numeric - v.numeric <= self.max_staleness else "stale"  # type: ignore[operator]


ANY = VersionPolicy()


def parse_floor(value: str) -> Version | None:
    """PSRL's ``x-version-tag``: a version floor, or None for ``-1`` (no floor)."""
    raw = rust_trim(value)
    if raw == UNVERSIONED_TAG:
        return None
    try:
        return Version.parse(validate_version(raw))
    except MalformedVersion as exc:
        raise InvalidVersionPolicy(f"invalid x-version-tag `{raw}`: {exc}") from None


# A fleet has a handful of versions: parse each once (the staged selection compares every
# candidate's version per request).
parse_version = functools.lru_cache(maxsize=4096)(Version.parse)


def floor_reason(version: str | None, floor: Version | None) -> str | None:
    if floor is None:
        return None
    if version is None:
        return "unversioned"
    return None if parse_version(version) >= floor else "stale"

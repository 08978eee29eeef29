"""Version policies and PSRL's version floor (pure; docs/data-plane.md, "Version policies")."""

from __future__ import annotations

import pytest

from smgrl.core.version import Version
from smgrl.routing.version_policy import InvalidVersionPolicy, VersionPolicy, floor_reason, parse_floor


@pytest.mark.parametrize(
    "text, kind, shown",
    [
        ("any", "any", "any"),
        ("  latest-only ", "latest-only", "latest-only"),
        ("min-version:42", "min-version", "min-version:42"),
        ("min-version: step-3 ", "min-version", "min-version:step-3"),
        ("max-staleness:0", "max-staleness", "max-staleness:0"),
        ("max-staleness:2", "max-staleness", "max-staleness:2"),
    ],
)
def test_grammar_round_trips(text, kind, shown):
    policy = VersionPolicy.parse(text)
    assert policy.kind == kind and str(policy) == shown
    assert VersionPolicy.parse(str(policy)) == policy


@pytest.mark.parametrize(
    "text",
    ["", "newest", "latest", "min-version", "min-version:", "min-version:a b", "max-staleness:-1",
     "max-staleness:x", "max-staleness:", "ANY", "any:1", "min-version:" + "x" * 129],
)  # fmt: skip
def test_rejects_bad_inputs(text):
    with pytest.raises(InvalidVersionPolicy):
        VersionPolicy.parse(text)


LATEST = VersionPolicy.parse("latest-only")
MIN7 = VersionPolicy.parse("min-version:7")
STALE1 = VersionPolicy.parse("max-staleness:1")


@pytest.mark.parametrize(
    "policy, version, top, reason",
    [
        (VersionPolicy(), None, "9", None),
        (VersionPolicy(), "1", "9", None),
        (LATEST, "9", "9", None),
        (LATEST, "09", "9", None),  # numeric equality by value
        (LATEST, "8", "9", "stale"),
        (LATEST, None, "9", "unversioned"),
        (LATEST, None, None, None),  # no fleet max: everything eligible
        (LATEST, "b", "b", None),
        (LATEST, "a", "b", "stale"),
        (MIN7, "7", None, None),
        (MIN7, "10", None, None),  # 10 > 7 numerically
        (MIN7, "6", "9", "stale"),
        (MIN7, None, None, "unversioned"),
        (STALE1, "8", "9", None),
        (STALE1, "7", "9", "stale"),
        (STALE1, "9", "9", None),
        (STALE1, "x", "9", "stale"),  # non-numeric counts stale
        (STALE1, "b", "b", None),  # ...unless it is the max itself
        (STALE1, None, "9", "unversioned"),
        (STALE1, "1", None, None),
    ],
)
def test_hold_reasons(policy, version, top, reason):
    assert policy.hold_reason(version, top) == reason


def test_version_floor():
    assert parse_floor("-1") is None
    assert parse_floor(" 5 ") == Version.parse("5")
    with pytest.raises(InvalidVersionPolicy):
        parse_floor("a b")
    floor = parse_floor("5")
    assert floor_reason("5", floor) is None and floor_reason("12", floor) is None
    assert floor_reason("4", floor) == "stale" and floor_reason(None, floor) == "unversioned"
    assert floor_reason(None, None) is None

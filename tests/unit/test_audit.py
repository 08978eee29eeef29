"""The audit counts (decision D2): route families and a bounded key space (pure parts)."""

from __future__ import annotations

import pytest

from smgrl.telemetry.audit import FAMILIES, MAX_KEYS, AuditCounts, route_family

FAMILY_CASES = [
    ("/v1/rl/workers", "rl.discovery"),
    ("/v1/rl/workers/abc", "rl.discovery"),
    ("/v1/rl/workers/abc/engine/flush_cache", "rl.engine"),
    ("/v1/rl/workers/abc/engine/a/b/c", "rl.engine"),
    ("/v1/rl/engine/flush_cache", "rl.engine"),
    ("/v1/rl/workers/abc/version", "rl.writes"),
    ("/v1/rl/workers/abc/state", "rl.writes"),
    ("/v1/rl/version", "rl.writes"),
    ("/v1/rl/state", "rl.writes"),
    ("/v1/rl/operations/op1", "rl.journal"),
    ("/v1/rl/journal", "rl.journal"),
    ("/workers", "workers"),
    ("/workers/abc", "workers"),
    ("/v1/rl/unknown", "other"),
    ("/health", "other"),
]


@pytest.mark.parametrize(("path", "family"), FAMILY_CASES)
def test_route_family(path, family):
    assert route_family(path) == family
    assert family in FAMILIES


def test_counts_are_one_event_per_interval_and_start_afresh():
    clock = iter([100.0, 160.0, 220.0]).__next__
    counts = AuditCounts(60, clock=clock)
    assert counts.take() is None  # nothing counted: nothing to journal
    for _ in range(3):
        counts.add("unauthenticated", "rl.engine", "denied", "unknown key")
    counts.add("usr", "rl.discovery", "success", None)
    event = counts.take()
    assert (event.since, event.until) == (100.0, 160.0)
    assert list(event.counts) == [
        {"principal": "unauthenticated", "family": "rl.engine", "outcome": "denied", "reason": "unknown key",
         "count": 3},
        {"principal": "usr", "family": "rl.discovery", "outcome": "success", "reason": None, "count": 1},
    ]  # fmt: skip
    assert len(counts) == 0
    counts.add("usr", "rl.discovery", "success", None)
    assert counts.take().since == 160.0


def test_the_key_space_stays_bounded_whatever_the_principals():
    counts = AuditCounts(60)
    for i in range(MAX_KEYS + 500):
        counts.add(f"p{i}", "rl.engine", "denied", "unknown key")
    assert len(counts) == MAX_KEYS + 1  # the overflow folds into one "(other)" key
    event = counts.take()
    assert sum(c["count"] for c in event.counts) == MAX_KEYS + 500
    assert {"principal": "(other)", "family": "rl.engine", "outcome": "denied", "reason": "unknown key",
            "count": 500} in event.counts  # fmt: skip

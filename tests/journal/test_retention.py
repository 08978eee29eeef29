"""The snapshot retention policy (journal/retention.py): bounded count, a snapshot close below any
seq, the newest always kept. Pure: table cases and hypothesis properties over simulated runs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from journal.retention import DEFAULT, Retention
from smgrl.runtime.snapshots import SNAPSHOT_EVERY


@pytest.mark.parametrize(
    ("age", "level"),
    [(0, 0), (1_000_000, 0), (1_000_001, 1), (2_000_000, 1), (2_000_001, 2), (4_000_000, 2), (9_000_000, 4)],
)
def test_levels_double(age, level):
    assert DEFAULT.level(age) == level


@pytest.mark.parametrize(
    ("seqs", "head", "kept"),
    [
        ([], 0, set()),
        ([5], 5, {5}),
        # all recent (age <= 8): all kept
        ([1, 2, 3, 4, 5, 6, 7, 8, 9], 9, {1, 2, 3, 4, 5, 6, 7, 8, 9}),
        # level 1 (age 9..16): buckets of 4 seqs keep their newest; level 2 (age 17..32): of 8
        ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 20, {3, 7, 11, 12}),
        (
            [2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30],
            30,
            {6, 12, 14, 18, 20, 22, 24, 26, 28, 30},
        ),
    ],
)
def test_keep_table(seqs, head, kept):
    assert Retention(every=1, recent=8, per_level=2).keep(seqs, head) == kept


def simulate(policy: Retention, gaps: list[int]) -> tuple[int, list[tuple[int, set[int]]]]:
    """A run: a snapshot after each gap, retention applied at each save (as the store does)."""
    head, kept, history = 0, set(), []
    for gap in gaps:
        head += gap
        kept = policy.keep(kept | {head}, head)
        history.append((head, set(kept)))
    return head, history


policies = st.builds(
    Retention,
    every=st.just(1000),
    recent=st.sampled_from([4000, 10_000, 20_000]),
    per_level=st.sampled_from([2, 4, 8]),
)


@settings(max_examples=60, deadline=None)
@given(policies, st.lists(st.integers(min_value=500, max_value=1000), min_size=1, max_size=400), st.data())
def test_bounded_count_newest_kept_and_a_snapshot_close_below_any_seq(policy, gaps, data):
    _head, history = simulate(policy, gaps)
    cadence = max(gaps)  # the largest distance between two snapshots taken
    for head, kept in history:
        assert head in kept  # the newest one: startup and verify restore it
        assert len(kept) <= Retention(
            every=min(gaps), recent=policy.recent, per_level=policy.per_level
        ).max_kept(head)
    head, kept = history[-1]
    for target in data.draw(st.lists(st.integers(min_value=0, max_value=head), min_size=1, max_size=30)):
        below = max((s for s in kept if s <= target), default=0)  # 0: replay from the start
        bound = max(cadence, (head - target) / (policy.per_level / 2) + cadence)
        assert target - below <= bound


def test_the_default_policy_on_a_long_run():
    """Gateway cadence (25,000) for 10M events: within the newest 1M a snapshot every 25,000; the
    count stays within the documented bound (41 + 10 per doubling)."""
    assert DEFAULT.every == SNAPSHOT_EVERY
    head, history = simulate(DEFAULT, [SNAPSHOT_EVERY] * 400)
    kept = history[-1][1]
    assert len(kept) <= DEFAULT.max_kept(head) <= 41 + 10 * 4
    recent = sorted(s for s in kept if head - s <= 1_000_000)
    assert recent == list(range(head - 1_000_000, head + 1, SNAPSHOT_EVERY))

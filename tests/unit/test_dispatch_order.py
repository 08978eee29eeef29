"""The routing loop's order (smgrl.routing.dispatch_order): PSRL's fork's priority classes and
sort keys, its multi-priority partitions, FIFO ties, and removal."""

from __future__ import annotations

import pytest

from smgrl.routing.dispatch_order import (
    UNVERSIONED_PARTITION,
    OrderedQueue,
    QueueFacts,
    order_key,
    partition_key,
    version_rank,
)


def drain(q: OrderedQueue) -> list:
    out = []
    while (item := q.pop()) is not None:
        out.append(item)
    return out


def fill(sort_key: str, multi: bool, rows: list[tuple[str, QueueFacts]]) -> OrderedQueue:
    q: OrderedQueue[str] = OrderedQueue(sort_key, multi)
    for name, facts in rows:
        q.push(name, facts)
    return q


def test_short_length_orders_by_prompt_length_with_fifo_ties():
    q = fill(
        "short_length",
        False,
        [("a", QueueFacts(input_len=10)), ("b", QueueFacts(input_len=2)), ("c", QueueFacts(input_len=2))],
    )
    assert drain(q) == ["b", "c", "a"]


def test_long_length_and_small_id():
    q = fill("long_length", False, [("a", QueueFacts(input_len=1)), ("b", QueueFacts(input_len=5))])
    assert drain(q) == ["b", "a"]
    q = fill(
        "small_id",
        False,
        [
            ("text-id", QueueFacts(request_id="gnt-7")),  # not a number: last, as the fork's i64::MAX
            ("20", QueueFacts(request_id="20")),
            ("3", QueueFacts(request_id="3")),
            ("none", QueueFacts()),
        ],
    )
    assert drain(q) == ["3", "20", "text-id", "none"]


def test_validation_first_then_lowest_version_then_unversioned():
    q = fill(
        "short_length",
        False,
        [
            ("fresh", QueueFacts(input_len=1)),  # unversioned: last class
            ("v2", QueueFacts(version="2", input_len=1)),
            ("v10", QueueFacts(version="10", input_len=1)),  # numeric by value: after 2
            ("v1-long", QueueFacts(version="1", input_len=99)),
            ("validate-v5", QueueFacts(is_validate=True, version="5", input_len=500)),
        ],
    )
    assert drain(q) == ["validate-v5", "v1-long", "v2", "v10", "fresh"]


def test_multi_priority_partitions_drain_lowest_version_first_even_over_validation():
    rows = [
        ("validate-v5", QueueFacts(is_validate=True, version="5")),
        ("v1", QueueFacts(version="1")),
        ("fresh", QueueFacts()),
        ("validate-v1", QueueFacts(is_validate=True, version="1")),
    ]
    assert drain(fill("short_length", True, rows)) == ["validate-v1", "v1", "validate-v5", "fresh"]
    # One queue: validation outranks the version.
    assert drain(fill("short_length", False, rows)) == ["validate-v1", "validate-v5", "v1", "fresh"]


def test_partitions_are_reported_per_version_only_in_multi_mode():
    rows = [("a", QueueFacts(version="2")), ("b", QueueFacts(version="2")), ("c", QueueFacts())]
    assert fill("short_length", True, rows).partitions() == {2: 2, UNVERSIONED_PARTITION: 1}
    assert fill("short_length", False, rows).partitions() == {0: 3}
    assert partition_key(QueueFacts(version="v-a"), True) == "v-a"


def test_removed_entries_are_skipped_and_counts_follow():
    q: OrderedQueue[int] = OrderedQueue("small_id", False)
    places = [q.push(i, QueueFacts(request_id=str(i))) for i in range(200)]
    for place in places[:150]:
        q.remove(place)
    q.remove(places[0])  # twice: harmless
    assert len(q) == 50 and q.partitions() == {0: 50}
    assert list(q.ordered()) == list(range(150, 200))
    assert drain(q) == list(range(150, 200))
    assert len(q) == 0 and q.partitions() == {}


def test_version_rank_is_a_total_order():
    assert version_rank("2") < version_rank("10") < version_rank("a") < version_rank(None)
    assert order_key(QueueFacts(), "short_length", False) > order_key(
        QueueFacts(version="0"), "short_length", False
    )


def test_an_unknown_sort_key_is_refused():
    with pytest.raises(ValueError, match="sort key"):
        OrderedQueue("newest", False)

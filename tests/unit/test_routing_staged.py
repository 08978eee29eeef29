"""Staged selection (docs/data-plane.md, "PSRL routing"): table cases per stage and hypothesis
properties (never below the floor, a pin is honoured while eligible, sort order)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smgrl.core.version import Version
from smgrl.dataplane.affinity import GroupPins
from smgrl.dataplane.table import Entry
from smgrl.routing.instance import Instance
from smgrl.routing.metadata import InstanceId
from smgrl.routing.staged import identity, select, sort_key


def inst(name: str, rank: int | None = None) -> Instance:
    url = f"http://{name}" + (f"@{rank}" if rank is not None else "")
    return Instance(
        worker_id=f"{name}-{rank}",
        url=url,
        base_url=f"http://{name}",
        group=name,
        dp_rank=rank,
        model="m",
        label_version=None,
    )


def entry(name: str, version: str | None, rank: int | None = None) -> Entry:
    return Entry(instance=inst(name, rank), hold=None, version=version, control="active")


def first(group):
    return group[0]


def run(entries, floor=None, hint=None, pin=None, refused=()):
    return select(
        entries,
        floor=Version.parse(floor) if floor is not None else None,
        hint=hint,
        group_pin=pin,
        refused=set(refused),
        choose=first,
    )


FLEET = [entry("a", "1"), entry("b", "2"), entry("c", "3"), entry("d", None)]

CASES = [
    # (description, kwargs, chosen name or None, stage, held)
    ("unversioned: newest first", {}, "c", "version", {}),
    ("versioned: lowest acceptable first", {"floor": "2"}, "b", "version", {"stale": 1, "unversioned": 1}),
    ("floor above everything: wait", {"floor": "9"}, None, "version", {"stale": 3, "unversioned": 1}),
    ("hint pins", {"hint": InstanceId("a", 0)}, "a", "hint", {}),
    ("hint by URL", {"hint": InstanceId("http://a", 0)}, "a", "hint", {}),
    ("hint wrong rank: falls through", {"hint": InstanceId("a", 1)}, "c", "version", {}),
    (
        "hint below floor: falls through",
        {"hint": InstanceId("a", 0), "floor": "2"},
        "b",
        "version",
        {"stale": 1, "unversioned": 1},
    ),
    ("group pin", {"pin": InstanceId("b", 0)}, "b", "group", {}),
    ("hint beats group pin", {"hint": InstanceId("a", 0), "pin": InstanceId("b", 0)}, "a", "hint", {}),
    (
        "pin refused: falls through",
        {"pin": InstanceId("b", 0), "refused": [("b", 0)]},
        "c",
        "version",
        {"refused": 1},
    ),
    ("newest refused: next newest", {"refused": [("c", 0)]}, "b", "version", {"refused": 1}),
    (
        "all refused: wait",
        {"refused": [("a", 0), ("b", 0), ("c", 0), ("d", 0)]},
        None,
        "version",
        {"refused": 4},
    ),
]


@pytest.mark.parametrize(("what", "kwargs", "name", "stage", "held"), CASES, ids=[c[0] for c in CASES])
def test_stages(what, kwargs, name, stage, held):
    decision = run(FLEET, **kwargs)
    assert (decision.chosen.instance.group if decision.chosen else None) == name
    assert decision.stage == stage
    assert decision.held == Counter(held)


def test_dp_ranks_are_instances():
    fleet = [entry("a", "1", 0), entry("a", "1", 1), entry("b", "1", 0)]
    assert run(fleet, hint=InstanceId("a", 1)).chosen.instance.dp_rank == 1
    assert identity(fleet[1].instance) == ("a", 1)


def test_the_policy_sees_only_the_first_priority_group():
    seen = []
    fleet = [entry("a", "2"), entry("b", "3"), entry("c", "3"), entry("d", "2")]

    def choose(group):
        seen.append([c.instance.group for c in group])
        return group[-1]

    decision = select(fleet, floor=None, hint=None, group_pin=None, refused=set(), choose=choose)
    assert seen == [["b", "c"]] and decision.chosen.instance.group == "c"
    seen.clear()
    select(fleet, floor=Version.parse("1"), hint=None, group_pin=None, refused=set(), choose=choose)
    assert seen == [["a", "d"]]


@pytest.mark.parametrize(
    ("older", "newer"),
    [(None, "abc"), (None, "0"), ("abc", "abd"), ("zzz", "0"), ("9", "10"), ("step-9", "1")],
)
def test_sort_order(older, newer):
    assert sort_key(older) < sort_key(newer)
    assert sort_key("042") == sort_key("42")


versions = st.one_of(st.none(), st.integers(0, 20).map(str), st.sampled_from(["a", "b", "step-1"]))
fleets = st.lists(st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 2), versions), max_size=12).map(
    lambda rows: [entry(n, v, r) for n, r, v in {(n, r): (n, r, v) for n, r, v in rows}.values()]
)
floors = st.one_of(st.none(), st.integers(0, 20).map(str))
hints = st.one_of(
    st.none(), st.tuples(st.sampled_from("abcdefgh"), st.integers(0, 2)).map(lambda t: InstanceId(*t))
)


@given(fleets, floors, hints, hints)
def test_never_below_the_floor_and_pins_honoured_while_eligible(fleet, floor, hint, pin):
    decision = run(fleet, floor=floor, hint=hint, pin=pin)
    eligible = [
        e
        for e in fleet
        if floor is None or (e.version is not None and Version.parse(e.version) >= Version.parse(floor))
    ]
    if not eligible:
        assert decision.chosen is None
        return
    chosen = decision.chosen
    assert chosen in eligible
    if floor is not None:
        assert Version.parse(chosen.version) >= Version.parse(floor)
    for p in (hint, pin):
        if p is not None and any(identity(e.instance) == (p.worker, p.rank) for e in eligible):
            assert identity(chosen.instance) == (p.worker, p.rank)
            break
    else:
        keys = [sort_key(e.version) for e in eligible]
        assert sort_key(chosen.version) == (min(keys) if floor is not None else max(keys))


@given(st.lists(st.tuples(st.sampled_from("pq"), st.booleans()), max_size=30))
def test_group_pin_is_written_once_and_released_with_the_last_request(ops):
    pins = GroupPins()
    running = Counter()
    first_pin = {}
    for n, (group, join) in enumerate(ops):
        if join or not running[group]:
            where = InstanceId(f"w{n}", 0)
            pins.join(group, where)
            running[group] += 1
            first_pin.setdefault(group, where)
        else:
            pins.leave(group)
            running[group] -= 1
            if not running[group]:
                first_pin.pop(group)
        for g in "pq":
            assert pins.pin(g) == first_pin.get(g)
            assert pins.running(g) == running[g]

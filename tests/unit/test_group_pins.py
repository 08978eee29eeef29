"""Prompt-group pins, pure parts: the journal's projection (``smgrl.state.group_pins``) and what
each process keeps (``smgrl.dataplane.affinity.GroupPins``: running counts and holds)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smgrl.dataplane.affinity import GroupPins
from smgrl.events import GroupPinned, GroupReleased
from smgrl.routing import InstanceId
from smgrl.state import snapshot
from smgrl.state.fleet import FleetState
from smgrl.state.group_pins import GroupPinsState, Pin

PROMPTS = ("p", "q")

# An event: ("pin", prompt, worker) or ("release", prompt, how far back the pin it names is).
steps = st.lists(
    st.one_of(
        st.tuples(st.just("pin"), st.sampled_from(PROMPTS), st.sampled_from(("w1", "w2"))),
        st.tuples(st.just("release"), st.sampled_from(PROMPTS), st.integers(0, 2)),
    ),
    max_size=20,
)


def as_events(plan) -> list[tuple[int, object]]:
    """The plan as journal events (seq from 1); a release names its prompt's latest pin, or one
    ``back`` pins older (a late release), or a seq never pinned."""
    out: list[tuple[int, object]] = []
    pinned: dict[str, list[int]] = {p: [] for p in PROMPTS}
    for seq, (kind, prompt, arg) in enumerate(plan, start=1):
        if kind == "pin":
            pinned[prompt].append(seq)
            out.append((seq, GroupPinned(prompt_id=prompt, worker_id=arg, gateway="g")))
        else:
            history = pinned[prompt]
            target = history[-1 - arg] if arg < len(history) else 10_000
            out.append((seq, GroupReleased(prompt_id=prompt, pin_seq=target)))
    return out


def model(events) -> dict[str, tuple[str, int]]:
    """The rule, stated directly: a prompt's pin is its latest group_pinned, unless a release
    naming exactly that pin came after it."""
    pins: dict[str, tuple[str, int]] = {}
    for seq, event in events:
        if isinstance(event, GroupPinned):
            pins[event.prompt_id] = (event.worker_id, seq)
        elif event.prompt_id in pins and pins[event.prompt_id][1] == event.pin_seq:
            del pins[event.prompt_id]
    return pins


@given(steps, st.integers(0, 20))
def test_the_fold_keeps_the_latest_pin_until_its_own_release_and_snapshots_resume_it(plan, cut):
    events = as_events(plan)
    state = GroupPinsState()
    for seq, event in events:
        state.apply(seq, event)
    assert {p: (pin.worker, pin.seq) for p, pin in state.pins.items()} == model(events)
    # A snapshot taken anywhere, then the rest folded, ends where the full fold does.
    fleet = FleetState()
    cut = min(cut, len(events))
    for seq, event in events[:cut]:
        fleet.apply(seq, event)
    resumed = snapshot.from_json(snapshot.to_json(fleet))
    for seq, event in events[cut:]:
        resumed.apply(seq, event)
    assert resumed.group_pins.pins == state.pins


A, B = InstanceId("a", 0), InstanceId("b", 1)


def shared_with(pin: Pin | None) -> GroupPins:
    groups = GroupPins()
    groups.shared = GroupPinsState()
    if pin is not None:
        groups.shared.pins["p"] = pin
    return groups


@pytest.mark.parametrize(
    ("journal_pin", "joined_with", "expect_pin", "expect_hold"),
    [
        # No pin in the journal: the first pick is held (and is the process's pin).
        (None, A, A, A),
        # The journal's pin comes first, and is what the process holds.
        (Pin("b", 1, 5, "me"), A, B, B),
        # A hinted request joins without a pick: nothing held, the journal's pin stands.
        (Pin("b", 1, 5, "me"), None, B, None),
    ],
)
def test_join_holds_the_journal_pin_first(journal_pin, joined_with, expect_pin, expect_hold):
    groups = shared_with(journal_pin)
    groups.join("p", joined_with)
    assert groups.pin("p") == expect_pin
    groups.shared.pins.clear()  # the deciding process released it in the journal
    assert groups.pin("p") == expect_hold  # the hold keeps routing this process's requests


@pytest.mark.parametrize(
    ("owner", "me", "released"),
    [("me", "me", True), ("other", "me", False)],
)
def test_only_the_deciding_process_releases_and_only_with_its_last_request(owner, me, released):
    pin = Pin("a", 0, 5, owner)
    groups = shared_with(pin)
    groups.join("p", A)
    groups.join("p", A)
    assert groups.leave("p", me) is None  # one still running here
    assert groups.leave("p", me) == (pin if released else None)
    assert groups.running("p") == 0


def test_a_lone_gateway_pins_in_memory_as_before():
    groups = GroupPins()
    groups.join("p", A)
    groups.join("p", B)  # write-once: the first writer wins
    assert groups.pin("p") == A and len(groups) == 1
    assert groups.leave("p") is None and groups.pin("p") == A
    assert groups.leave("p") is None and groups.pin("p") is None and len(groups) == 0

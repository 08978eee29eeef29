"""The recovered-engine rule's pure part: which server-info field is an engine's startup identity,
and what a changed one journals (smgrl.core.identity, smgrl.refit.recovered.identity_events)."""

from __future__ import annotations

import attrs
import pytest

from smgrl.core.identity import startup_identity
from smgrl.refit.recovered import identity_events
from smgrl.state.sagas import Sagas


@pytest.mark.parametrize(
    ("kind", "info", "expected"),
    [
        ("sglang", {"startup_time": 1764571200.25}, "startup_time=1764571200.25"),
        ("tokenspeed", {"start_time": 17.5}, "start_time=17.5"),
        ("tokenspeed", {"server_args": {"start_time": 3}}, "start_time=3"),  # nested only
        ("vllm", {"startup_time": 1}, None),  # vLLM reports no startup identity
        ("sglang", {"start_time": 1}, None),  # another kind's field
        ("sglang", {"startup_time": None}, None),
        ("sglang", {"startup_time": [1]}, None),
        ("sglang", {"startup_time": True}, None),
        ("sglang", None, None),
        (None, {"startup_time": 1}, None),
        ("sglang", {"startup_time": "1\x1b[2J"}, "startup_time=1\\x1b[2J"),  # escaped
    ],
)
def test_startup_identity(kind, info, expected):
    assert startup_identity(kind, info) == expected


@attrs.frozen
class W:
    id: str = "w1"
    group: str = "w1"
    base_url: str = "http://127.0.0.1:1"
    engine: str = "sglang"


def fold(sagas: Sagas, evs) -> None:
    for seq, e in enumerate(evs, start=len(sagas.identities) + 100):
        sagas.apply(seq, e)


def types(evs) -> list[str]:
    return [e.TYPE for e in evs]


def test_first_seen_then_same_then_changed_then_changed_while_held():
    sagas = Sagas()
    first = identity_events(W(), {"startup_time": 1}, sagas)
    assert types(first) == ["worker.identity_seen"] and first[0].previous is None
    fold(sagas, first)
    assert identity_events(W(), {"startup_time": 1}, sagas) == []
    changed = identity_events(W(), {"startup_time": 2}, sagas)
    assert types(changed) == ["worker.identity_seen", "worker.quarantined"]
    assert changed[0].previous == "startup_time=1" and changed[1].reason.startswith("recovered: ")
    fold(sagas, changed)
    assert "http://127.0.0.1:1" in sagas.quarantined
    # Changed again while already held: recorded, not quarantined twice.
    assert types(identity_events(W(), {"startup_time": 3}, sagas)) == ["worker.identity_seen"]


def test_a_new_registration_at_the_same_address_is_not_a_restart():
    sagas = Sagas()
    fold(sagas, identity_events(W(), {"startup_time": 1}, sagas))
    again = identity_events(W(id="w2", group="w2"), {"startup_time": 2}, sagas)
    assert types(again) == ["worker.identity_seen"] and again[0].previous is None


def test_kinds_without_an_identity_journal_nothing():
    assert identity_events(W(engine="vllm"), {"startup_time": 1}, Sagas()) == []
    assert identity_events(W(), {"no": "identity"}, Sagas()) == []

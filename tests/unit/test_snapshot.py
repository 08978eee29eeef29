"""FleetState snapshots: the codec round-trips, a restored state folds on exactly like the original,
startup restores from the newest usable snapshot, and the gateway's snapshot writes go through the
journal writer."""

from __future__ import annotations

import json

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from journal import Append, JournalClosedError, JournalWriter, MemoryStore, SqliteStore
from smgrl.core.observe import intent_of
from smgrl.events import (
    AuditControlPlane,
    AuditControlPlaneCounts,
    ControlFinished,
    ControlInterrupted,
    ControlOutcome,
    ControlStarted,
    DispatchSet,
    GatewayPeer,
    GatewayStarted,
    GatewayStopped,
    RequestLoopedBack,
    SessionContinued,
    SessionCreated,
    SessionDeleted,
    SessionEnded,
    SessionHung,
    SessionTurn,
    SnapshotTaken,
    WorkerDiscovered,
    WorkerHealthChanged,
    WorkerLabelsChanged,
    WorkerProbeFailed,
    WorkerRegistered,
    WorkerRemoved,
)
from smgrl.history.filters import catalogue
from smgrl.history.replay import FOLDED_TYPES, replay, restore
from smgrl.runtime.snapshots import SNAPSHOT_EVERY, Snapshotter, snapshot_every
from smgrl.state import snapshot
from smgrl.state.fleet import FleetState

URLS = [f"http://h{i}:1" for i in range(4)]


def registered(wid, url, **kw):
    return WorkerRegistered(worker_id=wid, url=url, base_url=url, source="api", **kw)


def started(op_id, path, body, wids):
    targets = [{"worker_id": w, "url": URLS[int(w[1])], "control_url": None} for w in wids]
    return ControlStarted(
        op_id=op_id,
        kind="fanout",
        method="POST",
        path=path,
        body_size=len(body),
        body_sha256="0" * 64,
        targets=targets,
        intent=intent_of("POST", path, body).to_json(),
    )


def outcome(op_id, wid, status=200, error=None):
    return ControlOutcome(
        op_id=op_id,
        worker_id=wid,
        url=URLS[int(wid[1])],
        status=status,
        error=error,
        latency_ms=3,
        excerpt="{}",
    )


def finished(op_id, result="ok"):
    return ControlFinished(
        op_id=op_id,
        result=result,
        http_status=200,
        total=1,
        succeeded=1,
        failed=0,
        latency_ms=1,
    )


def scenario():
    """A little of everything: plain and DP workers, labels, health, removal, refits, an open op."""
    return [
        registered("w0", URLS[0], labels={"role": "policy"}, has_api_key=True),
        registered("w1", URLS[1]),
        registered("w2", URLS[2], dp_aware=True),
        WorkerDiscovered(worker_id="w0", runtime="sglang", labels={"weight_version": "v0"}),
        WorkerDiscovered(worker_id="w1", runtime="vllm", labels={}, model_id="m"),
        WorkerDiscovered(
            worker_id="w2",
            runtime="sglang",
            labels={"dp_size": "2"},
            dp_rank_ids=["w2", "w9"],
        ),
        WorkerLabelsChanged(worker_id="w1", labels={"zone": "a"}, mode="merge"),
        WorkerHealthChanged(worker_id="w0", health="not_ready", reason="probe"),
        started("p1", "pause_generation", b"{}", ["w0", "w1"]),
        outcome("p1", "w0"),
        outcome("p1", "w1"),
        finished("p1"),
        started("u1", "update_weights_from_disk", b'{"weight_version":"v1"}', ["w0", "w1"]),
        outcome("u1", "w0"),
        outcome("u1", "w1", status=500),
        finished("u1", "partial"),
        started("u2", "update_weight_version", b'{"new_version":"v2"}', ["w0", "w1"]),
        outcome("u2", "w0", error="upstream_timeout"),  # open: no control.finished yet
        registered("w3", URLS[3]),
        WorkerRemoved(worker_id="w3", reason="gone"),
        AuditControlPlane(
            principal="p",
            auth_method="bearer",
            method="GET",
            path="/x",
            outcome="success",
            status=200,
        ),
    ]


def fold(events, fleet=None, start=1):
    fleet = fleet or FleetState()
    for seq, e in enumerate(events, start):
        fleet.apply(seq, e)
    return fleet


def test_round_trip_is_exact_and_keeps_open_operations():
    fleet = fold(scenario())
    text = snapshot.to_json(fleet)
    back = snapshot.from_json(text)
    assert snapshot.to_json(back) == text
    assert list(back.registry.workers) == list(fleet.registry.workers)
    assert back.registry.conflict_for(URLS[2]).id == "w2"
    assert set(back.operations.open) == {"u2"} and back.operations.open["u2"].outcomes
    assert back.facts() == fleet.facts()
    assert not back.operations.recent  # the recent-ops cache is not part of a snapshot
    assert json.loads(text)["last_seq"] == len(scenario())


@pytest.mark.parametrize("cut", range(len(scenario()) + 1))
def test_restored_state_folds_on_exactly_like_the_original(cut):
    events = scenario() + [outcome("u2", "w1"), finished("u2", "partial")]
    whole = fold(events)
    part = snapshot.from_json(snapshot.to_json(fold(events[:cut])))
    fold(events[cut:], part, start=cut + 1)
    assert snapshot.to_json(part) == snapshot.to_json(whole)


EVENT_POOL = st.sampled_from(
    [
        registered("w0", URLS[0]),
        registered("w1", URLS[1], dp_aware=True),
        WorkerDiscovered(worker_id="w0", runtime="sglang", labels={"weight_version": "a"}),
        WorkerDiscovered(worker_id="w1", runtime="sglang", labels={}, dp_rank_ids=["w1", "w7"]),
        WorkerHealthChanged(worker_id="w1", health="failed", reason="x"),
        WorkerLabelsChanged(worker_id="w0", labels={"k": "v"}, mode="replace"),
        WorkerRemoved(worker_id="w1", reason="x"),
        started("o", "update_weights_from_disk", b'{"weight_version":"b"}', ["w0", "w1"]),
        started("q", "pause_generation", b"", ["w0"]),
        outcome("o", "w0"),
        outcome("o", "w1", status=503),
        outcome("q", "w0", error="upstream_timeout"),
        finished("o"),
        ControlInterrupted(op_id="q", reason="gateway_restart"),
    ]
)


@settings(max_examples=150, deadline=None)
@given(st.lists(EVENT_POOL, max_size=25), st.data())
def test_any_history_snapshotted_anywhere_continues_identically(events, data):
    cut = data.draw(st.integers(0, len(events)))
    part = snapshot.from_json(snapshot.to_json(fold(events[:cut])))
    fold(events[cut:], part, start=cut + 1)
    assert snapshot.to_json(part) == snapshot.to_json(fold(events))


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"kind": "fleet", "format": 999}',
        '{"kind": "other", "format": 1}',
        '{"kind": "fleet", "format": 1}',
    ],
)
def test_unusable_snapshots_are_refused(text):
    with pytest.raises(snapshot.SnapshotError):
        snapshot.from_json(text)


def test_a_snapshot_with_fields_this_code_does_not_know_is_refused():
    data = json.loads(snapshot.to_json(fold(scenario())))
    data["registry"]["workers"][0]["colour"] = "blue"
    with pytest.raises(snapshot.SnapshotError):
        snapshot.from_json(json.dumps(data))


def test_fleet_state_ignores_every_type_outside_folded_types():
    samples = {
        "audit.control_plane": scenario()[-1],
        "audit.control_plane_counts": AuditControlPlaneCounts(
            since=1.0,
            until=2.0,
            counts=[
                {
                    "principal": "unauthenticated",
                    "family": "rl.engine",
                    "outcome": "denied",
                    "reason": "unknown key",
                    "count": 3,
                }
            ],
        ),
        "gateway.started": GatewayStarted(version="x", pid=1),
        "gateway.stopped": GatewayStopped(clean=True, reason="x"),
        # Read from the store by the forwarder (smgrl/cluster/forwarding.py), never folded.
        "gateway.peer": GatewayPeer(gateway="h:1:t", owner="o", host="h", url="http://127.0.0.1:1"),
        "snapshot.taken": SnapshotTaken(kind="fleet", upto_seq=3),
        "worker.probe_failed": WorkerProbeFailed(worker_id="w0", attempt=1, error="x", next_retry_s=1.0),
        "dataplane.request_looped_back": RequestLoopedBack(request_id="r", loopbacks=1),
        # Agent sessions (smgrl/sessions) live in the session service, never in the fleet.
        "session.created": SessionCreated(session_id="s", owner="o"),
        "session.turn": SessionTurn(
            session_id="s",
            turn=1,
            trajectory_id=0,
            prompt_tokens=3,
            output_tokens=2,
            reused_tokens=0,
            prefix="no_prefix",
            captured=True,
            finish_reason="stop",
        ),
        "session.hung": SessionHung(session_id="s", deferred=False),
        "session.continued": SessionContinued(session_id="s"),
        "session.deleted": SessionDeleted(session_id="s", turns=1, reason="api"),
        "session.ended": SessionEnded(session_id="s", reason="restart"),
    }
    assert set(catalogue()) - FOLDED_TYPES == set(samples)
    base = fold(scenario())
    before = json.loads(snapshot.to_json(base))
    for seq, e in enumerate(samples.values(), 100):
        base.apply(seq, e)
    after = json.loads(snapshot.to_json(base))
    before["last_seq"] = after["last_seq"]
    assert after == before


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    s = SqliteStore.open(tmp_path / "j.db") if request.param == "sqlite" else MemoryStore()
    yield s
    s.close()


def test_restore_uses_the_newest_snapshot_and_folds_the_rest(store):
    events = scenario()
    store.append_batch([Append("s", e) for e in events[:10]])
    store.save_snapshot(snapshot.KIND, 10, snapshot.to_json(fold(events[:10])))
    store.append_batch([Append("s", e) for e in events[10:]])
    fleet, info = restore(store)
    assert (info.snapshot_seq, info.replayed, info.head) == (
        10,
        len(events) - 10 - 1,
        len(events),
    )  # audit skipped
    assert snapshot.to_json(fleet) == snapshot.to_json(fold(events))
    full, info = restore(store, use_snapshot=False)
    assert info.snapshot_seq == 0 and snapshot.to_json(full) == snapshot.to_json(fleet)
    past, info = restore(store, until_seq=8)
    assert (
        info.snapshot_seq == 0
        and info.head == 8
        and snapshot.to_json(past) == snapshot.to_json(fold(events[:8]))
    )


def test_restore_ignores_a_snapshot_it_cannot_load(store):
    events = scenario()
    store.append_batch([Append("s", e) for e in events])
    store.save_snapshot(snapshot.KIND, 5, json.dumps({"kind": "fleet", "format": 999}))
    fleet, info = restore(store)
    assert info.snapshot_seq == 0 and "format" in info.snapshot_error
    assert snapshot.to_json(fleet) == snapshot.to_json(fold(events))


def test_replay_counts_only_folded_events_and_stops_at_until(store):
    events = scenario()
    store.append_batch([Append("s", e) for e in events])
    fleet = FleetState()
    assert replay(store, fleet, until_seq=12) == 12
    assert fleet.last_seq == 12


def test_snapshot_every_reads_the_environment():
    assert snapshot_every({}) == SNAPSHOT_EVERY == 25_000
    assert snapshot_every({"SMGRL_SNAPSHOT_EVERY": "40"}) == 40
    assert snapshot_every({"SMGRL_SNAPSHOT_EVERY": "0"}) == 0
    assert snapshot_every({"SMGRL_SNAPSHOT_EVERY": "lots"}) == SNAPSHOT_EVERY


async def test_writer_save_snapshot_goes_through_the_writer(tmp_path):
    store = SqliteStore.open(tmp_path / "j.db")
    fleet = FleetState()
    writer = JournalWriter(store, on_commit=fleet.apply_records)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for e in scenario():
            writer.append_nowait("s", e)
        await writer.flush()
        text = snapshot.to_json(fleet)
        assert await writer.save_snapshot(snapshot.KIND, fleet.last_seq, lambda: text) == len(text)
        await writer.aclose()
    assert store.latest_snapshot(snapshot.KIND) == (len(scenario()), text)
    with pytest.raises(JournalClosedError):
        await writer.save_snapshot(snapshot.KIND, 1, text)
    store.close()


async def test_snapshotter_stores_a_snapshot_and_a_marker_when_due(tmp_path):
    store = SqliteStore.open(tmp_path / "j.db")
    fleet = FleetState()
    writer = JournalWriter(store, on_commit=fleet.apply_records)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        snaps = Snapshotter(fleet, writer, every=10, last_seq=0)
        for e in scenario()[:5]:
            await writer.append("s", e)
        assert not snaps.due()
        for e in scenario()[5:]:
            await writer.append("s", e)
        assert snaps.due()
        seq = await snaps.take()
        assert seq == len(scenario()) and not snaps.due()
        await writer.aclose()
    upto, text = store.latest_snapshot(snapshot.KIND)
    assert upto == seq and text == snapshot.to_json(fold(scenario()))
    marker = list(store.read(seq))[-1]
    assert marker.event.TYPE == "snapshot.taken" and marker.event.upto_seq == seq
    fresh, info = restore(store)
    assert info.snapshot_seq == seq and snapshot.to_json(fresh) == snapshot.to_json(fleet)
    store.close()


def test_the_routing_loop_switch_survives_a_snapshot_and_replay():
    fleet = fold(scenario())
    plain = snapshot.to_json(fleet)
    assert "routing" not in json.loads(plain)  # never switched: older snapshots stay identical
    fleet.apply(200, DispatchSet(paused=True))
    loaded = snapshot.from_json(snapshot.to_json(fleet))
    assert (loaded.routing.paused, loaded.routing.revision, loaded.routing.changed_seq) == (True, 1, 200)
    assert snapshot.to_json(loaded) == snapshot.to_json(fleet)
    assert not snapshot.from_json(plain).routing.paused

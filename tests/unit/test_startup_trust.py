"""Startup trusts only what verifies (``smgrl.history.replay.restore_verified``): the hash chain of
every replayed event is checked from the snapshot, whose own hash binds the chain; a snapshot
that fails its hash is not used, with one warning line. Real SQLite files, tampered with sqlite3."""

from __future__ import annotations

import json
import logging
import sqlite3

import pytest

from journal import Append, SqliteStore
from smgrl.core.errors import StartupError
from smgrl.events import WorkerDiscovered, WorkerRegistered
from smgrl.history.replay import replay, restore_verified
from smgrl.state import snapshot


def worker(n: int) -> list[Append]:
    url = f"http://127.0.0.1:{41000 + n}"
    wid = f"w{n:03d}"
    return [
        Append(f"worker:{wid}", WorkerRegistered(worker_id=wid, url=url, base_url=url, source="api")),
        Append(f"worker:{wid}", WorkerDiscovered(worker_id=wid, runtime="sglang", labels={}, model_id="m")),
    ]


def build(path: str, workers: int, *, snapshot_after: int | None = None) -> None:
    """``workers`` registrations (2 events each); a fleet snapshot after the first ``snapshot_after``."""
    store = SqliteStore.open(path)
    for n in range(workers):
        store.append_batch(worker(n))
        if snapshot_after is not None and n + 1 == snapshot_after:
            from smgrl.state.fleet import FleetState

            fleet = FleetState()
            replay(store, fleet)
            store.save_snapshot(snapshot.KIND, fleet.last_seq, snapshot.to_json(fleet))
    store.close()


def tamper(path: str, sql: str, *params) -> None:
    conn = sqlite3.connect(path)
    conn.execute(sql, params)
    conn.commit()
    conn.close()


def urls(fleet) -> list[str]:
    return sorted(w.url for w in fleet.registry)


def test_an_edited_worker_url_is_refused_naming_its_seq(tmp_path):
    path = str(tmp_path / "j.db")
    build(path, 5)
    # Point worker 2 (its worker.registered is seq 5) at another host, behind the journal's back.
    tamper(path, "UPDATE events SET payload = replace(payload, '41002', '9') WHERE seq = 5")
    store = SqliteStore.open(path)
    with pytest.raises(StartupError) as refused:
        restore_verified(store)
    store.close()
    text = str(refused.value)
    assert "at seq 5" in text and "smgrl journal verify" in text and path in text
    assert "\n" not in text


def test_events_after_the_snapshot_are_checked(tmp_path):
    path = str(tmp_path / "j.db")
    build(path, 6, snapshot_after=3)  # snapshot at seq 6; rows 7..12 are replayed
    tamper(path, "UPDATE events SET payload = replace(payload, '41004', '9') WHERE seq = 9")
    store = SqliteStore.open(path)
    with pytest.raises(StartupError, match="at seq 9"):
        restore_verified(store)
    store.close()


def test_a_clean_journal_with_a_snapshot_restores_from_it(tmp_path):
    path = str(tmp_path / "j.db")
    build(path, 6, snapshot_after=3)
    store = SqliteStore.open(path)
    fleet, restored = restore_verified(store)
    store.close()
    assert restored.snapshot_seq == 6 and restored.snapshot_error is None
    assert urls(fleet) == [f"http://127.0.0.1:{41000 + n}" for n in range(6)]


def test_a_tampered_snapshot_is_not_used_and_says_so(tmp_path, caplog):
    path = str(tmp_path / "j.db")
    build(path, 6, snapshot_after=3)
    # A worker slipped into the snapshot's state: its hash no longer holds.
    tamper(path, "UPDATE snapshots SET state = replace(state, '41001', '41777')")
    store = SqliteStore.open(path)
    with caplog.at_level(logging.WARNING, logger="smgrl.snapshot"):
        fleet, restored = restore_verified(store)
    store.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "snapshot at seq 6 fails its hash check" in warnings[0] and "smgrl journal verify" in warnings[0]
    # The state comes from the verified events only: the slipped-in URL is not served.
    assert restored.snapshot_seq == 0
    assert urls(fleet) == [f"http://127.0.0.1:{41000 + n}" for n in range(6)]


def test_a_tampered_snapshot_over_a_tampered_history_is_refused(tmp_path):
    # Falling back to a full replay also verifies the rows the snapshot covered.
    path = str(tmp_path / "j.db")
    build(path, 6, snapshot_after=3)
    tamper(path, "UPDATE snapshots SET state = replace(state, '41001', '41777')")
    tamper(path, "UPDATE events SET payload = replace(payload, '41001', '41777') WHERE seq = 3")
    store = SqliteStore.open(path)
    with pytest.raises(StartupError, match="at seq 3"):
        restore_verified(store)
    store.close()


def fanout(op_id: str, targets: list[str], version: str, *, finish: bool = True) -> list[Append]:
    from smgrl.core.observe import intent_of
    from smgrl.events import AuditControlPlane, ControlFinished, ControlOutcome, ControlStarted

    body = json.dumps({"model_path": "/ckpt", "weight_version": version}).encode()
    stream = f"op:{op_id}"
    items = [
        Append(
            stream,
            ControlStarted(
                op_id=op_id,
                kind="fanout",
                method="POST",
                path="update_weights_from_disk",
                query=None,
                selector="engine=sglang",
                targets=[
                    {"worker_id": w, "url": f"http://{w}", "control_url": f"http://{w}"} for w in targets
                ],
                **ControlStarted.body_fields(body),
                content_type="application/json",
                principal=None,
                request_id=None,
                intent=intent_of("POST", "update_weights_from_disk", body).to_json(),
            ),
        )
    ]
    for w in targets:
        items.append(
            Append(
                stream,
                ControlOutcome(
                    op_id=op_id,
                    worker_id=w,
                    url=f"http://{w}",
                    control_url=f"http://{w}",
                    status=200,
                    latency_ms=3,
                    error=None,
                    message=None,
                    excerpt="{}",
                    body_truncated=False,
                ),
            )
        )
    audit = AuditControlPlane(
        principal="none",
        auth_method="none",
        method="POST",
        path="/v1/rl/engine/update_weights_from_disk",
        outcome="success",
        status=200,
    )
    items.append(Append("audit", audit))
    if finish:
        n = len(targets)
        fields = {"result": "ok", "http_status": 200, "total": n, "succeeded": n, "failed": 0}
        items.append(Append(stream, ControlFinished(op_id=op_id, latency_ms=5, **fields)))
    return items


@pytest.mark.parametrize("snapshot_at", ["none", "workers", "ops"])
def test_the_verified_one_pass_restore_equals_a_full_replay(tmp_path, snapshot_at):
    """The startup pass (chain check and fold together, every row once) gives exactly the state
    of the plain fold over the journal: no snapshot, one among the registrations, one holding an
    open operation; an operation left open at the end."""
    from smgrl.state.fleet import FleetState

    path = str(tmp_path / "j.db")
    build(path, 6, snapshot_after=2 if snapshot_at == "workers" else None)
    store = SqliteStore.open(path)
    ids = [f"w{n:03d}" for n in range(6)]
    store.append_batch(fanout("op3", ids[3:], "v3", finish=False))
    for i in range(3):
        store.append_batch(fanout(f"op{i}", ids[i : i + 3], f"v{i}"))
        if snapshot_at == "ops" and i == 0:
            mid = FleetState()
            replay(store, mid)
            assert list(mid.operations.open) == ["op3"]
            store.save_snapshot(snapshot.KIND, mid.last_seq, snapshot.to_json(mid))
    fleet, restored = restore_verified(store)
    full = FleetState()
    replay(store, full)
    store.close()
    assert restored.replayed > 0 and fleet.last_seq == full.last_seq
    assert (restored.snapshot_seq > 0) == (snapshot_at != "none")
    assert snapshot.to_dict(snapshot.capture(fleet)) == snapshot.to_dict(snapshot.capture(full))
    assert list(fleet.operations.open) == ["op3"]


def quarantine_then_snapshot(path: str) -> int:
    """Six workers, w001 quarantined (seq 13), more events, then a snapshot: the seq of the
    quarantine. Snapshots do not hold sagas or quarantines: startup folds those rows from the file."""
    from smgrl.events import WorkerQuarantined
    from smgrl.state.fleet import FleetState

    build(path, 6)
    store = SqliteStore.open(path)
    url = "http://127.0.0.1:41001"
    (rec,) = store.append_batch(
        [
            Append(
                "worker:w001",
                WorkerQuarantined(worker_id="w001", base_url=url, reason="operator: bad weights"),
            )
        ]
    )
    store.append_batch(worker(6))
    fleet = FleetState()
    replay(store, fleet)
    store.save_snapshot(snapshot.KIND, fleet.last_seq, snapshot.to_json(fleet))
    store.append_batch(worker(7))
    store.close()
    return rec.seq


def test_a_quarantine_before_the_snapshot_is_restored(tmp_path):
    path = str(tmp_path / "j.db")
    quarantine_then_snapshot(path)
    store = SqliteStore.open(path)
    fleet, restored = restore_verified(store)
    store.close()
    assert restored.snapshot_seq > 0
    assert list(fleet.sagas.quarantined) == ["http://127.0.0.1:41001"]


@pytest.mark.parametrize("hashes", ["kept", "recomputed"])
def test_an_edited_quarantine_before_the_snapshot_is_refused(tmp_path, hashes):
    """The rows startup folds from before the snapshot are chain-checked too: an edit of the row
    (its stored hash kept, or recomputed so that the next row no longer links) is refused."""
    from journal._chain import chain_hash

    path = str(tmp_path / "j.db")
    seq = quarantine_then_snapshot(path)
    # Release w001 behind the journal's back: point its quarantine at another engine.
    tamper(path, "UPDATE events SET payload = replace(payload, '41001', '41999') WHERE seq = ?", seq)
    if hashes == "recomputed":
        conn = sqlite3.connect(path)
        row = conn.execute(
            "SELECT seq, ts, stream, type, schema, payload, prev_hash FROM events WHERE seq = ?", (seq,)
        ).fetchone()
        new = chain_hash(row[6], row[0], row[1], row[2], row[3], row[4], row[5].encode())
        conn.execute("UPDATE events SET hash = ? WHERE seq = ?", (new, seq))
        conn.commit()
        conn.close()
    store = SqliteStore.open(path)
    with pytest.raises(StartupError, match=f"at seq {seq if hashes == 'kept' else seq + 1}"):
        restore_verified(store)
    store.close()

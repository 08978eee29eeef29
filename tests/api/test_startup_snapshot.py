"""A startup that replayed and chain-checked a long stretch of the journal (no snapshot yet, or
one that failed its hash) stores a snapshot of what it checked before it serves, so the next
start restores it and checks only the rows after it: the long check is paid once."""

from __future__ import annotations

import trio
from rl_api_helpers import rl_cfg

from journal import Append, SqliteStore
from smgrl.core.config import HealthConfig
from smgrl.events import WorkerHealthChanged
from smgrl.history.replay import restore_verified
from smgrl.runtime.server import serve
from smgrl.state import snapshot


def _journal(path, n: int) -> int:
    with SqliteStore.open(path) as store:
        for i in range(n):
            wid = f"w{i}"
            store.append_batch(
                [
                    Append(
                        f"worker:{wid}",
                        WorkerHealthChanged(worker_id=wid, health="healthy", reason="probe ok"),
                    )
                ]
            )
        return store.last_seq()


async def _serve_once(store) -> None:
    cfg = rl_cfg(port=0, prometheus_port=0, health=HealthConfig(enabled=False), shutdown_grace_period_secs=0)
    async with trio.open_nursery() as nursery:
        shutdown = trio.Event()
        await nursery.start(
            lambda task_status: serve(cfg, shutdown=shutdown, store=store, task_status=task_status)
        )
        # Serving now: what it replayed is already in a snapshot.
        seqs = store.snapshot_seqs(snapshot.KIND)
        shutdown.set()
    return seqs


async def test_a_long_replay_is_snapshotted_before_the_gateway_serves(tmp_path, monkeypatch):
    monkeypatch.setenv("SMGRL_SNAPSHOT_EVERY", "20")
    path = tmp_path / "j.db"
    head = _journal(path, 50)
    with SqliteStore.open(path) as store:
        assert store.snapshot_seqs(snapshot.KIND) == []
        seqs = await _serve_once(store)
        assert seqs and seqs[0] > head  # the replayed events, and the gateway's own startup events
        # The next start restores it: only the rows after it are replayed and checked.
        _fleet, restored = restore_verified(store)
        assert restored.snapshot_seq >= seqs[0]
        assert restored.replayed < 20


async def test_a_short_replay_takes_no_snapshot_before_serving(tmp_path, monkeypatch):
    monkeypatch.setenv("SMGRL_SNAPSHOT_EVERY", "1000")
    path = tmp_path / "j.db"
    _journal(path, 10)
    with SqliteStore.open(path) as store:
        assert await _serve_once(store) == []

"""The gateway service that stores fleet snapshots as the journal grows.

The snapshot itself (what it holds, how it is encoded and loaded) is pure and lives in
``smgrl.state.snapshot``; restoring from one is ``smgrl.history.replay``. This module is the timer
and the write: a task beside the fold, started by ``smgrl.runtime.server``.
"""

from __future__ import annotations

import logging
import os
import time

import trio

from smgrl.core.numbers import parse_uint
from smgrl.events import SnapshotTaken
from smgrl.state import FleetState, snapshot
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.snapshot")

# Events between two snapshots taken by the gateway. It bounds what startup replays and
# hash-checks (the worst case is a snapshot this many events behind the head): 25,000 keeps a
# verified startup on a 1M-event journal under a second (docs/benchmarks.md), for a snapshot
# (about 1 MB and 25-90 ms of the writer thread for a 2,000-worker fleet) every 25,000 events.
SNAPSHOT_EVERY = 25_000
SNAPSHOT_EVERY_ENV = "SMGRL_SNAPSHOT_EVERY"  # override (tests, tuning); 0 turns snapshots off


def snapshot_every(environ: dict[str, str] | None = None) -> int:
    """Events between snapshots: ``SMGRL_SNAPSHOT_EVERY`` when set to an integer >= 0, else 25,000."""
    raw = (os.environ if environ is None else environ).get(SNAPSHOT_EVERY_ENV, "").strip()
    every = parse_uint(raw)
    return SNAPSHOT_EVERY if every is None else every


class Snapshotter:
    """Stores a fleet snapshot every ``every`` events, through the journal writer.

    The state is captured on the event loop (between batches, so it is exactly the fold up to
    ``fleet.last_seq``); encoding and the write happen in the writer's thread
    (``JournalWriter.save_snapshot``), never concurrently with a commit. A ``snapshot.taken``
    marker follows each stored snapshot.
    """

    def __init__(self, fleet: FleetState, writer, *, every: int, last_seq: int, poll_secs: float = 1.0):
        self.fleet = fleet
        self.writer = writer
        self.every = every
        self.last_seq = last_seq  # seq of the newest snapshot (0: none)
        self.poll_secs = poll_secs

    def due(self) -> bool:
        return self.every > 0 and self.fleet.last_seq - self.last_seq >= self.every

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        if self.every <= 0:
            return
        # Cancelled with the gateway's inner nursery at shutdown. A cancellation during
        # save_snapshot waits for the thread (abandon_on_cancel=False in the writer): the
        # snapshot row is then written or not, never half.
        while True:
            if self.due():
                await self.take()
            await trio.sleep(self.poll_secs)

    async def take(self) -> int | None:
        """Store a snapshot of the current state now; its upto_seq, or None if it failed."""
        t0 = time.perf_counter()
        cap = snapshot.capture(self.fleet)  # on the loop: consistent (no batch applies meanwhile)
        if cap.last_seq <= 0:
            return None
        captured_ms = (time.perf_counter() - t0) * 1000
        try:
            size = await self.writer.save_snapshot(snapshot.KIND, cap.last_seq, lambda: snapshot.dumps(cap))
        except Exception as exc:  # noqa: BLE001 - a snapshot is a cache: log it and carry on
            log.warning("snapshot at seq %d failed: %r", cap.last_seq, exc)
            self.last_seq = cap.last_seq  # do not retry every second; try again after `every`
            return None
        self.last_seq = cap.last_seq
        log_event(
            log,
            "snapshot stored",
            upto_seq=cap.last_seq,
            bytes=size,
            capture_ms=round(captured_ms, 2),
            workers=len(cap.registry.workers),
        )
        try:
            await self.writer.append("gateway", SnapshotTaken(kind=snapshot.KIND, upto_seq=cap.last_seq))
        except Exception as exc:  # noqa: BLE001 - the marker is informational
            log.warning("snapshot marker not journaled: %r", exc)
        return cap.last_seq

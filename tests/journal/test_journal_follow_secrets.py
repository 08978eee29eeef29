"""Several writers: a key read with a commit's gap never overwrites a newer one (regression).

The writer reads the gap (what other processes appended before its batch) and the keys those
events set in its thread, right after the commit. When the write lock was taken (another process
writing: the inline commit goes to the thread), ``catch_up()`` can run on the event loop
meanwhile and apply a NEWER key for the same worker; the gap's older key was then applied after
it, and the process kept calling the engine with a replaced key."""

from __future__ import annotations

import sqlite3
import threading

import trio
import trio.testing
from journal_helpers import outcome

from journal import Append, JournalWriter, SqliteStore


class GapReadPauses(SqliteStore):
    """A real SQLite store whose writer-thread key read pauses after reading (the thread being
    descheduled there), so the test can commit and catch up in between."""

    paused = threading.Event()
    go = threading.Event()

    def secret_changes(self, after_seq, until_seq):
        changes = super().secret_changes(after_seq, until_seq)
        if threading.current_thread() is not threading.main_thread():
            self.paused.set()
            assert self.go.wait(20)
        return changes


async def test_a_gap_key_read_before_a_catch_up_does_not_overwrite_its_newer_key(tmp_path):
    path = str(tmp_path / "journal.db")
    store = GapReadPauses.open(path)
    other = SqliteStore.open(path)  # another gateway process's connection
    ring: dict[str, str] = {}
    writer = JournalWriter(store)
    writer.position = 0
    writer.on_commit = lambda records: None
    writer.on_secrets = lambda changes: ring.update({k: v for k, v in changes.items() if v})
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            other.append_batch([Append("p1", outcome(op_id="a"), secrets={"w": "old"})])  # seq 1
            # The other process holds the write lock: the writer's inline commit is busy and
            # goes to its thread, which waits for the lock.
            blocker = sqlite3.connect(path, isolation_level=None)
            blocker.execute("BEGIN IMMEDIATE")
            mine: list = []

            async def append() -> None:
                mine.append(await writer.append("p0", outcome(op_id="b")))

            nursery.start_soon(append)
            await trio.testing.wait_all_tasks_blocked()
            assert writer.lock_waits == 1
            blocker.execute("COMMIT")
            blocker.close()
            # The thread committed seq 2 and read the gap's keys ({w: old}), then pauses.
            assert await trio.to_thread.run_sync(GapReadPauses.paused.wait, 20)
            other.append_batch([Append("p1", outcome(op_id="c"), secrets={"w": "new"})])  # seq 3
            assert await writer.catch_up() == 3  # the tail applies 1-3 and w's newest key
            assert ring == {"w": "new"}
            GapReadPauses.go.set()
            with trio.fail_after(20):
                while not mine:
                    await trio.testing.wait_all_tasks_blocked()
            assert mine[0].seq == 2 and writer.position == 3
            assert ring == {"w": "new"} == store.secrets()
            nursery.cancel_scope.cancel()
    finally:
        GapReadPauses.go.set()
        other.close()
        store.close()

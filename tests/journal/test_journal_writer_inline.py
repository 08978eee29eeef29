"""The writer's inline commit path (the one production uses: SQLite, WAL, synchronous=NORMAL).

A second SQLite connection holding ``BEGIN IMMEDIATE`` plays ``smgrl journal compact`` (or any other
process writing the file). The writer must never wait for that lock on the event loop: it hands the
batch to its thread, keeps queueing, and resumes inline once the lock is free. No wall-clock
assertions: the tests wait for the writer's counters and for tasks to block.
"""

from __future__ import annotations

import sqlite3
import threading

import pytest
import trio
import trio.lowlevel
import trio.testing
from journal_helpers import outcome, registered

from journal import JournalClosedError, JournalWriteError, JournalWriter, SqliteStore


class ThreadRecordingStore:
    """Delegates to a SqliteStore and records which thread each transaction ran on."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.threads: list[tuple[str, float | None]] = []

    def append_batch(self, items, *, wait=None):
        self.threads.append((threading.current_thread().name, wait))
        return self.inner.append_batch(items, wait=wait)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def hold_lock(path) -> sqlite3.Connection:
    """Another connection (as another process would) takes the journal's write lock."""
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    return other


async def wait_for(predicate) -> None:
    # Bounded: a failing test stops instead of hanging; nothing asserts on time.
    with trio.fail_after(30):
        while not predicate():
            await trio.sleep(0.001)


@pytest.fixture
def store(tmp_path):
    s = SqliteStore.open(tmp_path / "j.db")
    assert s.commits_are_cheap
    yield ThreadRecordingStore(s)
    s.close()


async def test_commits_run_on_the_event_loop_when_the_lock_is_free(store):
    writer = JournalWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(3):
            await writer.append("workers", registered(f"w{i}"))
        await writer.aclose()
    main = threading.main_thread().name
    assert store.threads == [(main, 0)] * 3  # inline, never waiting for a lock
    assert writer.commits == 3 and writer.lock_waits == 0


async def test_a_held_lock_moves_the_commit_to_the_thread_and_the_loop_keeps_running(store):
    writer = JournalWriter(store, lock_wait_secs=60)
    other = hold_lock(store.inner.path)
    done: list[int] = []

    async def appender(name: str) -> None:
        done.append((await writer.append("workers", registered(name))).seq)

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        nursery.start_soon(appender, "w1")
        await wait_for(lambda: writer.lock_waits == 1)  # tried inline, found the lock taken
        # The event loop is free while the thread waits: other tasks run, more appends queue.
        ticks = 0
        for _ in range(50):
            await trio.lowlevel.checkpoint()
            ticks += 1
        nursery.start_soon(appender, "w2")
        await trio.testing.wait_all_tasks_blocked()
        assert done == [] and ticks == 50
        assert writer._queued == 1  # w2 waits behind w1, in order
        other.execute("COMMIT")  # the outside writer lets go
        await wait_for(lambda: len(done) == 2)
        await writer.append("workers", registered("w3"))
        await writer.aclose()
    other.close()
    main = threading.main_thread().name
    assert sorted(done) == [1, 2]
    # w1: inline attempt (no wait), then the thread (waiting); then inline again.
    assert store.threads[0] == (main, 0)
    assert store.threads[1][0] != main and store.threads[1][1] > 0
    assert all(t == (main, 0) for t in store.threads[2:])
    assert store.inner.verify().ok and store.inner.count() == 3


async def test_a_lock_held_past_lock_wait_secs_fails_the_batch_then_appends_resume(store):
    writer = JournalWriter(store, lock_wait_secs=0.05)
    other = hold_lock(store.inner.path)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        with pytest.raises(JournalWriteError, match="locked"):
            await writer.append("workers", registered("w1"))
        other.execute("COMMIT")
        assert (await writer.append("workers", registered("w2"))).seq == 1  # nothing of w1 left
        await writer.aclose()
    other.close()
    assert store.inner.count() == 1 and store.inner.verify().ok


async def test_cancelled_appender_during_a_lock_wait_still_gets_its_event_written(store):
    writer = JournalWriter(store, lock_wait_secs=60)
    other = hold_lock(store.inner.path)
    scope = trio.CancelScope()

    async def impatient() -> None:
        with scope:
            await writer.append("control", outcome(op_id="abandoned"))

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        nursery.start_soon(impatient)
        await wait_for(lambda: writer.lock_waits == 1)
        scope.cancel()  # the caller gives up while its batch waits for the lock
        await trio.testing.wait_all_tasks_blocked()
        assert scope.cancelled_caught
        other.execute("COMMIT")
        await writer.flush()
        await writer.aclose()
    other.close()
    assert [r.event.op_id for r in store.inner.read()] == ["abandoned"]


async def test_cancelling_the_writer_during_a_lock_wait_waits_for_the_thread_and_drains(store):
    """The thread owns a transaction once it runs: cancellation never abandons it, and what was
    queued behind it is committed (shielded) before the writer stops."""
    writer = JournalWriter(store, lock_wait_secs=60)
    other = hold_lock(store.inner.path)
    async with trio.open_nursery() as root:
        await root.start(writer.run)
        first = writer.append_nowait("control", outcome(op_id="first"))
        await wait_for(lambda: writer.lock_waits == 1)
        second = writer.append_nowait("control", outcome(op_id="second"))
        root.cancel_scope.cancel()
        with trio.CancelScope(shield=True):  # this body is cancelled too: look, then let go
            await trio.testing.wait_all_tasks_blocked()
        assert not first.done  # still waiting for the lock, not abandoned
        # Released from another thread, as the other process would.
        threading.Thread(target=other.execute, args=("COMMIT",)).start()
    other.close()
    assert (await first.wait()).seq == 1 and (await second.wait()).seq == 2
    with pytest.raises(JournalClosedError):
        writer.append_nowait("control", outcome(op_id="late"))
    assert [r.event.op_id for r in store.inner.read()] == ["first", "second"]


async def test_a_snapshot_in_the_thread_does_not_block_inline_commits(store):
    """The store's own lock, held by the writer's thread, is not waited for on the loop either."""
    writer = JournalWriter(store, lock_wait_secs=60)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.append("workers", registered("w1"))
        release = threading.Event()
        started = threading.Event()

        def slow_state() -> str:
            started.set()
            release.wait(30)
            return "{}"

        # The snapshot's encoder runs in the thread before the write: hold the store's lock
        # around it the way a slow snapshot write would.
        def save_with_lock_held() -> str:
            with store.inner._lock:
                return slow_state()

        nursery.start_soon(writer.save_snapshot, "fleet", 1, save_with_lock_held)
        await trio.to_thread.run_sync(started.wait)
        nursery.start_soon(writer.append, "workers", registered("w2"))
        await wait_for(lambda: writer.lock_waits == 1)  # busy store: handed to the thread
        release.set()
        await writer.flush()
        await writer.aclose()
    assert store.inner.count() == 2


async def test_commits_go_on_inline_while_a_checkpoint_runs(tmp_path):
    """A checkpoint (its fsyncs take milliseconds) runs in a thread of its own on a connection
    of its own: a batch arriving meanwhile commits inline at once. Before, the writer task awaited
    the checkpoint and it held the store's connection, so every such batch waited for it."""
    store = SqliteStore.open(tmp_path / "j.db")
    inside, release = threading.Event(), threading.Event()
    wal_size = store.wal_size

    def checkpoint_in_progress() -> int:  # called by checkpoint(), after its PASSIVE step
        inside.set()
        release.wait()
        return wal_size()

    store.wal_size = checkpoint_in_progress
    writer = JournalWriter(store, checkpoint_every=5)
    committed = []
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            for i in range(5):
                await writer.append("workers", registered(f"w{i}"))
            await trio.to_thread.run_sync(inside.wait)  # the checkpoint is under way

            async def more() -> None:
                for i in range(5, 8):
                    committed.append(await writer.append("workers", registered(f"w{i}")))

            nursery.start_soon(more)
            await trio.testing.wait_all_tasks_blocked()
            try:
                assert [r.seq for r in committed] == [6, 7, 8]  # while the checkpoint still runs
                assert writer.lock_waits == 0
            finally:
                release.set()
            await writer.aclose()
    finally:
        store.close()
    with SqliteStore.open(tmp_path / "j.db", readonly=True) as reader:
        assert reader.count() == 8 and reader.verify().ok


class TaskRecordingStore(ThreadRecordingStore):
    """Records which trio task ran each transaction."""

    def __init__(self, inner: SqliteStore) -> None:
        super().__init__(inner)
        self.tasks: list[object] = []

    def append_batch(self, items, *, wait=None):
        self.tasks.append(trio.lowlevel.current_task())
        return super().append_batch(items, wait=wait)


async def test_a_group_commits_in_the_appenders_task_while_the_writer_is_idle(tmp_path):
    """An operation's final group (outcomes, finish, audit) skips the hand-off to the writer task
    when that task is idle; with anything queued before it, it goes through the writer, in order
    (and joins the queued batch, as before)."""
    store = TaskRecordingStore(SqliteStore.open(tmp_path / "j.db"))
    writer = JournalWriter(store)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await trio.testing.wait_all_tasks_blocked()  # the writer is parked
            me = trio.lowlevel.current_task()
            group = [("workers", registered("w1")), ("workers", registered("w2"))]
            assert [r.seq for r in await writer.append_many(group)] == [1, 2]
            assert store.tasks == [me] and writer.commits == 1
            queued = writer.append_nowait("workers", registered("w3"))  # the writer is busy now
            later = [("workers", registered("w4")), ("workers", registered("w5"))]
            assert [r.seq for r in await writer.append_many(later)] == [4, 5]
            assert (await queued.wait()).seq == 3
            assert len(store.tasks) == 2 and store.tasks[1] is not me and writer.commits == 2
            await writer.aclose()
    finally:
        store.inner.close()
    with SqliteStore.open(tmp_path / "j.db", readonly=True) as reader:
        assert reader.count() == 5 and reader.verify().ok


async def test_an_event_enqueued_alone_commits_in_the_callers_task_while_the_writer_is_idle(tmp_path):
    """An operation's intent (``enqueue(alone=True)``) is durable when ``enqueue`` returns if the
    writer was idle; with anything queued before it, it is queued behind it, in order, and may
    share that batch (as every enqueue did before)."""
    store = TaskRecordingStore(SqliteStore.open(tmp_path / "j.db"))
    writer = JournalWriter(store)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await trio.testing.wait_all_tasks_blocked()  # the writer is parked
            me = trio.lowlevel.current_task()
            intent = await writer.enqueue("op:a", registered("w1"), alone=True)
            assert intent.done and store.tasks == [me] and writer.commits == 1
            assert (await intent.wait()).seq == 1
            queued = writer.append_nowait("workers", registered("w2"))  # the writer is busy now
            second = await writer.enqueue("op:b", registered("w3"), alone=True)
            assert not second.done  # queued behind w2, not committed ahead of it
            assert (await queued.wait()).seq == 2 and (await second.wait()).seq == 3
            assert len(store.tasks) == 2 and store.tasks[1] is not me and writer.commits == 2
            await writer.aclose()
    finally:
        store.inner.close()
    with SqliteStore.open(tmp_path / "j.db", readonly=True) as reader:
        assert reader.count() == 3 and reader.verify().ok

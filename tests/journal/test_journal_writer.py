"""JournalWriter: group commit, durability on return, failures, cancellation, shutdown.

No wall-clock assertions: ordering is driven with trio.testing.wait_all_tasks_blocked and a gate
that holds the writer thread inside append_batch.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Sequence

import pytest
import trio
import trio.lowlevel
import trio.testing
from journal_helpers import outcome, registered

from journal import (
    Append,
    JournalClosedError,
    JournalFullError,
    JournalWriteError,
    JournalWriter,
    MemoryStore,
    ProjectionError,
    Recorded,
    SqliteStore,
)
from smgrl.events import WorkerProbeFailed


class CountingStore:
    """Delegates to a store and records every append_batch: one call = one transaction."""

    def __init__(self, inner):
        self.inner = inner
        self.batches: list[int] = []

    def append_batch(self, items: Sequence[Append], *, wait: float | None = None) -> list[Recorded]:
        self.batches.append(len(items))
        return self.inner.append_batch(items, wait=wait)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class GatedStore(CountingStore):
    """Holds the writer thread inside append_batch until the test opens the gate.

    It blocks a thread, so it forces the writer's thread mode (``commits_are_cheap = False``):
    an inline commit would block the event loop itself."""

    commits_are_cheap = False

    def __init__(self, inner):
        super().__init__(inner)
        self.gate = threading.Event()

    def append_batch(self, items, *, wait=None):
        # The timeout only stops a failing test from hanging forever; nothing asserts on time.
        if not self.gate.wait(timeout=10):
            raise RuntimeError("gate never opened")
        return super().append_batch(items, wait=wait)


class FlakyStore(CountingStore):
    """Fails the next ``fail_next`` batches as a full disk would."""

    def __init__(self, inner):
        super().__init__(inner)
        self.fail_next = 0

    def append_batch(self, items, *, wait=None):
        if self.fail_next:
            self.fail_next -= 1
            self.batches.append(len(items))
            raise sqlite3.OperationalError("database or disk is full")
        return super().append_batch(items, wait=wait)


async def test_concurrent_appends_share_transactions():
    store = CountingStore(MemoryStore())
    writer = JournalWriter(store)
    results: list[Recorded] = []

    async def one(i: int) -> None:
        results.append(await writer.append("control", outcome(op_id=f"op{i}")))

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        async with trio.open_nursery() as appenders:
            for i in range(200):
                appenders.start_soon(one, i)
        await writer.aclose()
    assert sorted(r.seq for r in results) == list(range(1, 201))
    assert sum(store.batches) == 200
    assert len(store.batches) < 200  # group commit: far fewer transactions than appends
    assert store.verify().ok


async def test_max_batch_bounds_transactions():
    store = CountingStore(MemoryStore())
    writer = JournalWriter(store, max_batch=10)
    pendings = [writer.append_nowait("control", outcome(op_id=f"op{i}")) for i in range(35)]
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.flush()
        await writer.aclose()
    assert store.batches == [10, 10, 10, 5]
    assert [(await p.wait()).seq for p in pendings] == list(range(1, 36))


async def test_append_returns_only_after_commit(tmp_path):
    path = tmp_path / "j.db"
    store = GatedStore(SqliteStore.open(path))
    writer = JournalWriter(store)
    reader = SqliteStore.open(path, readonly=True)
    got: list[Recorded] = []

    async def appender() -> None:
        got.append(await writer.append("workers", registered("w1"), secrets={"w1": "k"}))

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        nursery.start_soon(appender)
        await trio.testing.wait_all_tasks_blocked()
        # The batch is inside append_batch, held by the gate: append has not returned.
        assert got == []
        assert reader.count() == 0
        store.gate.set()
        while not got:
            await trio.testing.wait_all_tasks_blocked()
            await trio.lowlevel.checkpoint()
        # When append returns, a second connection already sees the row: it is committed.
        assert [r.seq for r in reader.read()] == [1]
        assert reader.secrets() == {"w1": "k"}
        await writer.aclose()
    reader.close()
    store.inner.close()


async def test_append_nowait_preserves_order(tmp_path):
    store = SqliteStore.open(tmp_path / "j.db")
    writer = JournalWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        early = [writer.append_nowait("control", outcome(op_id=f"op{i}")) for i in range(5)]
        last = await writer.append("control", outcome(op_id="last"))
        # A later awaited append implies the earlier ones are durable.
        assert all(p.done for p in early)
        assert [(await p.wait()).seq for p in early] == [1, 2, 3, 4, 5]
        assert last.seq == 6
        await writer.aclose()
    with SqliteStore.open(tmp_path / "j.db", readonly=True) as ro:
        assert [r.event.op_id for r in ro.read()] == ["op0", "op1", "op2", "op3", "op4", "last"]
    store.close()


async def test_failed_batch_reaches_every_waiter_and_the_writer_recovers():
    store = FlakyStore(MemoryStore())
    writer = JournalWriter(store)
    errors: list[BaseException] = []

    async def doomed(i: int) -> None:
        try:
            await writer.append("control", outcome(op_id=f"lost{i}"))
        except JournalWriteError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        first = await writer.append("control", outcome(op_id="kept"))
        store.fail_next = 1
        async with trio.open_nursery() as appenders:
            for i in range(5):
                appenders.start_soon(doomed, i)
        assert len(errors) == 5
        assert all(e.code == "journal_unavailable" for e in errors)
        assert all(isinstance(e.__cause__, sqlite3.OperationalError) for e in errors)
        assert len({id(e) for e in errors}) == 5  # one exception object per waiter
        # Recovery: the next batch commits right after the last good one.
        after = await writer.append("control", outcome(op_id="after"))
        await writer.aclose()
    assert (first.seq, after.seq) == (1, 2)
    assert [r.event.op_id for r in store.read()] == ["kept", "after"]
    assert store.verify().ok


async def test_real_disk_full_then_space_returns(tmp_path):
    store = SqliteStore.open(tmp_path / "j.db")
    writer = JournalWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.append("control", outcome(op_id="a"))
        pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
        store._conn.execute(f"PRAGMA max_page_count = {pages}")
        big = outcome(op_id="b" * 200_000)
        with pytest.raises(JournalWriteError) as info:
            await writer.append("control", big)
        assert info.value.code == "journal_unavailable"
        store._conn.execute("PRAGMA max_page_count = 1073741823")
        assert (await writer.append("control", big)).seq == 2
        await writer.aclose()
    assert store.verify().ok
    store.close()


async def test_cancelled_waiter_does_not_withdraw_its_event():
    store = GatedStore(MemoryStore())
    writer = JournalWriter(store)
    scope = trio.CancelScope()
    outcomes: list[str] = []

    async def impatient_appender() -> None:
        with scope:
            await writer.append("control", outcome(op_id="abandoned"))
        outcomes.append("cancelled" if scope.cancelled_caught else "returned")

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.append_nowait("control", outcome(op_id="first"))
        await trio.testing.wait_all_tasks_blocked()  # "first" is held in the thread by the gate
        nursery.start_soon(impatient_appender)
        await trio.testing.wait_all_tasks_blocked()  # "abandoned" is queued, its caller waits
        scope.cancel()  # the caller gives up while its event is queued
        await trio.testing.wait_all_tasks_blocked()
        assert outcomes == ["cancelled"]
        store.gate.set()
        await writer.flush()
        await writer.aclose()
    assert [r.event.op_id for r in store.read()] == ["first", "abandoned"]


async def test_already_cancelled_append_writes_nothing():
    store = MemoryStore()
    writer = JournalWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        with trio.CancelScope() as scope:
            scope.cancel()
            await writer.append("control", outcome(op_id="never"))
        await writer.append("control", outcome(op_id="yes"))
        await writer.aclose()
    assert [r.event.op_id for r in store.read()] == ["yes"]


async def test_aclose_drains_then_refuses():
    store = GatedStore(MemoryStore())
    writer = JournalWriter(store, max_batch=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        pendings = [writer.append_nowait("control", outcome(op_id=f"op{i}")) for i in range(10)]
        await trio.testing.wait_all_tasks_blocked()
        store.gate.set()
        await writer.aclose()
        assert all(p.done for p in pendings)
        with pytest.raises(JournalClosedError):
            writer.append_nowait("control", outcome())
        with pytest.raises(JournalClosedError):
            await writer.append("control", outcome())
        await writer.aclose()  # idempotent
    assert store.count() == 10
    assert [(await p.wait()).seq for p in pendings] == list(range(1, 11))


async def test_cancelling_the_writer_task_still_commits_the_queue():
    store = GatedStore(MemoryStore())
    writer = JournalWriter(store, max_batch=3)
    async with trio.open_nursery() as outer:
        root = trio.CancelScope()

        async def gateway_root() -> None:
            with root:
                async with trio.open_nursery() as nursery:
                    await nursery.start(writer.run)
                    await trio.sleep_forever()

        outer.start_soon(gateway_root)
        await trio.testing.wait_all_tasks_blocked()
        pendings = [writer.append_nowait("control", outcome(op_id=f"op{i}")) for i in range(7)]
        await trio.testing.wait_all_tasks_blocked()  # the first batch is held in the thread
        root.cancel()  # e.g. Ctrl-C: the root nursery is cancelled with events still queued
        await trio.testing.wait_all_tasks_blocked()
        # The in-flight batch is not abandoned (its thread holds a write transaction): the
        # writer notices the cancellation once it returns, then drains the queue, shielded.
        late = writer.append_nowait("control", outcome(op_id="late"))
        store.gate.set()
    assert [(await p.wait()).seq for p in [*pendings, late]] == list(range(1, 9))
    assert store.batches == [3, 3, 2]
    with pytest.raises(JournalClosedError):
        writer.append_nowait("control", outcome())


async def test_aclose_without_run_commits_inline():
    store = MemoryStore()
    writer = JournalWriter(store)
    pending = writer.append_nowait("control", outcome())
    await writer.aclose()
    assert (await pending.wait()).seq == 1
    with pytest.raises(RuntimeError):
        await writer.run()


async def test_backpressure_waits_for_room():
    store = GatedStore(MemoryStore())
    writer = JournalWriter(store, max_batch=2, max_queue=4)
    done: list[int] = []

    async def appender() -> None:
        done.append((await writer.append("control", outcome(op_id="late"))).seq)

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(2):  # these 2 go to the thread, which holds them at the gate
            writer.append_nowait("control", outcome(op_id=f"op{i}"))
        await trio.testing.wait_all_tasks_blocked()
        for i in range(2, 6):  # 4 queued: the queue is full
            writer.append_nowait("control", outcome(op_id=f"op{i}"))
        # append_nowait does not bypass the bound: it refuses instead of growing the queue.
        with pytest.raises(JournalFullError):
            writer.append_nowait("control", outcome(op_id="one too many"))
        nursery.start_soon(appender)
        await trio.testing.wait_all_tasks_blocked()
        assert writer._queued == 4  # the appender waits for room, not yet enqueued
        store.gate.set()
        await writer.flush()
        await trio.testing.wait_all_tasks_blocked()
        await writer.flush()
        await writer.aclose()
    assert done == [7]


async def test_bad_event_fails_in_the_caller_not_the_batch():
    store = CountingStore(MemoryStore())
    writer = JournalWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        ok = writer.append_nowait("workers", registered("w1"))
        with pytest.raises(ValueError):
            await writer.append(
                "workers", WorkerProbeFailed(worker_id="w1", attempt=1, error="x", next_retry_s=math.inf)
            )
        await writer.flush()
        assert (await ok.wait()).seq == 1
        await writer.aclose()
    assert store.count() == 1


async def test_flush_reports_a_failed_last_batch():
    store = FlakyStore(MemoryStore())
    writer = JournalWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.flush()  # nothing queued: returns at once
        store.fail_next = 1
        pending = writer.append_nowait("control", outcome())
        with pytest.raises(JournalWriteError):
            await writer.flush()
        with pytest.raises(JournalWriteError):
            await pending.wait()
        await writer.aclose()


async def test_on_commit_sees_each_batch_before_its_appenders_wake():
    seen: list[int] = []
    observed_by_appender: list[list[int]] = []

    def on_commit(records: list[Recorded]) -> None:
        seen.extend(r.seq for r in records)

    store = MemoryStore()
    writer = JournalWriter(store, on_commit=on_commit, max_batch=4)

    async def appender(i: int) -> None:
        rec = await writer.append("control", outcome(op_id=f"op{i}"))
        assert rec.seq in seen  # the projection already holds this event
        observed_by_appender.append(list(seen))

    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        async with trio.open_nursery() as appenders:
            for i in range(10):
                appenders.start_soon(appender, i)
        await writer.aclose()
    assert seen == list(range(1, 11))  # every batch, in commit order
    assert len(observed_by_appender) == 10


async def test_a_failing_projection_stops_the_writer(caplog):
    """Fail-stop: a batch that committed but could not be applied to memory is reported to its
    appenders, nothing after it is committed, and run() raises (the gateway stops with it)."""
    calls = []

    def broken(records: list[Recorded]) -> None:
        calls.append([r.seq for r in records])
        if len(calls) == 2:
            raise RuntimeError("projection bug")

    store = MemoryStore()
    writer = JournalWriter(store, on_commit=broken)
    with pytest.raises(ExceptionGroup) as raised:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            assert (await writer.append("control", outcome(op_id="a"))).seq == 1
            with pytest.raises(ProjectionError):
                await writer.append("control", outcome(op_id="b"))  # committed, not applied
            await trio.sleep_forever()  # the writer's failure cancels this nursery
    failures = raised.value.subgroup(ProjectionError).exceptions
    assert "events 2-2" in str(failures[0])
    with pytest.raises(JournalClosedError):
        writer.append_nowait("control", outcome(op_id="c"))  # nothing more is accepted
    assert calls == [[1], [2]]
    assert store.count() == 2  # the journal keeps what committed; a restart replays it
    assert "applying journal events 2-2 to memory failed" in caplog.text


async def test_secrets_reach_on_secrets_before_the_appender_wakes():
    seen: list[dict] = []
    store = MemoryStore()
    writer = JournalWriter(store, on_secrets=seen.append)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        await writer.append("workers", registered("w1"), secrets={"w1": "k1"})
        assert seen == [{"w1": "k1"}]
        await writer.append("workers", registered("w2"))  # no secrets: no call
        await writer.append("workers", registered("w1"), secrets={"w1": None})
        await writer.aclose()
    assert seen == [{"w1": "k1"}, {"w1": None}]


class CheckpointCountingStore(CountingStore):
    def __init__(self, inner):
        super().__init__(inner)
        self.checkpoints = 0
        self.threads: set[str] = set()

    def checkpoint(self):
        self.threads.add(threading.current_thread().name)
        self.checkpoints += 1
        self.inner.checkpoint()


async def test_cheap_stores_commit_inline_and_checkpoint_in_a_thread(tmp_path):
    store = CheckpointCountingStore(SqliteStore.open(tmp_path / "j.db"))
    assert store.commits_are_cheap  # WAL + synchronous=NORMAL
    writer = JournalWriter(store, checkpoint_every=10)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(25):
            await writer.append("workers", registered(f"w{i}"))
        await writer.aclose()
    assert sum(store.batches) == 25
    assert store.checkpoints == 2  # after 10 and 20 committed events
    assert threading.main_thread().name not in store.threads
    with SqliteStore.open(tmp_path / "j.db", readonly=True) as reader:
        assert reader.count() == 25 and reader.verify().ok
    store.inner.close()


def test_full_sync_stores_are_not_committed_inline(tmp_path):
    full = SqliteStore.open(tmp_path / "f.db", synchronous="FULL")
    normal = SqliteStore.open(tmp_path / "n.db")
    try:
        assert not full.commits_are_cheap and normal.commits_are_cheap
        assert MemoryStore().commits_are_cheap
        assert not JournalWriter(full)._inline and JournalWriter(normal)._inline
        assert not JournalWriter(normal, inline=False)._inline
    finally:
        full.close()
        normal.close()


async def test_append_many_is_one_transaction_never_split_nor_joined():
    store = CountingStore(MemoryStore())
    writer = JournalWriter(store, max_batch=4)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.append_nowait("control", outcome(op_id="before"))
        group = [("control", outcome(op_id=f"g{i}")) for i in range(6)]  # larger than max_batch
        nursery.start_soon(writer.append_many, group)
        await trio.testing.wait_all_tasks_blocked()
        writer.append_nowait("control", outcome(op_id="after"))
        await writer.flush()
        await writer.aclose()
    # The group did not join the open batch (it would not fit) and nothing joined it.
    assert store.batches == [1, 6, 1]
    assert [r.event.op_id for r in store.read()] == ["before"] + [f"g{i}" for i in range(6)] + ["after"]

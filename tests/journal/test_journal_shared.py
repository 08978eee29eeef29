"""Several writers on one journal (docs/journal.md, "Several writers"): conditional append,
leases, change tokens, on every store; and real processes appending to one SQLite file or one
PostgreSQL schema at once, a SIGKILLed lease holder, the tail's wake-up."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import trio
import trio.lowlevel
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from journal_helpers import FakeClock, a_few, outcome, registered

from journal import (
    Append,
    ChangeWatcher,
    Expect,
    JournalConflict,
    JournalWriter,
    LeaseLost,
    MemoryStore,
    open_store,
)

STREAMS = ("workers", "op:a", "op:b")
TYPES = ("worker.registered", "control.outcome")


def _event(stream: str, type_: str):
    return registered("w1") if type_ == "worker.registered" else outcome(op_id=stream)


class TestConditionalAppend:
    def test_the_whole_journal_head(self, backend):
        store = backend.store
        store.append_batch(a_few(3))
        (rec,) = store.append_batch(a_few(1), expect=Expect(after=3))
        assert rec.seq == 4
        with pytest.raises(JournalConflict) as conflict:
            store.append_batch(a_few(1), expect=Expect(after=3))  # decided at 3, the head is 4 now
        assert (conflict.value.head, conflict.value.seq, conflict.value.code) == (4, 4, "journal_conflict")
        assert store.last_seq() == 4  # nothing written
        with pytest.raises(JournalConflict):
            store.append_batch(a_few(1), expect=Expect(after=9))  # a position beyond the head
        assert store.verify().ok

    def test_only_matching_events_conflict(self, backend):
        store = backend.store
        store.append_batch([Append("op:a", outcome("op:a")), Append("workers", registered("w1"))])
        # Decided on "op:a" at seq 1: an unrelated worker event since then does not conflict.
        store.append_batch(
            a_few(1, "op:a"), expect=Expect(after=1, streams=["op:a"], types=["control.outcome"])
        )
        with pytest.raises(JournalConflict) as conflict:
            store.append_batch(a_few(1), expect=Expect(after=2, types=["control.outcome"], streams="op:a"))
        assert conflict.value.seq == 3 and conflict.value.head == 3
        store.append_batch(a_few(1), expect=Expect(after=2, types=["worker.registered"]))
        assert store.count() == 4 and store.verify().ok

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        batch=st.lists(st.tuples(st.sampled_from(STREAMS), st.sampled_from(TYPES)), min_size=0, max_size=6),
        back=st.integers(0, 8),
        streams=st.none() | st.lists(st.sampled_from(STREAMS), max_size=2),
        types=st.none() | st.lists(st.sampled_from(TYPES), max_size=2),
    )
    def test_property_appends_iff_nothing_matching_came_after(self, backend, batch, back, streams, types):
        store = backend.store
        store.append_batch([Append(s, _event(s, t)) for s, t in batch])
        head = store.last_seq()
        after = max(0, head - back)
        model_conflict = any(
            (streams is None or r.stream in streams) and (types is None or r.event.TYPE in types)
            for r in store.read(after_seq=after)
        )
        try:
            store.append_batch(a_few(1, "op:z"), expect=Expect(after=after, types=types, streams=streams))
        except JournalConflict as exc:
            assert model_conflict
            assert exc.head == head and store.last_seq() == head
        else:
            assert not model_conflict
            assert store.last_seq() == head + 1


class TestLeases:
    def test_take_renew_release(self, backend):
        store = backend.store
        first = store.take_lease("health", "p1", 30)
        assert (first.holder, first.epoch) == ("p1", 1)
        assert store.take_lease("health", "p2", 30) is None  # live lease of another holder
        again = store.take_lease("health", "p1", 30)  # the holder taking it again renews it
        assert (again.holder, again.epoch) == ("p1", 1) and again.expires >= first.expires
        assert store.renew_lease("health", "p1", 30).holder == "p1"
        with pytest.raises(LeaseLost):
            store.renew_lease("health", "p2", 30)
        assert store.release_lease("health", "p2") is False
        assert store.release_lease("health", "p1") is True
        taken = store.take_lease("health", "p2", 30)  # released: anyone takes it at once
        assert (taken.holder, taken.epoch) == ("p2", 2)
        assert store.lease("health") == taken
        assert store.take_lease("discovery", "p1", 30).epoch == 1  # leases are independent
        with pytest.raises(ValueError):
            store.take_lease("health", "p1", 0)

    def test_taken_over_after_expiry(self, backend):
        store = backend.store
        clock = FakeClock(1000.0)
        if backend.name == "postgres":
            ttl = 0.3  # the server's clock decides: wait for it, bounded
        else:
            backend.set_clock(clock)
            ttl = 5.0
        first = store.take_lease("snapshots", "p1", ttl)
        assert store.take_lease("snapshots", "p2", ttl) is None
        clock.now += 5.5
        taken = _take_within(store, "snapshots", "p2", ttl, deadline=10)
        assert (taken.holder, taken.epoch) == ("p2", first.epoch + 1)
        with pytest.raises(LeaseLost):
            store.renew_lease("snapshots", "p1", ttl)  # the old holder learns it lost the duty


def test_secret_changes_tell_followers_of_sets_and_deletions(backend):
    store = backend.store
    store.append_batch([Append("workers", registered("w1"), {"w1": "k1"})])  # seq 1
    store.append_batch([Append("workers", registered("w2"), {"w2": "k2"})])  # seq 2
    store.append_batch([Append("workers", registered("w1"), {"w1": None})])  # seq 3: deleted
    assert store.secret_changes(0, 3) == {"w1": None, "w2": "k2"}
    assert store.secret_changes(1, 2) == {"w2": "k2"}
    assert store.secret_changes(0, 1) == {}  # w1's row moved on to seq 3
    assert store.secrets() == {"w2": "k2"} and store.get_secret("w1") is None
    with pytest.raises(ValueError, match="non-empty"):
        Append("workers", registered("w3"), {"w3": ""})  # '' is the tombstone, never a key


class TestChangeToken:
    def test_changes_when_another_connection_commits(self, backend):
        store = backend.store
        reader = backend.readonly()
        try:
            before = reader.change_token()
            assert reader.change_token() == before  # nothing committed: stable
            store.append_batch(a_few(1))
            _until(lambda: reader.change_token() != before, deadline=10)
        finally:
            reader.close()


async def test_the_watcher_wakes_on_another_connections_commit_and_on_poke(backend):
    store = backend.store
    reader = backend.readonly()
    watcher = ChangeWatcher(reader, interval=0.005 if backend.name != "postgres" else 3600)
    try:
        token = reader.change_token()
        # PostgreSQL with an hour-long poll interval: only its LISTEN notification can wake it.
        threading.Timer(0.05, lambda: store.append_batch(a_few(2))).start()
        with trio.fail_after(20):
            token = await watcher.wait(token)
            while reader.last_seq() < 2:  # the token may move before the rows are visible
                token = await watcher.wait(token)
        assert [r.seq for r in reader.read(after_seq=0)] == [1, 2]
        # poke() wakes a waiter at once, whatever the interval.
        local = MemoryStore()
        slow = ChangeWatcher(local, interval=3600)
        start = local.change_token()
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def waiter() -> None:
                await slow.wait(start)
                done.set()

            nursery.start_soon(waiter)
            await trio.testing.wait_all_tasks_blocked()
            local.append_batch(a_few(1))  # a local commit, then the appender's poke
            slow.poke()
            with trio.fail_after(5):
                await done.wait()
    finally:
        watcher.close()
        reader.close()


async def test_writer_append_if_refuses_only_its_group():
    store = MemoryStore()
    writer = JournalWriter(store)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        first = await writer.append("op:a", outcome("op:a"))
        await writer.append_if(Expect(after=first.seq, streams="op:b"), [("op:b", outcome("op:b"))])
        other = writer.append_nowait("workers", registered("w1"))  # queued alongside
        with pytest.raises(JournalConflict) as conflict:
            await writer.append_if(Expect(after=first.seq, streams="op:b"), [("op:b", outcome("op:b"))])
        assert conflict.value.head == 3
        assert (await other.wait()).seq == 3  # the unconditional append went through
        await writer.flush()  # a refused group is no journal failure
        await writer.aclose()
    assert store.count() == 3 and store.verify().ok


# -- real processes ---------------------------------------------------------------------------------

APPENDER = textwrap.dedent(
    """
    import sys, time
    from journal import Append, open_store
    from smgrl.events import ControlOutcome
    target, name, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    store = open_store(target)
    print("ready", flush=True)
    sys.stdin.readline()  # start together
    others = sys.argv[5:]  # the second half waits until the others appended: they surely overlap
    for b in range(batches):
        if others and b == batches // 2:
            end = time.monotonic() + 60
            while not any(True for _ in store.read(stream=others[0], limit=1)):
                assert time.monotonic() < end, "the other appender never started"
                time.sleep(0.001)
        store.append_batch([
            Append(name, ControlOutcome(op_id=f"{name}-{b}-{i}", worker_id="w", url="http://w",
                   status=200, latency_ms=1, excerpt="ok"))
            for i in range(size)
        ], wait=30)
    store.close()
    print("done", flush=True)
    """
)

LEASE_HOLDER = textwrap.dedent(
    """
    import sys, time
    from journal import open_store
    store = open_store(sys.argv[1])
    assert store.take_lease("health", "child", float(sys.argv[2])) is not None
    print("took", flush=True)
    time.sleep(120)
    """
)


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return request.getfixturevalue("pg_url")
    return str(tmp_path / "journal.db")


def _child(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def _kill(child: subprocess.Popen) -> None:
    if child.poll() is None:
        os.kill(child.pid, signal.SIGKILL)
    child.wait(10)


@pytest.mark.e2e
def test_two_processes_appending_at_once_keep_one_chain(target):
    open_store(target).close()  # created (and migrated) once, before the race
    batches, size = 200, 3
    children = [_child(APPENDER, target, f"p{i}", str(batches), str(size), f"p{1 - i}") for i in range(2)]
    try:
        for child in children:
            assert child.stdout.readline().strip() == "ready"
        for child in children:
            child.stdin.write("go\n")
            child.stdin.flush()
        for child in children:
            assert child.stdout.readline().strip() == "done"
            assert child.wait(60) == 0
    finally:
        for child in children:
            _kill(child)
    store = open_store(target)
    try:
        records = list(store.read())
        assert [r.seq for r in records] == list(range(1, 2 * batches * size + 1))  # no gap, no dup
        report = store.verify()
        assert report.ok and report.checked == 2 * batches * size, report
        # Each batch stayed contiguous, and the two processes really interleaved (each one's second
        # half started after the other had appended).
        streams = [r.stream for r in records]
        assert all(len(set(streams[i : i + size])) == 1 for i in range(0, len(streams), size))
        assert sum(1 for a, b in itertools.pairwise(streams) if a != b) > 1
    finally:
        store.close()


@pytest.mark.e2e
def test_a_sigkilled_holders_lease_is_taken_over_after_expiry(target):
    open_store(target).close()
    ttl = 1.0
    child = _child(LEASE_HOLDER, target, str(ttl))
    store = open_store(target)
    try:
        assert child.stdout.readline().strip() == "took"
        assert store.take_lease("health", "survivor", ttl) is None  # the child holds it
        os.kill(child.pid, signal.SIGKILL)  # no release: the lease must expire
        child.wait(10)
        taken = _take_within(store, "health", "survivor", ttl, deadline=15)
        assert (taken.holder, taken.epoch) == ("survivor", 2)
    finally:
        _kill(child)
        store.close()


@pytest.mark.e2e
async def test_a_tail_sees_another_process_append(target):
    open_store(target).close()
    store = open_store(target, readonly=True)
    watcher = ChangeWatcher(store)
    child = _child(APPENDER, target, "other", "1", "2")
    try:
        token = store.change_token()
        assert (await trio.to_thread.run_sync(child.stdout.readline)).strip() == "ready"
        child.stdin.write("go\n")
        child.stdin.flush()
        with trio.fail_after(20):
            while store.last_seq() < 2:
                token = await watcher.wait(token)
        assert [r.stream for r in store.read()] == ["other", "other"]
    finally:
        watcher.close()
        _kill(child)
        store.close()


def _take_within(store, name: str, holder: str, ttl: float, *, deadline: float):
    end = time.monotonic() + deadline
    while True:
        lease = store.take_lease(name, holder, ttl)
        if lease is not None or time.monotonic() > end:
            assert lease is not None, f"{holder} could not take {name} within {deadline} s"
            return lease
        time.sleep(0.05)  # bounded poll: the holder's expiry is on the store's clock


def _until(predicate, *, deadline: float) -> None:
    end = time.monotonic() + deadline
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.01)


async def test_writers_sharing_a_journal_feed_every_event_in_order(target):
    # Two writers on two connections (as two gateway processes would have): each projection
    # receives every event once, in seq order - its own from the commit path, the other's from
    # the commit path's gap read or from follow() - and appenders see their own writes applied.
    stores = [open_store(target), open_store(target)]
    seen: list[list[int]] = [[], []]
    rings: list[dict[str, str]] = [{}, {}]  # each process's key ring, fed by on_secrets
    complete = [trio.Event(), trio.Event()]
    writers = [JournalWriter(store) for store in stores]

    def apply(i: int, records) -> None:
        seen[i].extend(r.seq for r in records)
        if len(seen[i]) >= 60:
            complete[i].set()

    def keys(i: int, changes) -> None:
        for worker_id, key in changes.items():
            if key is None:
                rings[i].pop(worker_id, None)
            else:
                rings[i][worker_id] = key

    for i, writer in enumerate(writers):
        writer.position = 0
        writer.on_commit = lambda records, i=i: apply(i, records)
        writer.on_secrets = lambda changes, i=i: keys(i, changes)
    try:
        async with trio.open_nursery() as nursery:
            for writer, store in zip(writers, stores, strict=True):
                await nursery.start(writer.run)
                await nursery.start(writer.follow, ChangeWatcher(store))

            async def appender(i: int) -> None:
                for n in range(30):
                    # Keys set, replaced and deleted by one process reach the other's ring.
                    secrets = {5: {f"w{i}": f"k{i}"}, 12: {"gone": "x"}, 20: {f"w{i}": f"k{i}b"}}.get(n)
                    if n == 25:
                        secrets = {"gone": None}
                    rec = await writers[i].append(f"p{i}", outcome(op_id=f"p{i}-{n}"), secrets=secrets)
                    assert seen[i][-1] >= rec.seq  # read-your-writes: applied before append returns
                    if n % 7 == 0:
                        await trio.lowlevel.checkpoint()

            async with trio.open_nursery() as inner:
                inner.start_soon(appender, 0)
                inner.start_soon(appender, 1)
            with trio.fail_after(20):  # follow() delivers the other's last events
                for event in complete:
                    await event.wait()
            nursery.cancel_scope.cancel()
        final_keys = stores[0].secrets()
    finally:
        for store in stores:
            store.close()
    assert seen[0] == seen[1] == list(range(1, 61))
    assert rings[0] == rings[1] == final_keys == {"w0": "k0b", "w1": "k1b"}

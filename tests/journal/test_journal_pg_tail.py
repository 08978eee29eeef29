"""The PostgreSQL tail cache (journal/postgres.py, ``PgStore.recent``): the LISTEN thread reads
what a notification announces before the change token moves, and the process's own appends
extend the cache, so the tail (``JournalWriter.follow``) needs no query and no thread hop. The
cache must never answer wrongly: what it returns equals what the store reads, and it answers
None (the caller reads the store) for any position it does not cover. A real server."""

from __future__ import annotations

import threading

import pytest
import trio
from journal_helpers import outcome, registered, started

from journal import Append, ChangeWatcher, JournalWriter
from journal._pg_tail import _notify_payload, _rows_of
from journal.postgres import PgStore

pytestmark = pytest.mark.usefixtures("pg_server")


def _listening(url: str) -> tuple[PgStore, threading.Event]:
    """A store whose LISTEN thread runs, and an event set at every notified commit."""
    store = PgStore.open(url)
    notified = threading.Event()
    store.add_listener(notified.set)
    return store, notified


def _same(got, store: PgStore, after: int) -> None:
    records, keys = got
    expected = list(store.read(after_seq=after))
    assert records == expected  # seq, ts, stream, event and hash
    head = store.last_seq()
    assert keys == (store.secret_changes(after, head) if head > after else {})


def _wait_for(store: PgStore, notified: threading.Event, seq: int) -> None:
    """Until the cache holds ``seq`` (each notification sets ``notified``; bounded)."""
    for _ in range(50):
        got = store.recent(seq - 1)
        if got is not None and got[0] and got[0][-1].seq >= seq:
            return
        notified.wait(timeout=0.2)
        notified.clear()
    raise AssertionError(f"the tail cache never held seq {seq}")


def test_the_cache_holds_the_other_connections_events_and_keys_once_notified(pg_url):
    follower, notified = _listening(pg_url)
    other = PgStore.open(pg_url)
    try:
        assert follower.recent(0) == ([], {})  # an empty journal: the cache starts at the head
        other.append_batch([Append("workers", registered("w1"), {"w1": "k1"})])  # 1
        other.append_batch(
            [Append("op:a", outcome("op:a")), Append("workers", registered("w2"), {"w2": "k2"})]
        )
        other.append_batch([Append("workers", registered("w1"), {"w1": None})])  # 4: w1's key deleted
        _wait_for(follower, notified, 4)
        for after in range(5):  # every position inside the cache answers what the store reads
            _same(follower.recent(after), follower, after)
        assert follower.recent(0)[1] == {"w1": None, "w2": "k2"}
        assert follower.recent(5) is None  # beyond what it has seen: read the store
    finally:
        other.close()
        follower.close()


def test_own_appends_are_in_the_cache_without_a_notification(pg_url):
    store, _ = _listening(pg_url)
    try:
        start = store.last_seq()
        recorded = store.append_batch([Append("workers", registered("w9"), {"w9": "k9"})])
        # Right after the commit, before any notification could be handled.
        records, keys = store.recent(start)
        assert [r.seq for r in records] == [r.seq for r in recorded] and keys == {"w9": "k9"}
    finally:
        store.close()


def test_a_burst_larger_than_the_cache_is_left_to_the_store_read(pg_url):
    follower, notified = _listening(pg_url)
    follower.recent_limit = 8
    other = PgStore.open(pg_url)
    try:
        # Too large to travel in the notification (bodies): the listener reads it, finds more
        # than the cache keeps, and restarts the cache at the head.
        other.append_batch([Append("op:a", started(f"op{i}", body=b"x" * 600)) for i in range(20)])
        for _ in range(50):  # until the burst's notification restarted the cache at its head
            if follower.recent(20) is not None:
                break
            notified.wait(timeout=0.2)
            notified.clear()
        assert follower.recent(20) == ([], {})
        other.append_batch([Append("op:a", outcome("after"))])  # 21: read into the restarted cache
        _wait_for(follower, notified, 21)
        assert follower.recent(0) is None and follower.recent(19) is None  # the burst: not cached
        _same(follower.recent(20), follower, 20)
        # Own appends far past the limit: the cache keeps the newest (between limit and twice
        # it), and answers exactly for each position it covers, None for the others.
        for i in range(20):
            follower.append_batch([Append("op:b", outcome(f"b{i}"))])
        head = follower.last_seq()
        covered = [after for after in range(head + 2) if follower.recent(after) is not None]
        assert covered == list(range(head - len(covered) + 1, head + 1))
        assert 8 < len(covered) <= 17
        for after in covered:
            _same(follower.recent(after), follower, after)
    finally:
        other.close()
        follower.close()


async def test_follow_applies_the_other_writers_events_from_the_cache(pg_url):
    # The tail takes the events from the cache: its writer's thread never reads the store.
    follower = PgStore.open(pg_url)
    other = PgStore.open(pg_url)
    writer = JournalWriter(follower)
    writer.position = 0
    seen: list[int] = []
    keys: dict[str, str | None] = {}
    done = trio.Event()
    reads_in_threads = []
    read = follower.read

    def counted_read(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            reads_in_threads.append(kwargs)
        return read(*args, **kwargs)

    follower.read = counted_read  # the real read, counted (the thread that runs it is what we check)

    def apply(records) -> None:
        seen.extend(r.seq for r in records)
        if seen and seen[-1] >= 12:
            done.set()

    writer.on_commit = apply
    writer.on_secrets = keys.update
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            await nursery.start(writer.follow, ChangeWatcher(follower))
            reads_in_threads.clear()  # follow's first catch-up reads the store: not the tail's path
            for i in range(12):
                secrets = {"w": f"k{i}"} if i % 5 == 0 else None
                await trio.to_thread.run_sync(
                    lambda i=i, secrets=secrets: other.append_batch(
                        [Append("op:x", outcome(f"x{i}"), secrets)]
                    )
                )
            with trio.fail_after(20):
                await done.wait()
            nursery.cancel_scope.cancel()
    finally:
        other.close()
        follower.close()
    assert seen == list(range(1, 13)) and keys == {"w": "k10"}
    assert reads_in_threads == []


def _rows(n: int, size: int = 10) -> list[tuple]:
    return [
        (s, 1.5 + s, "op:a", "control.outcome", 1, "x" * size, f"prev{s}", f"hash{s}")
        for s in range(3, 3 + n)
    ]


@pytest.mark.parametrize(
    ("rows", "secret_ops", "carried"),
    [
        (_rows(1), [], True),  # a small batch: its events travel in the notification
        (_rows(3), [], True),
        (_rows(3), [("w1", "k", 4)], False),  # sets a key: keys never travel, the seq does
        (_rows(1, 2000), [], False),  # past the 1,000 bytes a notification may carry: the seq
        (_rows(8, 100), [], False),
    ],
)
def test_what_a_notification_carries(rows, secret_ops, carried):
    payload = _notify_payload(rows, secret_ops)
    assert len(payload.encode()) <= 1000
    if carried:
        assert _rows_of(payload) == [(r[0], r[1], r[2], r[3], r[4], r[5], r[7]) for r in rows]
    else:
        assert payload == str(rows[-1][0]) and _rows_of(payload) is None
    assert "k" not in payload or carried


@pytest.mark.parametrize(
    "payload",
    [
        "7",
        "",
        "[",
        "[]",
        "[[1,2]]",
        '[["a",1,"s","t",1,"p","h"]]',
        '[[3,1,"s","t",1,"p","h"],[5,1,"s","t",1,"p","h"]]',
    ],
)
def test_a_notification_without_usable_events_is_read_from_the_store(payload):
    assert _rows_of(payload) is None  # a seq, malformed, empty, or not gapless: the listener queries

"""JournalWriter: the one task that writes the journal, with group commit.

Every append in the gateway goes through one writer. Appenders put their event in the open batch
and wait; the writer task takes the oldest batch (at most ``max_batch`` events, or one group from
``append_many``), commits it in ONE transaction, and wakes everyone in it. While a batch commits,
new appends fill the next one, so the number of transactions adapts to the load: one per event
when idle, one per ``max_batch`` events under pressure. ``append`` returns only after its batch
committed, so the gateway never answers for an event that is not on disk. One shortcut: an
``append_many`` group arriving while the writer task is idle (nothing queued, nothing in flight)
is committed in the appender's own task, the same transaction without the hand-off
(``_commit_here``).

Where a commit runs (journal/_committing.py). A store whose commits never fsync says so
(``commits_are_cheap``: SqliteStore in WAL mode with ``synchronous=NORMAL``, the default, and
MemoryStore; journal/store.py says why such a commit is cheaper than a thread hop). Such a commit
runs on the event loop, but only when the store's write lock is free at once
(``append_batch(wait=0)``): when another connection holds it (``smgrl journal compact``, an
outside ``BEGIN IMMEDIATE``) or the writer's own thread is busy (a snapshot), the batch goes to
the writer's thread, which waits for the lock while the event loop keeps serving. A batch waits
at most ``lock_wait_secs`` from its first event's arrival; then it fails (JournalWriteError,
which the gateway answers with 503). Blocking work (commits of any other store: fsyncs with
``synchronous=FULL``, PostgreSQL's round trips; the store's checkpoints every ``checkpoint_every``
events; snapshots) always runs in the writer's threads (journal/_writer_thread.py). Benchmarks:
docs/benchmarks.md.

After each commit the writer calls ``on_secrets`` (the batch's secret writes) and ``on_commit``
(its records), in the writer task, BEFORE the batch's appenders wake up. If either raises, memory
no longer matches the journal: the batch's appenders get ProjectionError, nothing more is
committed, and ``run()`` raises ProjectionError, which stops the gateway (fail-stop; a restart
replays the journal).

Lifecycle, in the gateway's root nursery::

    writer = JournalWriter(store)
    async with trio.open_nursery() as root:
        await root.start(writer.run)
        try:
            ...  # serve HTTP in an inner nursery; every request appends through `writer`
        finally:
            # Close the writer only after the HTTP server stopped: requests being torn down still
            # record their outcome (in shielded scopes), and a closed writer refuses them.
            with trio.CancelScope(shield=True):
                await writer.aclose()
        store.close()

If the root nursery is cancelled instead, ``run()`` still commits what was queued (shielded)
before it exits; appends arriving after that raise ``JournalClosedError``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import trio

from ._batch import _CLOSED, _CLOSING, _NEW, _RUNNING, Pending, _Batch, _result
from ._committing import Committing
from ._following import Following
from ._writer_thread import WriterThread
from .base import Append, EventStore, Expect
from .codec import Event, Recorded, UnknownEvent
from .errors import JournalClosedError, JournalConflict, JournalFullError, JournalWriteError, ProjectionError

__all__ = ["JournalWriter", "Pending"]


def _as_append(item: tuple[Any, ...] | Append) -> Append:
    """An item of ``append_many`` / ``append_if``: ``(stream, event[, secrets])`` or a built Append."""
    if isinstance(item, Append):
        return item
    return Append(*item)


class JournalWriter(Committing, Following):
    """Group-commit writer over a synchronous store (SqliteStore, PgStore, MemoryStore). See the module docstring.

    ``max_batch``: events per transaction. ``max_queue``: queued events beyond which ``append``
    waits for room and ``append_nowait`` is refused (JournalFullError): no path bypasses it.
    ``lock_wait_secs``: how long a batch may wait for the store's write lock held by another
    connection before its appenders get JournalWriteError. ``on_commit`` / ``on_secrets``: see the
    module docstring; both may also be assigned after construction (the gateway wires them once
    its services exist). ``commits`` counts the transactions committed so far.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        max_batch: int = 1024,
        max_queue: int = 64 * 1024,
        on_commit: Callable[[list[Recorded]], None] | None = None,
        on_secrets: Callable[[dict[str, str | None]], None] | None = None,
        inline: bool | None = None,
        checkpoint_every: int = 4096,
        lock_wait_secs: float = 5.0,
    ) -> None:
        if max_batch < 1 or max_queue < 1:
            raise ValueError("max_batch and max_queue must be positive")
        if lock_wait_secs < 0:
            raise ValueError("lock_wait_secs must be >= 0")
        self._store = store
        self.on_commit = on_commit
        self.on_secrets = on_secrets
        # Inline commits: see the module docstring. A store whose commits fsync (synchronous=FULL)
        # is always committed in the thread.
        self._inline = getattr(store, "commits_are_cheap", False) if inline is None else inline
        self._checkpoint_every = checkpoint_every
        self._since_checkpoint = 0
        self._max_batch = max_batch
        self._max_queue = max_queue
        self._lock_wait = lock_wait_secs
        self._state = _NEW
        self._failed: ProjectionError | None = None
        self._queue: deque[_Batch] = deque()  # the last batch is the open one
        self._queued = 0  # events in self._queue
        self._inflight: _Batch | None = None  # the batch being committed
        self._wakeup = trio.lowlevel.ParkingLot()  # the writer task parks here when idle
        self._room = trio.lowlevel.ParkingLot()  # appenders park here when the queue is full
        self._stopped = trio.Event()
        # The writer's threads (journal/_writer_thread.py): the single-token limiter every threaded
        # commit, read and snapshot takes, and the checkpoint thread.
        self._thread = WriterThread(store)
        self._limiter = self._thread.limiter
        self.commits = 0  # transactions committed (tests and benchmarks count them per operation)
        self.lock_waits = 0  # batches handed to the thread because the write lock was taken
        # Several writers (docs/journal.md, "Several writers"): None while this process is the
        # journal's only writer. Set it to the seq the projections were restored to before run()
        # when other processes append too: on_commit then receives EVERY event in seq order (the
        # others' included, read from the store), and ``position`` is the last seq it received.
        self.position: int | None = None
        # Several writers: committed batches whose appenders wait for the projections to reach
        # them, because what came before them could not be read at commit time (``_defer``).
        self._deferred: list[_Batch] = []

    @property
    def failed(self) -> bool:
        """True once a committed batch could not be applied (fail-stop: see the module docstring)."""
        return self._failed is not None

    # -- appending --------------------------------------------------------------------------------

    def append_nowait(
        self, stream: str, event: Event | UnknownEvent, *, secrets: Mapping[str, str | None] | None = None
    ) -> Pending:
        """Enqueue without waiting; ``await pending.wait()`` later for durability.

        Order is preserved: when an append that was enqueued later has returned, this one is
        committed too (or its batch failed, which ``pending.wait()`` reports). Raises
        JournalClosedError once the writer is closing, JournalFullError when ``max_queue`` events
        are already queued (the bound holds here too), and ValueError/TypeError (in the caller,
        now) for an event that cannot be encoded.
        """
        self._check_open()
        if self._queued >= self._max_queue:
            raise JournalFullError(f"the journal queue is full ({self._queued} events waiting)")
        return Pending(*self._enqueue([Append(stream, event, secrets)]))

    async def enqueue(
        self,
        stream: str,
        event: Event | UnknownEvent,
        *,
        secrets: Mapping[str, str | None] | None = None,
        alone: bool = False,
    ) -> Pending:
        """Wait for room in the queue, enqueue, and return the receipt (not yet durable).

        Cancelled before it returns, nothing was enqueued; once it returned, the event WILL be
        written (see ``append``). So a caller knows exactly whether it has something to close.

        ``alone``: when the writer is idle, commit the event in this task before returning (its
        receipt is then already done), as ``append_many`` does a group (``_commit_here``); else
        it is queued as usual, and may share a batch. For an operation's intent, which the
        caller awaits at once: the hand-off to the writer task and back is skipped. Not for
        appends that arrive in bursts (sessions, registrations): committed one by one in their
        own tasks they would stop sharing transactions.
        """
        item = Append(stream, event, secrets)
        await self._wait_for_room()
        if alone:
            batch = _Batch(items=[item], sealed=True)
            if self._commit_here(batch):
                return Pending(batch, 0)
        return Pending(*self._enqueue([item]))

    async def append(
        self, stream: str, event: Event | UnknownEvent, *, secrets: Mapping[str, str | None] | None = None
    ) -> Recorded:
        """Append and wait until the event's batch is committed (durable); return it as Recorded.

        Raises JournalWriteError if the batch failed (nothing of it was written) and
        JournalClosedError if the writer is closing. Cancellation: a caller cancelled before its
        event is enqueued (already cancelled on entry, or while waiting for room) wrote nothing;
        once enqueued, the event is written and only the wait is abandoned.
        """
        item = Append(stream, event, secrets)
        await self._wait_for_room()
        batch, index = self._enqueue([item])
        # From here on the event WILL be written even if this caller is cancelled while waiting.
        # Withdrawing it is not an option: a later event from another task may already be queued
        # behind it and rely on its order, the batch may already be in the worker thread, and the
        # caller may have acted on the fact that it was journaled. Cancelling only drops the
        # caller's receipt; the journal stays consistent either way.
        await batch.done.wait()
        return _result(batch, index)

    async def append_many(self, items: Sequence[tuple[str, Event | UnknownEvent] | Append]) -> list[Recorded]:
        """Append several events in ONE transaction (all or none), in order; wait until durable.

        An item is ``(stream, event)`` or an ``Append`` built (and so encoded) earlier: a fan-out
        builds each outcome's as the engine answers, while it waits for the others, so that its
        final transaction does not encode them after the last answer.

        Cancellation as for ``append``. The group is never split across transactions, even when it
        is larger than ``max_batch``.
        """
        appends = [_as_append(item) for item in items]
        if not appends:
            await trio.lowlevel.checkpoint()
            return []
        await self._wait_for_room()
        if len(appends) > 1:
            batch = _Batch(items=appends, sealed=True)
            if self._commit_here(batch):
                # Committed: a schedule point that cannot raise Cancelled (the events are written).
                await trio.lowlevel.cancel_shielded_checkpoint()
                if not batch.done.is_set():
                    await batch.done.wait()  # deferred (_defer): written even if this is cancelled
                return [_result(batch, i) for i in range(len(appends))]
        batch, first = self._enqueue(appends)
        await batch.done.wait()  # enqueued: written even if this wait is cancelled (see append)
        return [_result(batch, first + i) for i in range(len(appends))]

    async def append_if(
        self, expect: Expect, items: Sequence[tuple[str, Event | UnknownEvent]]
    ) -> list[Recorded]:
        """Append ``items`` in ONE transaction only if ``expect`` still holds when it commits
        (optimistic concurrency across processes: see ``base.Expect``); wait until durable.

        Raises JournalConflict (nothing written) when events matching ``expect`` were appended
        after ``expect.after``, by any process - this one's own queued appends included, which
        commit first. The caller catches up to ``conflict.head`` and decides again. Only this
        group fails on a conflict: it is never batched with other appends. Cancellation as for
        ``append``.
        """
        # An item may carry a third element, its secrets (as ``append(..., secrets=)``), or be an
        # Append built earlier (as in ``append_many``).
        appends = [_as_append(item) for item in items]
        if not appends:
            raise ValueError("append_if needs at least one event")
        await self._wait_for_room()
        self._check_open()
        batch = _Batch(items=appends, sealed=True, expect=expect)
        self._queue.append(batch)
        self._queued += len(appends)
        if self._wakeup:
            self._wakeup.unpark()
        await batch.done.wait()  # enqueued: written (or refused) even if this wait is cancelled
        return [_result(batch, i) for i in range(len(appends))]

    async def _wait_for_room(self) -> None:
        # Cancellation point *before* anything is enqueued: a caller that is already cancelled gets
        # Cancelled and its event is not written, so "cancelled on entry" means "did not happen".
        await trio.lowlevel.checkpoint_if_cancelled()
        # Backpressure (a cancellation point too, still before enqueueing).
        while self._queued >= self._max_queue and self._state in (_NEW, _RUNNING):
            await self._room.park()
        self._check_open()

    def _check_open(self) -> None:
        if self._state in (_CLOSING, _CLOSED):
            raise JournalClosedError("the journal writer is closed")

    def _enqueue(self, items: list[Append]) -> tuple[_Batch, int]:
        self._check_open()
        queue = self._queue
        n = len(items)
        last = queue[-1] if queue else None
        if last is not None and not last.sealed and len(last.items) + n <= self._max_batch:
            batch = last
        else:
            batch = _Batch()
            queue.append(batch)
        index = len(batch.items)
        batch.items.extend(items)
        if n > 1:
            # A group shares one transaction; a later single append may not push it past
            # max_batch into a second one, so the batch takes nothing more.
            batch.sealed = True
        self._queued += n
        if self._wakeup:  # only the writer parks there; skip the call when it is busy
            self._wakeup.unpark()
        return batch, index

    async def flush(self) -> None:
        """Wait until everything enqueued so far is committed; JournalWriteError if the last batch failed."""
        target = self._queue[-1] if self._queue else self._inflight
        if target is None:
            await trio.lowlevel.checkpoint()
            return
        await target.done.wait()
        if target.error is not None and not isinstance(target.error, JournalConflict):
            raise JournalWriteError(f"journal write failed: {target.error}") from target.error

    # -- the writer task --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task: start it with ``nursery.start(writer.run)``; returns after ``aclose()``.

        Raises ProjectionError if a committed batch could not be applied (see the module docstring).
        """
        if self._state != _NEW:
            raise RuntimeError("JournalWriter.run() can only run once")
        self._state = _RUNNING
        task_status.started()
        try:
            while True:
                if self._failed is not None:
                    raise self._failed
                if self._queue:
                    await self._commit_next()
                elif self._state == _RUNNING:
                    await self._wakeup.park()
                else:
                    return  # aclose() asked, and the queue is drained
        finally:
            # Reached on aclose() (queue already empty), on cancellation of the nursery, on a
            # projection failure, or on a bug. Stop accepting, then commit what is still queued
            # under a shield: those callers were promised durability (some are shielded cleanups
            # recording an interruption), and each batch takes milliseconds. If the disk hangs,
            # shutdown hangs with it, rather than abandoning a thread that holds a write
            # transaction. After a projection failure nothing more is committed: memory would
            # not follow it.
            self._state = _CLOSING
            with trio.CancelScope(shield=True):
                if self._failed is None:
                    await self._drain()
                await self._thread.checkpoint_done()
            self._finish()

    async def save_snapshot(self, kind: str, upto_seq: int, state: str | Callable[[], str]) -> int:
        """Store a projection snapshot (``store.save_snapshot``) in the writer's thread; its size.

        ``state`` is the JSON text, or a function returning it: then the encoding runs in the
        thread too, off the event loop. ``upto_seq`` must already be committed.
        """
        self._check_open()
        return await self._thread.save_snapshot(kind, upto_seq, state)

    async def _drain(self) -> None:
        while self._queue and self._failed is None:
            await self._commit_next()

    def _finish(self) -> None:
        self._state = _CLOSED
        for batch in self._deferred:  # committed (their Recorded stands); memory is moot now
            batch.done.set()
        self._deferred = []
        leftovers = list(self._queue)
        if self._inflight is not None:
            leftovers.append(self._inflight)
        for batch in leftovers:
            if not batch.done.is_set():
                batch.error = self._failed or JournalClosedError(
                    "the journal writer stopped before this event was committed"
                )
                batch.done.set()
        self._queue.clear()
        self._queued = 0
        self._inflight = None
        self._room.unpark_all()
        self._stopped.set()

    async def aclose(self) -> None:
        """Stop accepting events, commit everything queued, stop the writer task. Idempotent.

        If this call is cancelled, the writer task still finishes the drain on its own.
        """
        if self._state == _CLOSED:
            await trio.lowlevel.checkpoint()
            return
        if self._state == _NEW:
            # run() never started, so nobody else will commit what is queued: drain right here,
            # shielded for the same reason as in run().
            self._state = _CLOSING
            with trio.CancelScope(shield=True):
                await self._drain()
            self._finish()
            return
        self._state = _CLOSING
        self._wakeup.unpark_all()
        await self._stopped.wait()

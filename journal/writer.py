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

Where a commit runs. With SQLite in WAL mode and ``synchronous=NORMAL`` (the default) a commit
never fsyncs and costs tens of microseconds, less than a hop to a worker thread and back (and far
less than the GIL hand-off that hop can cost under load). So such a commit runs on the event loop,
but only when SQLite's write lock is free at once (``append_batch(wait=0)``): when another
connection holds it (``smgrl journal compact``, an outside ``BEGIN IMMEDIATE``) or the writer's own
thread is busy (a snapshot), the batch goes to the writer's thread, which waits for the lock while
the event loop keeps serving. A batch waits at most ``lock_wait_secs`` from its first event's
arrival; then it fails (JournalWriteError, which the gateway answers with 503). Fsyncing work
(``synchronous=FULL`` commits, checkpoints every ``checkpoint_every`` events, snapshots) always
runs in the thread. Benchmarks: docs/benchmarks.md.

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

import logging
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import trio

from ._following import Following
from .base import Append, EventStore, Expect
from .codec import Event, Recorded, UnknownEvent
from .errors import (
    JournalBusyError,
    JournalClosedError,
    JournalConflict,
    JournalError,
    JournalFullError,
    JournalWriteError,
    ProjectionError,
)

__all__ = ["JournalWriter", "Pending"]

logger = logging.getLogger("smgrl.journal")

_NEW, _RUNNING, _CLOSING, _CLOSED = "new", "running", "closing", "closed"


@attrs.define(eq=False, slots=True)
class _Batch:
    """Events committed together; one trio.Event wakes all their waiters at once."""

    items: list[Append] = attrs.Factory(list)
    created: float = attrs.Factory(trio.current_time)  # when its first event arrived
    sealed: bool = False  # an append_many group: nothing else joins it
    expect: Expect | None = None  # an append_if group: committed only if this holds
    done: trio.Event = attrs.Factory(trio.Event)
    recorded: list[Recorded] | None = None
    error: BaseException | None = None


@attrs.frozen(slots=True, eq=False)
class Pending:
    """The receipt of an enqueued event: ``await pending.wait()`` for its Recorded once committed."""

    _batch: _Batch
    _index: int

    @property
    def done(self) -> bool:
        """True once the batch holding this event committed or failed."""
        return self._batch.done.is_set()

    async def wait(self) -> Recorded:
        """The Recorded event once its batch committed; JournalWriteError if the batch failed.

        Cancelling this wait does not withdraw the event: it is still written (see ``append``).
        """
        await self._batch.done.wait()
        return _result(self._batch, self._index)


def _result(batch: _Batch, index: int) -> Recorded:
    if isinstance(batch.error, JournalConflict):
        # Not a failure of the journal: the caller's decision is stale. Fresh instance per waiter.
        err = batch.error
        raise JournalConflict(str(err), head=err.head, seq=err.seq) from None
    if batch.error is not None:
        # A fresh exception per waiter: one shared instance would have its traceback rewritten by
        # every task that raises it.
        cls = type(batch.error) if isinstance(batch.error, JournalWriteError) else JournalWriteError
        raise cls(f"journal write failed: {batch.error}") from batch.error
    assert batch.recorded is not None
    return batch.recorded[index]


class JournalWriter(Following):
    """Group-commit writer over a synchronous store (SqliteStore, MemoryStore). See the module docstring.

    ``max_batch``: events per transaction. ``max_queue``: queued events beyond which ``append``
    waits for room and ``append_nowait`` is refused (JournalFullError): no path bypasses it.
    ``lock_wait_secs``: how long a batch may wait for SQLite's write lock held by another
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
        # A private single-token limiter: at most one thread ever touches the store, and commits
        # never wait behind unrelated to_thread users saturating trio's default limiter.
        self._limiter = trio.CapacityLimiter(1)
        # The checkpoint thread (see _checkpoint_due): at most one at a time.
        self._checkpoint_thread: threading.Thread | None = None
        self._checkpoint_mutex = threading.Lock()
        self._checkpoint_again = False  # another threshold passed during the running checkpoint
        self._checkpoint_ending = False  # the running checkpoint thread takes no more rounds
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

    async def append_many(self, items: Sequence[tuple[str, Event | UnknownEvent]]) -> list[Recorded]:
        """Append several events in ONE transaction (all or none), in order; wait until durable.

        Cancellation as for ``append``. The group is never split across transactions, even when it
        is larger than ``max_batch``.
        """
        appends = [Append(stream, event) for stream, event in items]
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
        # An item may carry a third element, its secrets (as ``append(..., secrets=)``).
        appends = [Append(*item) for item in items]
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
                await self._checkpoint_done()
            self._finish()

    async def _commit_next(self) -> None:
        batch = self._queue.popleft()
        self._queued -= len(batch.items)
        self._inflight = batch
        self._room.unpark_all()
        try:
            recorded = await self._commit(batch)
        except trio.Cancelled:
            # Only possible before the thread started (run_sync checks for cancellation on entry
            # and while taking the limiter); nothing was written. Put the batch back in front, in
            # order, for the shielded drain in run() to commit.
            self._inflight = None
            self._queue.appendleft(batch)
            self._queued += len(batch.items)
            raise
        except JournalConflict as exc:
            # A conditional group whose condition no longer held: refused, nothing written; only
            # its own caller hears of it (it is not a journal failure, so no error log).
            logger.debug("conditional append refused: %s", exc)
            batch.error = exc
            recorded = None
        except Exception as exc:  # noqa: BLE001 - whatever the store raised belongs to the waiters
            # Disk full, read-only file, I/O error, the lock held past lock_wait_secs: the store
            # rolled the transaction back, so this batch left no trace and the next one starts
            # from the same head. Every waiter gets JournalWriteError; the writer keeps going and
            # later batches may succeed.
            logger.error("journal batch of %d events failed: %r", len(batch.items), exc)
            batch.error = exc
            recorded = None
        self._committed(batch, recorded)

    def _committed(self, batch: _Batch, result: Any) -> None:
        """A batch's commit ended (``result`` None: it failed, ``batch.error`` says why): feed
        memory, wake its appenders, count towards the next checkpoint."""
        if result is not None:
            self.commits += 1
            (gap, gap_secrets), recorded = result
            batch.recorded = recorded
            if not self._apply(batch, recorded, gap, gap_secrets):
                self._defer(batch)
        self._inflight = None
        if batch not in self._deferred:
            batch.done.set()
        self._release_deferred()
        if self._failed is None and self._inline and batch.error is None:
            self._since_checkpoint += len(batch.items)
            if self._since_checkpoint >= self._checkpoint_every:
                self._since_checkpoint = 0
                self._checkpoint_due()

    def _commit_here(self, batch: _Batch) -> bool:
        """Commit a sealed group in the appender's own task when the writer is idle (parked,
        nothing queued or in flight, commits inline); False, with nothing done, otherwise or
        when SQLite's lock is taken (the group then goes through the writer as usual).

        Measured (docs/benchmarks.md, "fan-out (control plane)"): the hand-off to the writer task and
        back cost about 45 us per commit. Grouping is unchanged: a sealed group never shares its
        transaction with a later append, and with the writer idle there is no earlier one to
        join. Order is unchanged too: nothing else is queued, and the commit has no await."""
        if not (
            self._inline
            and self._state == _RUNNING
            and self._wakeup
            and not self._queue
            and self._inflight is None
            and self._failed is None
        ):
            return False
        self._inflight = batch
        try:
            result = self._append_and_gap(batch, 0)
        except JournalBusyError:
            self._inflight = None
            return False
        except Exception as exc:  # noqa: BLE001 - as in _commit_next
            logger.error("journal batch of %d events failed: %r", len(batch.items), exc)
            batch.error = exc
            result = None
        self._committed(batch, result)
        if self._failed is not None:
            self._wakeup.unpark_all()  # the writer task raises it: fail-stop, as in run()
        return True

    async def _commit(
        self, batch: _Batch
    ) -> tuple[tuple[list[Recorded] | None, dict[str, Any]], list[Recorded]]:
        """``((gap, gap_secrets), recorded)``: the batch's records, and (several writers) the
        events other processes appended between ``position`` and the batch with the keys they
        set, read right after the commit."""
        if self._inline:
            # No await between taking the batch and committing it: nothing can interleave, and a
            # cancellation cannot land half-way. wait=0: never block the event loop on a lock.
            try:
                return self._append_and_gap(batch, 0)
            except JournalBusyError:
                self.lock_waits += 1  # somebody else holds the lock: wait for it in the thread
        # Thread hop: SQLite blocks (fsync with synchronous=FULL, waiting for the write lock), so it
        # runs in a worker thread, waiting at most what is left of the batch's lock_wait_secs.
        # abandon_on_cancel=False: once the thread runs it owns an open write transaction;
        # abandoning it would let the next batch start before this one ended and leave these
        # waiters without an answer. So cancellation waits for it.
        wait = max(0.0, self._lock_wait - (trio.current_time() - batch.created))
        return await trio.to_thread.run_sync(
            lambda: self._append_and_gap(batch, wait),
            limiter=self._limiter,
            abandon_on_cancel=False,
        )

    def _append_and_gap(
        self, batch: _Batch, wait: float
    ) -> tuple[tuple[list[Recorded] | None, dict[str, Any]], list[Recorded]]:
        if batch.expect is None:
            # Stores written before conditional appends existed take no ``expect`` keyword.
            recorded = self._store.append_batch(batch.items, wait=wait)
        else:
            recorded = self._store.append_batch(batch.items, wait=wait, expect=batch.expect)
        gap: list[Recorded] = []
        gap_secrets: dict[str, str | None] = {}
        position = self.position
        if position is not None and recorded[0].seq > position + 1:
            # Others appended since our projections' position: read them now, in the same thread
            # hop as the commit (a network round trip for PostgreSQL), so they are applied first.
            try:
                gap = list(self._store.read(after_seq=position, until_seq=recorded[0].seq - 1))
                gap_secrets = self._foreign_secrets(position, recorded[0].seq - 1)
            except JournalError as exc:
                # The batch IS committed, but what precedes it cannot be read now (the connection
                # died right after the commit): memory takes it later, in order (``_defer``).
                logger.warning("journal gap read after a commit failed, applied later: %s", exc)
                return (None, {}), recorded
        return (gap, gap_secrets), recorded

    def _apply(
        self,
        batch: _Batch,
        recorded: list[Recorded],
        gap: Sequence[Recorded] | None = (),
        gap_secrets: Mapping[str, str | None] | None = None,
    ) -> bool:
        """Feed the committed batch to memory (secrets, then projections), or fail stop; False
        when it must wait (``_defer``)."""
        if gap is None:
            return False
        try:
            if self.on_secrets is not None:
                own = {wid: key for item in batch.items for wid, key in item.secrets.items()}
                if gap and self.position is not None and self.position >= gap[-1].seq:
                    # A catch_up() applied the gap while it was read in the thread; its keys were
                    # read later (or are the same): ours may be older than what it applied.
                    gap_secrets = None
                changes = {**(gap_secrets or {}), **own}  # the batch comes after the gap
                if changes:
                    self.on_secrets(changes)
            records = self._in_order([*gap, *recorded])
            if records is None:
                return False
            if self.on_commit is not None and records:
                self.on_commit(records)
        except Exception as exc:  # noqa: BLE001 - logged with its traceback by _fail_stop
            # The events ARE committed but memory missed (part of) them: serving on would answer
            # from state the journal contradicts. Stop: appenders get an error, run() raises.
            batch.error = self._fail_stop(recorded, exc)
        return True

    def _fail_stop(self, records: Sequence[Recorded], exc: Exception) -> ProjectionError:
        """Applying ``records`` to memory failed: the writer stops (logged once, here)."""
        first, last = records[0].seq, records[-1].seq
        logger.critical(
            "applying journal events %d-%d to memory failed; stopping (a restart replays the journal)",
            first,
            last,
            exc_info=exc,
        )
        self._failed = ProjectionError(f"applying journal events {first}-{last} to memory failed: {exc!r}")
        return self._failed

    def _checkpoint_due(self) -> None:
        """Start a checkpoint in a thread of its own, or ask the one in progress for another round.

        The checkpoint (the fsyncing part of WAL mode) runs beside the commits, on a connection of
        the store's own (SqliteStore.checkpoint): awaited in the writer task, as it was, every
        batch arriving meanwhile waited for its fsyncs, 20 ms and more on a loaded disk every
        4,096 events (docs/benchmarks.md, "fan-out (control plane)"). A plain thread, not a task:
        nothing awaits it until run() ends (``_checkpoint_done``)."""
        with self._checkpoint_mutex:
            thread = self._checkpoint_thread
            if thread is not None and thread.is_alive() and not self._checkpoint_ending:
                self._checkpoint_again = True
                return
        if self._state != _RUNNING:
            return
        self._checkpoint_ending = False
        self._checkpoint_thread = threading.Thread(
            target=self._checkpoint, name="smgrl-journal-checkpoint", daemon=True
        )
        self._checkpoint_thread.start()

    def _checkpoint(self) -> None:
        # In the checkpoint thread. A failure is logged and retried at the next threshold.
        while True:
            try:
                self._store.checkpoint()
            except Exception as exc:  # noqa: BLE001 - a checkpoint failure loses nothing committed
                logger.warning("journal checkpoint failed: %r", exc)
            with self._checkpoint_mutex:
                if not self._checkpoint_again:
                    # From here a new threshold starts a new thread (this one is ending).
                    self._checkpoint_ending = True
                    return
                self._checkpoint_again = False

    async def _checkpoint_done(self) -> None:
        """Wait for a checkpoint in progress (run() ends only once the store is free to close)."""
        thread = self._checkpoint_thread
        if thread is not None and thread.is_alive():
            await trio.to_thread.run_sync(thread.join, abandon_on_cancel=False)

    async def save_snapshot(self, kind: str, upto_seq: int, state: str | Callable[[], str]) -> int:
        """Store a projection snapshot (``store.save_snapshot``) in the writer's thread; its size.

        ``state`` is the JSON text, or a function returning it: then the encoding runs in the
        thread too, off the event loop. ``upto_seq`` must already be committed.
        """
        self._check_open()

        def save() -> int:
            text = state() if callable(state) else state
            self._store.save_snapshot(kind, upto_seq, text)
            return len(text)

        # Thread hop: the snapshot row can be large and the write may wait on busy_timeout. The
        # writer's single-token limiter keeps it from overlapping a threaded commit or checkpoint;
        # an inline commit meanwhile finds the store busy and goes to the thread after it.
        # abandon_on_cancel=False: the thread owns a write transaction until it ends.
        return await trio.to_thread.run_sync(save, limiter=self._limiter, abandon_on_cancel=False)

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

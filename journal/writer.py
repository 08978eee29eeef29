"""JournalWriter: the one task that writes the journal, with group commit.

Every append in the gateway goes through one writer. Appenders put their event in the open batch
and wait; the writer task takes the oldest batch (at most ``max_batch`` events), commits it in ONE
transaction on a worker thread, and wakes everyone in it. While a batch commits, new appends fill
the next one, so the number of transactions adapts to the load: one per event when idle, one per
``max_batch`` events under pressure. ``append`` returns only after its batch committed, so the
gateway never answers for an event that is not on disk.

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
from collections import deque
from collections.abc import Callable, Mapping

import attrs
import trio

from .base import Append, EventStore
from .errors import JournalClosedError, JournalWriteError
from .events import Event, Recorded, UnknownEvent

__all__ = ["JournalWriter", "Pending"]

logger = logging.getLogger("smgrl.journal")

_NEW, _RUNNING, _CLOSING, _CLOSED = "new", "running", "closing", "closed"


@attrs.define(eq=False, slots=True)
class _Batch:
    """Events committed together; one trio.Event wakes all their waiters at once."""

    items: list[Append] = attrs.Factory(list)
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
    if batch.error is not None:
        # A fresh exception per waiter: one shared instance would have its traceback rewritten by
        # every task that raises it.
        cls = JournalClosedError if isinstance(batch.error, JournalClosedError) else JournalWriteError
        raise cls(f"journal write failed: {batch.error}") from batch.error
    assert batch.recorded is not None
    return batch.recorded[index]


class JournalWriter:
    """Group-commit writer over a synchronous store (SqliteStore, MemoryStore). See the module docstring.

    ``max_batch``: events per transaction. ``max_queue``: queued events beyond which ``append``
    waits for room (backpressure when the disk is slower than the producers); ``append_nowait``
    never waits. ``on_commit``: called with each committed batch's records, in journal order, in
    the writer task, BEFORE the batch's appenders wake up: projections fed from it see events in
    exactly commit order, and an appender that awaited its event already sees its effect.
    """

    def __init__(
        self,
        store: EventStore,
        *,
        max_batch: int = 1024,
        max_queue: int = 64 * 1024,
        on_commit: Callable[[list[Recorded]], None] | None = None,
        inline: bool | None = None,
        checkpoint_every: int = 4096,
    ) -> None:
        if max_batch < 1 or max_queue < 1:
            raise ValueError("max_batch and max_queue must be positive")
        self._store = store
        self._on_commit = on_commit
        # Inline commits: when the store says a commit never fsyncs (SQLite WAL with
        # synchronous=NORMAL, or the memory store), the commit itself costs tens of microseconds,
        # less than the hop to a worker thread and back, and far less than the GIL hand-off that
        # hop can cost under load (up to sys.getswitchinterval(), 5 ms, measured on fan-outs).
        # So such stores are committed on the event loop; fsyncing work (synchronous=FULL
        # commits, and checkpoints every ``checkpoint_every`` events) stays in the thread.
        self._inline = getattr(store, "commits_are_cheap", False) if inline is None else inline
        self._checkpoint_every = checkpoint_every
        self._since_checkpoint = 0
        self._max_batch = max_batch
        self._max_queue = max_queue
        self._state = _NEW
        self._queue: deque[_Batch] = deque()  # the last batch is the open one
        self._queued = 0  # events in self._queue
        self._inflight: _Batch | None = None  # the batch a worker thread is committing
        self._wakeup = trio.lowlevel.ParkingLot()  # the writer task parks here when idle
        self._room = trio.lowlevel.ParkingLot()  # appenders park here when the queue is full
        self._stopped = trio.Event()
        # A private single-token limiter: at most one thread ever touches the store, and commits
        # never wait behind unrelated to_thread users saturating trio's default limiter.
        self._limiter = trio.CapacityLimiter(1)

    # -- appending --------------------------------------------------------------------------------

    def append_nowait(
        self, stream: str, event: Event | UnknownEvent, *, secrets: Mapping[str, str | None] | None = None
    ) -> Pending:
        """Enqueue without waiting; ``await pending.wait()`` later for durability.

        Order is preserved: when an append that was enqueued later has returned, this one is
        committed too (or its batch failed, which ``pending.wait()`` reports). Raises
        JournalClosedError once the writer is closing, and ValueError/TypeError (in the caller, now)
        for an event that cannot be encoded.
        """
        if self._state in (_CLOSING, _CLOSED):
            raise JournalClosedError("the journal writer is closed")
        return Pending(*self._enqueue(Append(stream, event, secrets)))

    def _enqueue(self, item: Append) -> tuple[_Batch, int]:
        if self._state in (_CLOSING, _CLOSED):
            raise JournalClosedError("the journal writer is closed")
        queue = self._queue
        if queue and len(queue[-1].items) < self._max_batch:
            batch = queue[-1]
        else:
            batch = _Batch()
            queue.append(batch)
        batch.items.append(item)
        self._queued += 1
        if self._wakeup:  # only the writer parks there; skip the call when it is busy
            self._wakeup.unpark()
        return batch, len(batch.items) - 1

    async def append(
        self, stream: str, event: Event | UnknownEvent, *, secrets: Mapping[str, str | None] | None = None
    ) -> Recorded:
        """Append and wait until the event's batch is committed (durable); return it as Recorded.

        Raises JournalWriteError if the batch failed (nothing of it was written) and
        JournalClosedError if the writer is closing. Cancellation: a caller cancelled before its
        event is enqueued (already cancelled on entry, or while waiting for room) wrote nothing;
        once enqueued, the event is written and only the wait is abandoned.
        """
        # Cancellation point *before* anything is enqueued: a caller that is already cancelled gets
        # Cancelled and its event is not written, so "cancelled on entry" means "did not happen".
        await trio.lowlevel.checkpoint_if_cancelled()
        item = Append(stream, event, secrets)
        # Backpressure (a cancellation point too, still before enqueueing).
        while self._queued >= self._max_queue and self._state in (_NEW, _RUNNING):
            await self._room.park()
        batch, index = self._enqueue(item)
        # From here on the event WILL be written even if this caller is cancelled while waiting.
        # Withdrawing it is not an option: a later event from another task may already be queued
        # behind it and rely on its order, the batch may already be in the worker thread, and the
        # caller may have acted on the fact that it was journaled. Cancelling only drops the
        # caller's receipt; the journal stays consistent either way.
        await batch.done.wait()
        return _result(batch, index)

    async def flush(self) -> None:
        """Wait until everything enqueued so far is committed; JournalWriteError if the last batch failed."""
        target = self._queue[-1] if self._queue else self._inflight
        if target is None:
            await trio.lowlevel.checkpoint()
            return
        await target.done.wait()
        if target.error is not None:
            raise JournalWriteError(f"journal write failed: {target.error}") from target.error

    # -- the writer task --------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The writer task: start it with ``nursery.start(writer.run)``; returns after ``aclose()``."""
        if self._state != _NEW:
            raise RuntimeError("JournalWriter.run() can only run once")
        self._state = _RUNNING
        task_status.started()
        try:
            while True:
                if self._queue:
                    await self._commit_next()
                elif self._state == _RUNNING:
                    await self._wakeup.park()
                else:
                    return  # aclose() asked, and the queue is drained
        finally:
            # Reached on aclose() (queue already empty), on cancellation of the nursery, or on a
            # bug. Stop accepting, then commit what is still queued under a shield: those callers
            # were promised durability (some are shielded cleanups recording an interruption), and
            # each batch takes milliseconds. If the disk hangs, shutdown hangs with it, rather than
            # abandoning a thread that holds a write transaction.
            self._state = _CLOSING
            with trio.CancelScope(shield=True):
                await self._drain()
            self._finish()

    async def _commit_next(self) -> None:
        batch = self._queue.popleft()
        self._queued -= len(batch.items)
        self._inflight = batch
        self._room.unpark_all()
        try:
            if self._inline:
                # No await between taking the batch and committing it: nothing can interleave, and
                # a cancellation cannot land half-way (see __init__ for why this is inline).
                recorded = self._store.append_batch(batch.items)
            else:
                # Thread hop: SQLite blocks (fsync with synchronous=FULL, busy_timeout waits), so it
                # runs in a worker thread. abandon_on_cancel=False: once the thread runs it owns an
                # open write transaction; abandoning it would let the next batch start before this
                # one ended and leave these waiters without an answer. So cancellation waits for it.
                recorded = await trio.to_thread.run_sync(
                    self._store.append_batch, batch.items, limiter=self._limiter, abandon_on_cancel=False
                )
        except trio.Cancelled:
            # Only possible before the thread started (run_sync checks for cancellation on entry
            # and while taking the limiter); nothing was written. Put the batch back in front, in
            # order, for the shielded drain in run() to commit.
            self._inflight = None
            self._queue.appendleft(batch)
            self._queued += len(batch.items)
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the store raised belongs to the waiters
            # Disk full, read-only file, I/O error: the store rolled the transaction back, so this
            # batch left no trace and the next one starts from the same head. Every waiter gets
            # JournalWriteError; the writer keeps going and later batches may succeed.
            logger.error("journal batch of %d events failed: %r", len(batch.items), exc)
            batch.error = exc
        else:
            batch.recorded = recorded
            if self._on_commit is not None:
                try:
                    self._on_commit(recorded)
                except Exception:
                    # The events ARE committed; a failing fold is a bug to log loudly, not a
                    # write failure to report to the appenders.
                    logger.exception("on_commit callback failed for a batch of %d events", len(recorded))
        self._inflight = None
        batch.done.set()
        if self._inline and batch.error is None:
            self._since_checkpoint += len(batch.items)
            if self._since_checkpoint >= self._checkpoint_every:
                self._since_checkpoint = 0
                await self._checkpoint()

    async def _checkpoint(self) -> None:
        # The fsyncing part of WAL mode, off the event loop. Appends arriving meanwhile queue up
        # (the next batch is larger); a failure is logged and retried at the next threshold.
        try:
            await trio.to_thread.run_sync(self._store.checkpoint, limiter=self._limiter, abandon_on_cancel=False)
        except trio.Cancelled:
            raise
        except Exception as exc:  # noqa: BLE001 - a checkpoint failure loses nothing committed
            logger.warning("journal checkpoint failed: %r", exc)

    async def save_snapshot(self, kind: str, upto_seq: int, state: str | Callable[[], str]) -> int:
        """Store a projection snapshot (``store.save_snapshot``) in the writer's thread; its size.

        ``state`` is the JSON text, or a function returning it: then the encoding runs in the
        thread too, off the event loop. ``upto_seq`` must already be committed.
        """
        if self._state in (_CLOSING, _CLOSED):
            raise JournalClosedError("the journal writer is closed")

        def save() -> int:
            text = state() if callable(state) else state
            self._store.save_snapshot(kind, upto_seq, text)
            return len(text)

        # Thread hop: the snapshot row can be large and the write may wait on busy_timeout. The
        # writer's single-token limiter keeps it from overlapping a threaded commit or checkpoint
        # (an inline commit meanwhile waits on the store's own lock, for one INSERT).
        # abandon_on_cancel=False: the thread owns a write transaction until it ends.
        return await trio.to_thread.run_sync(save, limiter=self._limiter, abandon_on_cancel=False)

    async def _drain(self) -> None:
        while self._queue:
            await self._commit_next()

    def _finish(self) -> None:
        self._state = _CLOSED
        leftovers = list(self._queue)
        if self._inflight is not None:
            leftovers.append(self._inflight)
        for batch in leftovers:
            if not batch.done.is_set():
                batch.error = JournalClosedError("the journal writer stopped before this event was committed")
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

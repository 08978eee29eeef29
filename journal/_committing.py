"""The commit half of JournalWriter: one batch into the store, then into memory.

Where a commit runs. A store whose commits are cheap (``commits_are_cheap``: they never fsync)
is committed on the event loop, but only when its write lock is free at once
(``append_batch(wait=0)``): when it is taken (another connection, or the writer's own thread busy
with a snapshot) the batch goes to the writer's thread, which waits for the lock while the event
loop keeps serving, at most ``lock_wait_secs`` from the batch's first event's arrival. Every
other store is committed in the thread. After the commit, ``_apply`` feeds the batch to memory
(``on_secrets``, then ``on_commit``) or fails stop. See journal/writer.py's docstring.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import trio

from ._batch import _RUNNING, _Batch
from ._writer_thread import WriterThread
from .codec import Recorded
from .errors import JournalBusyError, JournalConflict, JournalError, ProjectionError

logger = logging.getLogger("smgrl.journal")


class Committing:
    """Mixed into JournalWriter (which holds the state these methods use)."""

    # JournalWriter's state these methods use (set in its __init__), declared for the type checker.
    _store: Any
    position: int | None
    on_commit: Any
    on_secrets: Any
    commits: int
    lock_waits: int
    _state: str
    _inline: bool
    _lock_wait: float
    _limiter: trio.CapacityLimiter
    _queue: Any
    _queued: int
    _inflight: _Batch | None
    _room: trio.lowlevel.ParkingLot
    _wakeup: trio.lowlevel.ParkingLot
    _deferred: list[_Batch]
    _failed: ProjectionError | None
    _since_checkpoint: int
    _checkpoint_every: int
    _thread: WriterThread
    _defer: Any
    _release_deferred: Any
    _in_order: Any
    _foreign_secrets: Any

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
                self._thread.checkpoint_due(running=self._state == _RUNNING)

    def _commit_here(self, batch: _Batch) -> bool:
        """Commit a sealed group in the appender's own task when the writer is idle (parked,
        nothing queued or in flight, commits inline); False, with nothing done, otherwise or
        when the store's write lock is taken (the group then goes through the writer as usual).

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
        # Thread hop: the store blocks (an fsync, a network round trip, waiting for the write lock), so
        # it runs in a worker thread, waiting at most what is left of the batch's lock_wait_secs.
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

"""The journal writer's threads: its one worker-thread token, snapshots, and the checkpoint thread.

Whatever may block on the store (an fsync, a wait for its write lock) leaves the event loop:
threaded commits (journal/_committing.py) and snapshots run in trio worker threads that hold
``limiter``, a private single token, so at most one thread ever touches the store and none waits
behind unrelated ``to_thread`` users saturating trio's default limiter. Checkpoints (the store's
``checkpoint()``: folding SQLite's write-ahead log, a no-op elsewhere) run in a plain thread of
their own, beside the commits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import trio

logger = logging.getLogger("smgrl.journal")


class WriterThread:
    """The writer's single-token limiter, its snapshots, and the checkpoint thread over ``store``."""

    def __init__(self, store: Any) -> None:
        self._store = store
        # A private single-token limiter: at most one thread ever touches the store, and commits
        # never wait behind unrelated to_thread users saturating trio's default limiter.
        self.limiter = trio.CapacityLimiter(1)
        # The checkpoint thread (see checkpoint_due): at most one at a time.
        self._checkpoint_thread: threading.Thread | None = None
        self._checkpoint_mutex = threading.Lock()
        self._checkpoint_again = False  # another threshold passed during the running checkpoint
        self._checkpoint_ending = False  # the running checkpoint thread takes no more rounds

    def checkpoint_due(self, *, running: bool) -> None:
        """Start a checkpoint in a thread of its own, or ask the one in progress for another round
        (none is started unless the writer is ``running``).

        The checkpoint (the fsyncing part of WAL mode) runs beside the commits, on a connection of
        the store's own (SqliteStore.checkpoint): awaited in the writer task, as it was, every
        batch arriving meanwhile waited for its fsyncs, 20 ms and more on a loaded disk every
        4,096 events (docs/benchmarks.md, "fan-out (control plane)"). A plain thread, not a task:
        nothing awaits it until run() ends (``checkpoint_done``)."""
        with self._checkpoint_mutex:
            thread = self._checkpoint_thread
            if thread is not None and thread.is_alive() and not self._checkpoint_ending:
                self._checkpoint_again = True
                return
        if not running:
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

    async def checkpoint_done(self) -> None:
        """Wait for a checkpoint in progress (run() ends only once the store is free to close)."""
        thread = self._checkpoint_thread
        if thread is not None and thread.is_alive():
            await trio.to_thread.run_sync(thread.join, abandon_on_cancel=False)

    async def save_snapshot(self, kind: str, upto_seq: int, state: str | Callable[[], str]) -> int:
        """Store a projection snapshot (``store.save_snapshot``) in the writer's thread; its size.

        ``state`` is the JSON text, or a function returning it: then the encoding runs in the
        thread too, off the event loop.
        """

        def save() -> int:
            text = state() if callable(state) else state
            self._store.save_snapshot(kind, upto_seq, text)
            return len(text)

        # Thread hop: the snapshot row can be large and the write may wait on busy_timeout. The
        # writer's single-token limiter keeps it from overlapping a threaded commit; an inline
        # commit meanwhile finds the store busy and goes to the thread after it.
        # abandon_on_cancel=False: the thread owns a write transaction until it ends.
        return await trio.to_thread.run_sync(save, limiter=self.limiter, abandon_on_cancel=False)

"""ChangeWatcher: wakes a tail when another process committed to the journal.

Several gateway processes append to one journal; each tails what the others append. SQLite has
no notification, so the watcher polls ``store.change_token()`` (``PRAGMA data_version`` on a
connection of its own: microseconds, no lock) every ``interval`` seconds on the event loop. It
is woken early by :meth:`ChangeWatcher.poke` (an appender of this process) and by the store's
own notifications where it has some (PostgreSQL: LISTEN on a dedicated connection, whose thread
calls the listeners ``store.add_listener`` registered).

Use, in a trio task::

    watcher = ChangeWatcher(store)
    token = store.change_token()
    while True:
        token = await watcher.wait(token)       # returns once something was committed
        for rec in store.read(after_seq=position):  # (a thread for a remote store)
            ...                                  # apply in seq order, then position = rec.seq
"""

from __future__ import annotations

from typing import Any

import trio

__all__ = ["ChangeWatcher"]


class ChangeWatcher:
    """See the module docstring. ``interval``: the poll period (the cross-process lag bound on a
    store without notifications). Build it inside trio (it remembers the trio token)."""

    def __init__(self, store: Any, *, interval: float = 0.005) -> None:
        if interval <= 0:
            raise ValueError("interval must be positive")
        self._store = store
        self.interval = interval
        self._woken = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        self._listener = None
        add = getattr(store, "add_listener", None)
        if add is not None:
            self._listener = self._from_thread
            add(self._listener)

    def _from_thread(self) -> None:
        # Called in the store's LISTEN thread: hand the wake-up to the event loop. RunFinishedError
        # once trio is gone: nothing left to wake.
        try:
            self._token.run_sync_soon(self.poke)
        except trio.RunFinishedError:
            pass

    def poke(self) -> None:
        """Wake the waiter now (call from the event loop, e.g. right after a local commit)."""
        self._woken.set()

    async def wait(self, token: object) -> object:
        """Return the store's change token once it differs from ``token``."""
        while True:
            current = self._store.change_token()
            if current != token:
                await trio.lowlevel.checkpoint()
                return current
            # Sleep one interval, or less when poked: a poke before this line is not lost
            # (the event stays set until the next round replaces it).
            with trio.move_on_after(self.interval):
                await self._woken.wait()
            if self._woken.is_set():
                self._woken = trio.Event()

    def close(self) -> None:
        remove = getattr(self._store, "remove_listener", None)
        if remove is not None and self._listener is not None:
            remove(self._listener)
            self._listener = None

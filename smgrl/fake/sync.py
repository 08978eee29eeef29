"""Small trio synchronisation pieces the fake engines share."""

from __future__ import annotations

import math

import attrs
import trio


@attrs.define(eq=False)
class Notifier:
    """Wake every waiter on each state change (a condition variable without the lock).

    ``notify`` is nearly free when nobody waits, so hot paths (every generated token) can call
    it unconditionally.
    """

    _event: trio.Event = attrs.Factory(trio.Event)
    _waiting: int = 0

    def notify(self) -> None:
        if self._waiting:
            self._event.set()
            self._event = trio.Event()

    async def wait(self) -> None:
        self._waiting += 1
        try:
            await self._event.wait()
        finally:
            self._waiting -= 1

    async def wait_until(self, predicate, timeout: float = math.inf) -> bool:
        """Wait until ``predicate()`` holds; False on timeout. Re-checked after every notify."""
        # The timeout bounds the wait only: on expiry we fall through and report False.
        with trio.move_on_after(timeout):
            while not predicate():
                await self.wait()
            return True
        return False


@attrs.define(eq=False)
class RWLock:
    """SGLang's ``model_update_lock``: many readers (generations) or one writer (a refit).

    Writer-preferring like SGLang's ``RWLock``: once a refit waits, new generations queue behind
    it, so an un-paused refit waits for in-flight requests and does not starve.
    """

    readers: int = 0
    writer: bool = False
    waiting_writers: int = 0
    _changed: Notifier = attrs.Factory(Notifier)

    async def acquire_read(self) -> None:
        while self.writer or self.waiting_writers:
            await self._changed.wait()
        self.readers += 1

    def release_read(self) -> None:
        self.readers -= 1
        self._changed.notify()

    async def acquire_write(self) -> None:
        self.waiting_writers += 1
        try:
            while self.writer or self.readers:
                await self._changed.wait()
        finally:
            # Also on cancellation: a writer that gave up must not keep readers out.
            self.waiting_writers -= 1
            self._changed.notify()
        self.writer = True

    def release_write(self) -> None:
        self.writer = False
        self._changed.notify()


@attrs.define(eq=False)
class Gauge:
    """Concurrent calls now and at peak; optionally also counted on a shared parent gauge."""

    current: int = 0
    peak: int = 0
    parent: Gauge | None = None

    def enter(self) -> None:
        self.current += 1
        self.peak = max(self.peak, self.current)
        if self.parent is not None:
            self.parent.enter()

    def exit(self) -> None:
        self.current -= 1
        if self.parent is not None:
            self.parent.exit()

    def reset(self) -> None:
        self.peak = self.current

"""``--max-concurrent-requests`` with a bounded FIFO queue (SMG's admission).

A request takes a slot for its whole life, streamed body included. With every slot taken it
waits in a queue of at most ``queue_size`` for up to ``queue_timeout_secs``; a full queue is an
immediate 429 ``too_many_requests``, a queue wait that runs out is 429 ``queue_timeout``. A slot
is handed directly from the request that frees it to the head of the queue (FIFO, no stampede).
"""

from __future__ import annotations

import collections
import os

import attrs
import trio

from smgrl.core.errors import QueueFull, QueueTimeout


def default_limit() -> int:
    """SMG's ``-1``: 1,024 per available core, at least 4,096."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(4096, 1024 * cores)


@attrs.define(eq=False)
class _Waiter:
    event: trio.Event = attrs.field(factory=trio.Event)
    granted: bool = False


class _Slot:
    __slots__ = ("_admission",)

    def __init__(self, admission: Admission) -> None:
        self._admission = admission

    async def __aenter__(self) -> None:
        admission = self._admission
        if admission.limit == 0:
            return
        if admission.active < admission.limit and not admission.queue:
            admission.active += 1
        else:
            await admission._queue()

    async def __aexit__(self, *exc_info) -> None:
        if self._admission.limit != 0:
            self._admission._release()


class Admission:
    def __init__(self, limit: int, queue_size: int, queue_timeout: float) -> None:
        self.limit = default_limit() if limit < 0 else limit  # 0 = unlimited
        self.queue_size = queue_size
        self.queue_timeout = queue_timeout
        self.active = 0
        self.queue: collections.deque[_Waiter] = collections.deque()

    def slot(self) -> _Slot:
        """``async with admission.slot():`` holds a slot for the block (waits in the queue when
        every slot is taken). A class, not an ``asynccontextmanager``: taken on every rollout
        request, and a free slot costs no generator and no checkpoint."""
        return _Slot(self)

    async def _queue(self) -> None:
        if len(self.queue) >= self.queue_size:
            raise QueueFull(
                f"too many requests: {self.active} in progress and {len(self.queue)} queued "
                f"(--max-concurrent-requests {self.limit}, --queue-size {self.queue_size})"
            )
        waiter = _Waiter()
        self.queue.append(waiter)
        try:
            with trio.move_on_after(self.queue_timeout):
                await waiter.event.wait()
        except BaseException:
            # Cancelled (client gone) while queued: a slot handed over meanwhile is passed on.
            self._leave(waiter)
            raise
        if not waiter.granted:
            self._leave(waiter)
            raise QueueTimeout(f"waited {self.queue_timeout:g}s in the admission queue")

    def _leave(self, waiter: _Waiter) -> None:
        if waiter.granted:
            self._release()
        else:
            self.queue.remove(waiter)

    def _release(self) -> None:
        # Hand the slot straight to the head of the queue (it stays counted in ``active``).
        if self.queue:
            waiter = self.queue.popleft()
            waiter.granted = True
            waiter.event.set()
        else:
            self.active -= 1

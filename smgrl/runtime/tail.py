"""The journal tail: every committed record, handed to subscribers from the commit path.

``Gateway.committed`` calls :meth:`JournalTail.publish` with each committed batch (in the
journal writer's task, in commit order, after the projections). Each subscriber has a bounded
buffer; one that falls behind by more than ``buffer`` records is marked ``lagged`` and stops
receiving (its reader ends the stream and may reconnect with ``?after=<last seq>``): a slow
reader never holds the writer or grows memory without bound.
"""

from __future__ import annotations

from collections import deque

import trio

BUFFER = 4096


class Subscriber:
    def __init__(self, buffer: int) -> None:
        self.records: deque = deque()
        self.buffer = buffer
        self.lagged = False
        self._wake = trio.Event()

    def push(self, records) -> None:
        if self.lagged:
            return
        if len(self.records) + len(records) > self.buffer:
            self.lagged = True
            self.records.clear()
        else:
            self.records.extend(records)
        self._wake.set()

    async def next_batch(self) -> list:
        """The records received since the last call (waits for at least one, or for lag)."""
        while not self.records and not self.lagged:
            self._wake = trio.Event()
            await self._wake.wait()
        out = list(self.records)
        self.records.clear()
        return out


class JournalTail:
    def __init__(self, buffer: int = BUFFER) -> None:
        self.buffer = buffer
        self._subscribers: set[Subscriber] = set()

    def publish(self, records) -> None:
        if not self._subscribers:
            return
        batch = list(records)
        for sub in list(self._subscribers):
            sub.push(batch)

    def subscribe(self) -> Subscriber:
        sub = Subscriber(self.buffer)
        self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

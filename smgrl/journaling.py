"""The gateway's side of the journal: building events by type name, and the append surface.

Services depend on ``Appender`` (``append`` awaited until durable; ``enqueue`` for a receipt to
await later; ``append_many`` for several events in one transaction; ``append_nowait`` queued,
refused when the queue is full), not on the writer class.
"""

from __future__ import annotations

from typing import Any, Protocol

from journal.events import Recorded, event_class


def ev(type_name: str, **fields: Any):
    """Build the catalogue event registered under ``type_name`` (a KeyError names a typo early)."""
    cls = event_class(type_name)
    if cls is None:
        raise KeyError(f"no journal event type {type_name!r}")
    return cls(**fields)


class Appender(Protocol):
    async def append(self, stream: str, event, *, secrets=None) -> Recorded: ...

    async def enqueue(self, stream: str, event, *, secrets=None): ...

    async def append_many(self, items) -> list[Recorded]: ...

    def append_nowait(self, stream: str, event, *, secrets=None): ...

"""The gateway's side of the journal: building events by type name, and the append surface.

Services depend on ``Appender`` (``append`` awaited until durable, ``append_nowait`` queued), not
on the writer class, so unit tests can hand them an in-memory journal.
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

    def append_nowait(self, stream: str, event, *, secrets=None): ...

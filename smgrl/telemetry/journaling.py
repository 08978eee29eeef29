"""The gateway's side of the journal: the append surface (events are built from their catalogue
classes, ``smgrl.events``: one way, checked by their constructors).

Services depend on ``Appender`` (``append`` awaited until durable; ``enqueue`` for a receipt to
await later; ``append_many`` for several events in one transaction; ``append_nowait`` queued,
refused when the queue is full), not on the writer class.

``record_interrupted`` appends ``control.interrupted`` for every operation the journal shows as
started but never finished: after a crash (``gateway_restart``) or at shutdown (``shutdown``),
naming the targets whose outcomes were recorded and those that were not.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from journal.codec import Recorded
from smgrl.events import ControlInterrupted

if TYPE_CHECKING:
    from smgrl.state import FleetState


class Appender(Protocol):
    async def append(self, stream: str, event, *, secrets=None) -> Recorded: ...

    async def enqueue(self, stream: str, event, *, secrets=None): ...

    async def append_many(self, items) -> list[Recorded]: ...

    def append_nowait(self, stream: str, event, *, secrets=None): ...


async def record_interrupted(journal, fleet: FleetState, reason: str, *, only=None) -> list[str]:
    """Journal ``control.interrupted`` for every open operation (``only(op_id)`` true, when given:
    several processes record only their own), in one transaction."""
    items = []
    for op_id, op in list(fleet.operations.open.items()):
        if only is not None and not only(op_id):
            continue
        targets = [t["worker_id"] for t in op.targets]
        recorded = [t for t in targets if t in op.outcomes]
        missing = [t for t in targets if t not in op.outcomes]
        items.append(
            (
                f"op:{op_id}",
                ControlInterrupted(
                    op_id=op_id,
                    reason=reason,
                    recorded_targets=recorded,
                    missing_targets=missing,
                ),
            )
        )
    if items:
        await journal.append_many(items)
    return [event.op_id for _, event in items]

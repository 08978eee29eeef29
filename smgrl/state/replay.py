"""Startup replay and the bookkeeping of operations cut short.

``replay`` folds the stored journal into a fresh ``FleetState`` (the same ``apply`` the writer
calls at run time). ``record_interrupted`` appends ``control.interrupted`` for every operation
the journal shows as started but never finished: after a crash (``gateway_restart``) or at
shutdown (``shutdown``), naming the targets whose outcomes were recorded and those that were not.
"""

from __future__ import annotations

from smgrl.journaling import ev
from smgrl.state.fleet import FleetState


def replay(store, fleet: FleetState, after_seq: int = 0) -> int:
    count = 0
    for rec in store.read(after_seq):
        fleet.apply(rec.seq, rec.event)
        count += 1
    return count


async def record_interrupted(journal, fleet: FleetState, reason: str) -> list[str]:
    op_ids = list(fleet.operations.open)
    for op_id in op_ids:
        op = fleet.operations.open.get(op_id)
        if op is None:
            continue
        targets = [t["worker_id"] for t in op.targets]
        recorded = [t for t in targets if t in op.outcomes]
        missing = [t for t in targets if t not in op.outcomes]
        journal.append_nowait(
            f"op:{op_id}",
            ev(
                "control.interrupted",
                op_id=op_id,
                reason=reason,
                recorded_targets=recorded,
                missing_targets=missing,
            ),
        )
    if op_ids:
        await journal.flush()
    return op_ids

"""Run one control request against many workers with bounded concurrency.

Every target gets its own deadline (started when its call starts, not when the fan-out starts),
and at most ``concurrency`` calls are in flight: like SMG's unordered bounded stream, a fixed set
of ``min(concurrency, targets)`` runner tasks take targets from one shared iterator, so a 256-target
fan-out spawns at most ``concurrency`` tasks. The runners live in a nursery inside the request
handler: when the client disconnects, quart-trio cancels the handler and with it every call still
in flight; the caller (``ControlService``) records what did arrive.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from smgrl.control.outcome import Outcome
from smgrl.core import Worker


async def run_fanout(
    targets: Sequence[Worker],
    call: Callable[[Worker], Awaitable[Outcome]],
    concurrency: int,
    on_outcome: Callable[[Worker, Outcome], None],
) -> None:
    """Call ``call(worker)`` for every target; ``on_outcome`` runs as each one completes (so a
    fan-out cut short still has every outcome that arrived)."""
    pending = iter(targets)

    async def runner() -> None:
        # Iterators are safe to share between trio tasks: only one task runs at a time and
        # ``next`` never yields to the scheduler.
        for worker in pending:
            outcome = await call(worker)
            on_outcome(worker, outcome)

    # One nursery per fan-out, owned by the request: cancelling the request (client gone,
    # shutdown past its grace period) cancels every call still in flight.
    async with trio.open_nursery() as nursery:
        for _ in range(min(max(1, concurrency), len(targets))):
            nursery.start_soon(runner)

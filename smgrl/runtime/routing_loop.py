"""PSRL's routing loop: hands the waiting requests their dispatch turns, in order.

One task for the gateway's life (started by ``smgrl.runtime.server`` and
``smgrl.testing.gateway_in_process`` when ``Config.routing_loop`` is set). Each pass takes up to
``dispatch_batch_size`` requests per model from ``smgrl.dataplane.DispatchQueues`` in the order
``smgrl.routing.dispatch_order`` gives, and hands each its turn, one after the other: the next
turn goes out once the previous request has taken an instance (its in-flight count moved) or
found none, so the order holds where capacity is short.

When it sleeps: with nothing to hand out it waits on an event, set by a new waiting request or
by a change that may let a tried one in (a request leaving an instance, a fleet event, a
hook's release). Only when some tried request was held out by answers no event announces
(PSManager's, the engines' reports, an open breaker) does it also wake every
``routing_loop_check_interval_ms`` to try those again. A paused dispatch with thousands waiting
costs nothing until the resume.
"""

from __future__ import annotations

import math

import trio

from smgrl.dataplane import DispatchQueues

# The longest one request's attempt holds the queue (its PSManager calls are bounded at 0.5 s
# each): past it the next turn goes out and the slow attempt goes on by itself.
ATTEMPT_BOUND_SECS = 5.0


async def run_routing_loop(queues: DispatchQueues, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    task_status.started()
    batch = max(1, queues.cfg.dispatch_batch_size)
    interval = max(0.001, queues.cfg.check_interval_secs)
    while True:
        if not queues.ready():
            wake = queues.armed()
            rechecks = queues.rechecks()
            # Cancelled only with the gateway's nursery (shutdown): nothing is held here, the
            # waiting requests are cancelled by the same scope or answer by their own deadline.
            with trio.move_on_after(interval if rechecks else math.inf) as timer:
                await wake.wait()
            if timer.cancelled_caught:
                queues.retry_tried(only_rechecks=True)
        if queues.changed:
            queues.retry_tried()
        await one_pass(queues, batch)
        # A checkpoint between passes: a full queue never holds the event loop.
        await trio.lowlevel.checkpoint()


async def one_pass(queues: DispatchQueues, batch: int) -> int:
    """Hand out up to ``batch`` turns per model, each after the previous attempt ended; the
    number handed out."""
    handed = 0
    for model in list(queues.models):
        for _ in range(batch):
            if queues.changed:
                # Capacity freed during the pass: the requests tried earlier in it go back in
                # order, ahead of lower-priority ones not tried yet.
                queues.retry_tried()
            turns = queues.next_turns(model, 1)
            if not turns:
                break
            turn = turns[0]
            if not queues.grant(turn):
                continue  # its client left while the turns before it were attempted
            handed += 1
            # Bounded: a request whose attempt is slow (PSManager, the journal's pin decision)
            # stops holding the others back after ATTEMPT_BOUND_SECS. A request cancelled
            # mid-attempt (client gone) ends its attempt as it leaves (``DispatchQueues.leave``).
            with trio.move_on_after(ATTEMPT_BOUND_SECS):
                await turn.attempted.wait()
    return handed

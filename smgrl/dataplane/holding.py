"""A rollout every instance holds out: one pass of its wait for an eligible engine.

``DataPlane.pick`` (``smgrl/dataplane/service.py``) selects; when nothing can take the request,
``wait_pass`` decides until when it may wait (or answers its 503 now: ``smgrl.dataplane.waiting``
has the rules), logs the wait once, shows the request as waiting (``GET /workers/stats``,
``GET /routing_loop/filter``) and sleeps until something may have changed. Functions over the
``DataPlane``, as ``smgrl.dataplane.decide``.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING

import attrs
import trio

from smgrl.dataplane import waiting
from smgrl.dataplane.psrl_select import PSRL_QUIET
from smgrl.routing import InstanceId, QueueFacts

if TYPE_CHECKING:
    from smgrl.core import Version
    from smgrl.dataplane.affinity import Routed
    from smgrl.dataplane.dispatch_queue import DispatchQueues, Turn
    from smgrl.dataplane.request import RolloutRequest
    from smgrl.dataplane.service import DataPlane
    from smgrl.dataplane.table import ModelEntries
    from smgrl.routing import VersionPolicy

log = logging.getLogger("smgrl.dataplane")


@attrs.define(eq=False, slots=True)
class Picking:
    """One ``pick``: its arguments, and what its passes remember from one to the next."""

    req: RolloutRequest
    model: str
    routing_key: str | None
    wait_until: float
    policy: VersionPolicy
    floor: Version | None
    exclude: set[str]
    routed: Routed | None
    turn: Turn | None
    queues: DispatchQueues | None  # the routing loop's, when the request has a turn in it
    started: float
    logged: bool = False  # the wait was logged (once per request)
    quiet_since: float | None = None  # when the fleet was last seen with no sync in progress


async def wait_pass(dp: DataPlane, p: Picking, slot: ModelEntries, held: Counter) -> None:
    """Nothing could take the request: wait until something may have changed, or raise its 503."""
    bound = _bound(dp, p, slot, held)
    reason = waiting.wait_reason(held)
    if not p.logged:
        p.logged = True
        _log_wait(dp, p, slot, held, reason, bound)
    changed = dp._changed
    wake = _wake_at(dp, slot, held, bound)
    dp.waiting += 1
    dp.wait_passes += 1
    dp.waiting_by_reason[reason] += 1
    hint = _queued_hint(dp, p.routed)
    if hint is not None:
        dp.queued[hint] += 1
    token = object()
    if p.queues is not None:
        changed = _wait_for_turn(dp, p, held)
        wake = bound  # the loop's check interval re-asks PSManager, not this task
    dp.waiting_requests[token] = _facts(p, reason)
    try:
        with trio.move_on_at(wake):
            await changed.wait()
        if p.routed is not None:
            p.routed.refused.clear()  # the hook may answer differently after a change
    finally:
        del dp.waiting_requests[token]
        dp.waiting -= 1
        dp.waiting_by_reason[reason] -= 1
        if hint is not None:
            dp.queued[hint] -= 1
            if not dp.queued[hint]:
                del dp.queued[hint]  # hints are per request: do not keep them


def _bound(dp: DataPlane, p: Picking, slot: ModelEntries, held: Counter) -> float:
    """Until when the request may wait; its 503 when that is now. A sync in progress: up to the
    deadline; none: a short wait, or none at all for a version floor above every engine
    (smgrl/dataplane/waiting.py)."""
    now, wants = dp._now(), waiting.request_floor(p.routed, p.floor)
    explicit = dp.cfg.dataplane.eligible_wait_secs is not None
    bound, p.quiet_since = waiting.bound(held, dp.fleet, explicit, p.wait_until, p.quiet_since, now)
    unmet = p.quiet_since is not None and waiting.floor_out_of_reach(slot, wants)
    if now >= bound or unmet:
        dp.metrics.held_out(held)
        dp.metrics.unroutable_request()
        raise waiting.unroutable(slot, held, now - p.started, p.policy, wants, dp.breakers, unmet)
    return bound


def _log_wait(
    dp: DataPlane, p: Picking, slot: ModelEntries, held: Counter, reason: str, bound: float
) -> None:
    # Visible, not silent: a version floor no engine meets can wait for a long time (PSRL's
    # loops rely on it: the request waits for the next sync).
    log.info(
        "request waits for an eligible engine for model %r: %s (held out: %s; floor %s; "
        "the fleet has versions %s); waiting up to %gs",
        p.model,
        reason,
        ", ".join(f"{n} {r}" for r, n in sorted(held.items())),
        p.floor.raw if p.floor is not None else "-",
        ", ".join(waiting.fleet_versions(slot)) or "none",
        max(0.0, bound - dp._now()),
    )


def _wake_at(dp: DataPlane, slot: ModelEntries, held: Counter, bound: float) -> float:
    """When to look again without a fleet change.

    Woken by the next committed change to the fleet (a continue_generation, a version write, a
    health change), by an open circuit breaker's timeout (it goes half-open without any event),
    or by the wait budget running out. A client that goes away cancels the wait (the request's
    disconnect watcher)."""
    wake = bound
    if dp.psrl is not None and not PSRL_QUIET.isdisjoint(held):
        # Held out by PSManager or the engines' reports, which change without a fleet event:
        # ask again after the routing loop's check interval.
        wake = min(wake, dp._now() + dp.psrl.recheck_secs)
    if held.get("circuit_open"):
        reopen = dp.breakers.next_reopen(e.instance.base_url for e in slot.selectable)
        if reopen is not None:
            wake = min(wake, reopen)
    return wake


def _queued_hint(dp: DataPlane, routed: Routed | None) -> InstanceId | None:
    """The one instance a waiting request waits for (GET /workers/stats shows it in its queue)."""
    if routed is None or not routed.staged:
        return None
    # Read again at each pass: a group pin can be written or released meanwhile.
    return routed.hint() or (dp.groups.pin(routed.meta.prompt_id) if dp.group_sticky else None)


def _wait_for_turn(dp: DataPlane, p: Picking, held: Counter) -> trio.Event:
    """The routing loop hands the turns out: a request that has looked (and found nothing)
    waits for a change, one that has not looks in order. The event that gives its next turn."""
    assert p.queues is not None and p.turn is not None
    routed = p.routed
    facts = QueueFacts(
        is_validate=routed.meta.is_validate if routed is not None else False,
        version=waiting.tag_of(routed, p.floor),
        input_len=p.req.input_len,
        request_id=routed.meta.request_id if routed is not None else None,
    )
    recheck = "circuit_open" in held or (dp.psrl is not None and not PSRL_QUIET.isdisjoint(held))
    p.queues.wait_again(p.turn, p.model, facts, tried="queued" not in held, recheck=recheck)
    return p.turn.go


def _facts(p: Picking, reason: str) -> dict:
    """What GET /routing_loop/filter shows of a waiting request."""
    routed = p.routed
    return {
        "request_id": routed.meta.request_id if routed is not None else None,
        "model": p.model,
        "version_tag": waiting.tag_of(routed, p.floor),
        "reason": reason,
        "loopbacks": routed.loopbacks if routed is not None else 0,
        "waiting_since": p.started,
        "routed": routed,  # PSRL's /routing_loop/filter reads its metadata
    }

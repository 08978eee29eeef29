"""Around every continuation leg: the version it ran on, the continuation's dispatch, the
``dataplane.request_looped_back`` record."""

from __future__ import annotations

import logging

import trio

from smgrl.core import Version
from smgrl.dataplane.loopback.model import Leg, Rollout
from smgrl.events import RequestLoopedBack
from smgrl.routing import InstanceId

log = logging.getLogger("smgrl.dataplane")


def current_version(dataplane, dispatched) -> str | None:
    """The routing table's version NOW for the instance that served ``dispatched``: for an
    answer that names no version. A continuation sent while its engine's pause was not yet
    confirmed waited at the engine and ran on the weights the table shows after the sync, not
    those it showed at dispatch."""
    instance = dispatched.instance
    slot = dataplane.table().models.get(instance.model)
    for entry in slot.entries if slot is not None else ():
        if entry.instance.worker_id == instance.worker_id:
            return entry.version
    return dispatched.entry.version


def prepare(dataplane, routed, rollout: Rollout, instance, leg: Leg, ops=()) -> None:
    """Route the next leg: once the syncs that aborted it (``ops``) have finished, back to the
    instance that aborted (eligible again once its sync completes), or any instance at the
    pinned version floor: never older weights."""
    routed.after_ops = tuple(ops)
    dataplane.metrics.loopbacks.inc()
    dataplane.metrics.tokens_kept.inc(leg.tokens)
    # Per-instance tokens: the aborted leg's go to the instance that decoded them; the stitched
    # answer then reports the total, of which only the part after ``routed.kept`` is new.
    dataplane.count_tokens(instance.worker_id, leg.tokens)
    routed.kept += leg.tokens
    routed.loop_hint = InstanceId(instance.group, instance.dp_rank or 0)
    routed.loopbacks += 1
    first = rollout.segments[0]["version"]
    if routed.floor is None and first is not None and first != "default":
        routed.floor = Version.parse(first)
        routed.pinned = routed.pinned or first


async def record(journal, rollout: Rollout | None, routed, req, model: str, outcome: str) -> None:
    """One ``dataplane.request_looped_back`` event per looped-back request (every route): one
    whose rollout went on after an abort (a continuation was sent, ``routed.loopbacks``, even if
    that continuation then failed), or that the loopback bound stopped. Shielded and bounded: it
    runs while the request may be cancelled (client gone), and a loopback that happened must be
    in the journal; a journal stuck for 5 s is given up (logged)."""
    if journal is None or rollout is None:
        return
    if not (rollout.loopbacks or routed.loopbacks or outcome == "limit_exceeded"):
        return  # never aborted by a sync: nothing was looped back
    event = RequestLoopedBack(
        request_id=routed.meta.request_id,
        route=req.route,
        model=model,
        prompt_tokens=len(rollout.prompt),
        generated_tokens=rollout.generated,
        tokens_kept=rollout.kept,
        loopbacks=rollout.loopbacks,
        outcome=outcome,
        op_ids=tuple(dict.fromkeys(s["op_id"] for s in rollout.segments if s["op_id"])),
        segments=tuple(rollout.segments),
    )
    with trio.CancelScope(shield=True), trio.move_on_after(5) as scope:
        try:
            await journal.append("dataplane", event)
        except Exception as exc:  # noqa: BLE001 - the answer must not fail on the record
            log.warning("could not journal a partial-rollout loopback: %r", exc)
    if scope.cancelled_caught:
        log.warning("journaling a partial-rollout loopback timed out")

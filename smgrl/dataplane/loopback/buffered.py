"""A buffered rollout's loopbacks: dispatch, read the leg, continue until it finishes or the
bound is reached, answer once."""

from __future__ import annotations

import json
import logging

from smgrl.core.errors import DataPlaneError
from smgrl.core.wire import json_bytes
from smgrl.dataplane.loopback.decide import begin, loop_causes, reader
from smgrl.dataplane.loopback.legs import current_version, prepare, record
from smgrl.dataplane.loopback.model import Answer, Rollout, versioned

log = logging.getLogger("smgrl.dataplane")


async def run_buffered(
    dataplane,
    req,
    body: bytes,
    headers,
    model: str,
    bounds: dict,
    make_head,
    journal,
    first: Answer,
    tokenizer=None,
) -> Answer:
    """Continue a buffered rollout whose first answer is ``first`` while its legs end in a
    sync's abort; answer the stitched rollout. ``make_head(dispatched)`` builds the head."""
    routed = bounds["routed"]
    answer = first
    rollout: Rollout | None = None
    outcome = "cancelled"
    read = reader(req)
    try:
        while True:
            try:
                leg = read(json.loads(answer.data)) if 200 <= answer.status < 300 else None
            except ValueError:
                leg = None
            if leg is None:
                outcome = "failed"
                return answer
            dispatched = answer.dispatched
            instance = dispatched.instance
            leg = versioned(leg, current_version(dataplane, dispatched))
            causes = (
                loop_causes(dataplane, routed, instance, dispatched.seq) if leg.finish == "abort" else None
            )
            if rollout is None:
                if causes is None:
                    return answer  # not an abort to loop back: answered as the engine gave it
                rollout = begin(req, body, dataplane.cfg.dataplane.max_loopbacks, tokenizer)
                if rollout is None:
                    return answer
                read = rollout.read  # a chat rollout's continuations answer as completions
            ops = causes or []
            rollout.add(leg, instance, ops[0] if ops else None)
            if causes is None:
                outcome = "aborted" if leg.finish == "abort" else "completed"
                answer.data = json_bytes(rollout.stitch(leg))
                return answer
            if rollout.remaining() == 0:
                outcome = "completed"
                answer.data = json_bytes(rollout.stitch(leg, length_reached=True))
                return answer
            if rollout.loopbacks >= rollout.max_loopbacks:
                outcome = "limit_exceeded"
                raise rollout.limit_exceeded()
            prepare(dataplane, routed, rollout, instance, leg, ops)
            async with dataplane.dispatch(
                req,
                rollout.continuation(),
                headers,
                model=model,
                buffered=True,
                adapt=rollout.adapt(),
                **bounds,
            ) as dispatched:
                answer = Answer(
                    dispatched.response.status, dispatched, make_head(dispatched), dispatched.body or b""
                )
    except DataPlaneError:
        if outcome == "cancelled":
            outcome = "failed"
        raise
    finally:
        await record(journal, rollout, routed, req, model, outcome)

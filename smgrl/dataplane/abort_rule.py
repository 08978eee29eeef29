"""Which engine aborts are looped back: one rule for every transport and route.

An engine answered ``finish_reason: abort`` for a leg sent at journal position ``seq``. The
partial-rollout loopback continues it when:

- the request carries PSRL routing metadata (a client-given request id and a prompt id, as PSRL's
  fork requires before it runs its loopback): on ANY abort, however it was caused (a sync through
  this gateway, or PSRL's coordinator pausing its engines itself, out of band), except when the
  client itself cancelled it: a deliberate ``abort_request`` for that request (or for everything
  on the engine) made through this gateway while it ran. A client that disconnects is gone: its
  request is cancelled before any answer is read.
- otherwise (slime, plain OpenAI clients): only when a control call that aborts running requests
  went through this gateway to that engine and had not finished when the leg was sent
  (``smgrl.state.aborts``). An abort sent straight to the engine (slime's ``abort_request
  {"abort_all": true}`` at the end of a rollout) is then a cancellation: never resurrected.

With a PSManager configured, a request it reports aborted is a cancellation too (the admission
hook's ``aborted`` answer, when it has one).
"""

from __future__ import annotations


def carries_metadata(routed) -> bool:
    """Does the request carry PSRL routing metadata (a client-given request id and prompt id)?"""
    if routed is None:
        return False
    psrl = getattr(routed, "psrl", None)
    if psrl is not None:
        return psrl
    meta = routed.meta
    return meta.request_id is not None and meta.prompt_id is not None


def loop_causes(dataplane, routed, instance, seq: int) -> list[str] | None:
    """None: the abort is answered as the engine gave it. A list: loop the leg back; the
    aborting operations through this gateway that may have caused it (empty when it came from
    outside the gateway: nothing to wait for before the continuation)."""
    aborts = dataplane.fleet.aborts
    ops = aborts.since(instance.base_url, seq)
    if not carries_metadata(routed):
        return ops or None
    if aborts.cancelled(instance.base_url, seq, routed.meta.request_id):
        return None
    hook = getattr(dataplane, "hook", None)
    reported = getattr(hook, "aborted", None)
    if reported is not None and reported(routed.meta.request_id):
        return None
    return ops

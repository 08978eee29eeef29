"""Which requests and which answers loop back (the rule of docs/data-plane.md, "What is looped
back"): a request that can, an answer worth a look, the reader of its legs, and which engine
aborts are continued (``loop_causes``: one rule for every transport and route).

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

With a PSManager configured, a request it reports aborted is a cancellation too: an admission
hook may answer ``aborted(request_id) -> bool`` (synchronously, from what it already knows).
"""

from __future__ import annotations

import json
import logging

from smgrl.dataplane.loopback.model import Rollout, read_leg, start

log = logging.getLogger("smgrl.dataplane")


def loopable(req, max_loopbacks: int, tokenizer) -> bool:
    """May this request loop back? A single-prompt ``/generate`` with ``input_ids``; with the
    gateway's tokenizer also a ``text`` prompt and the OpenAI routes (``loopback.openai``)."""
    if max_loopbacks <= 0 or not req.single:
        return False
    if req.route == "/generate":
        return isinstance(req.prefix, tuple) or tokenizer is not None
    return tokenizer is not None


def worth_a_look(req, status: int, data: bytes, max_loopbacks: int, tokenizer=None) -> bool:
    """Cheap test on every buffered answer: could this be a rollout that may loop back and
    that an engine aborted? Only then is anything parsed."""
    return 200 <= status < 300 and b'"abort"' in data and loopable(req, max_loopbacks, tokenizer)


def reader(req):
    """How a leg is read from an answer of ``req``'s route."""
    if req.route == "/generate":
        return read_leg
    from smgrl.dataplane.loopback import openai as loopback_openai

    return loopback_openai.read_leg


def begin(req, body: bytes, max_loopbacks: int, tokenizer) -> Rollout | None:
    """The rollout of ``req`` (its first leg just ended in a sync's abort), or None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if req.route == "/generate":
        return start(obj, req.single, max_loopbacks, tokenizer)
    from smgrl.dataplane.loopback import openai as loopback_openai

    return loopback_openai.start(req.route, obj, max_loopbacks, tokenizer)


def streamable(req, max_loopbacks: int, tokenizer=None) -> bool:
    """A streamed single-prompt ``/generate`` that may loop back (``input_ids``; a ``text``
    prompt with the gateway's tokenizer)."""
    return req.route == "/generate" and loopable(req, max_loopbacks, tokenizer)


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

"""Which requests and which answers loop back (the rule of docs/data-plane.md, "What is looped
back"): a request that can, an answer worth a look, the reader of its legs."""

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

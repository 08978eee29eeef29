"""What the data plane needs to know about a rollout request, read from its JSON body. Pure.

The body is forwarded to the engine byte for byte (the one exception: ``--dp-aware`` adds
``data_parallel_rank``); this module only looks at it, for four things: the ``model`` (to pick the
fleet's workers for it, never to add one: a request without ``model`` goes upstream without one),
``stream`` (relay chunk by chunk, or buffer to stamp), the text or token ids that cache-aware
routing matches prefixes on, and whether a ``/generate`` is a single prompt.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

GENERATE = "/generate"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
ROUTES = (GENERATE, COMPLETIONS, CHAT)
# Cache-aware routing looks at no more than this much of a prompt: affinity is about the shared
# head of prompts (system prompt, few-shot examples), and a bound keeps the tree walk cheap.
ROUTING_TEXT_LIMIT = 4096


class BadRequest(ValueError):
    """The body cannot be routed (not a JSON object, or a ``model`` that is not a string)."""


@attrs.frozen(slots=True)
class RolloutRequest:
    """What routing needs; the parsed body itself is not kept (it can be several times the
    body's size: the data plane's memory budget counts the body, docs/data-plane.md)."""

    route: str
    model: str | None
    stream: bool
    # Cache-aware routing key material: prompt text (str) or token ids (tuple); None = nothing.
    prefix: str | tuple[int, ...] | None
    single: bool = True  # a /generate with one prompt (answers one object, never a list)
    # PSRL routing fields of the body (``smgrl.routing.metadata``), only those present; None: none.
    routing: dict[str, Any] | None = None
    # The prompt's length (token ids, else characters): the routing loop's short_length and
    # long_length orders (smgrl/routing/dispatch_order.py).
    input_len: int = 0

    @property
    def openai(self) -> bool:
        return self.route != GENERATE


def parse(route: str, body: bytes) -> RolloutRequest:
    try:
        obj = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the request body is not valid JSON") from None
    if not isinstance(obj, dict):
        raise BadRequest("the request body must be a JSON object")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("`model` must be a string")
    return from_obj(route, obj)


# The body fields PSRL routing metadata reads (headers override them): smgrl.routing.metadata.
ROUTING_FIELDS = (
    "request_id",
    "prompt_id",
    "version_tag",
    "is_validate",
    "is_sticky",
    "rollout_instance_id",
    "rollout_instance_hint",
    "base_worker_id",
    "target_dp_rank",
)


def from_obj(route: str, obj: dict[str, Any]) -> RolloutRequest:
    """The request from its parsed (and checked: ``smgrl.http.bodies.dataplane_body``) body. An OpenAI
    request always names its model (SMG's 400 otherwise), even an empty one (a 404); a
    ``/generate`` without one goes to the fleet's single model."""
    model = obj.get("model")
    return RolloutRequest(
        route=route,
        model=model if route != GENERATE else (model or None),
        stream=obj.get("stream") is True,
        prefix=_prefix(route, obj),
        single=route != GENERATE or is_single_generate(obj),
        routing={k: obj[k] for k in ROUTING_FIELDS if k in obj} or None,
        input_len=_input_len(route, obj),
    )


def _length(value: Any) -> int:
    """A prompt's length: a string's characters, a list of ids' count (a batch: its first)."""
    if isinstance(value, list) and value and isinstance(value[0], (list, str)):
        value = value[0]
    return len(value) if isinstance(value, (str, list)) else 0


def _input_len(route: str, obj: dict[str, Any]) -> int:
    if route == GENERATE:
        text = obj.get("text")
        return _length(text if text is not None else obj.get("input_ids"))
    if route == COMPLETIONS:
        return _length(obj.get("prompt"))
    messages = obj.get("messages")
    if not isinstance(messages, list):
        return 0
    total = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            total += sum(
                len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return total


def _prefix(route: str, obj: dict[str, Any]) -> str | tuple[int, ...] | None:
    if route == GENERATE:
        text = obj.get("text")
        if text is not None:
            return _text(text[0] if isinstance(text, list) and text else text)
        return _ids(obj.get("input_ids"))
    if route == COMPLETIONS:
        prompt = obj.get("prompt")
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            prompt = prompt[0]
        return _text(prompt) if isinstance(prompt, str) else _ids(prompt)
    messages = obj.get("messages")
    if not isinstance(messages, list):
        return None
    parts: list[str] = []
    size = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = " ".join(
                p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
        if not isinstance(content, str):
            continue
        parts.append(content)
        size += len(content)
        if size >= ROUTING_TEXT_LIMIT:
            break
    return _text("\n".join(parts)) if parts else None


def _text(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    return value[:ROUTING_TEXT_LIMIT]


def _ids(value: Any) -> tuple[int, ...] | None:
    if isinstance(value, list) and value and isinstance(value[0], list):
        value = value[0]
    if not isinstance(value, list) or not value:
        return None
    head = value[:ROUTING_TEXT_LIMIT]
    # Every id an int (not a bool, float or string), checked at C speed: a generator over a
    # 4,096-token prompt cost ~170 us per request, this ~40 (docs/benchmarks.md, "Where the CPU goes").
    if list(map(type, head)).count(int) != len(head):
        return None
    return tuple(head)


def is_single_generate(obj: dict[str, Any]) -> bool:
    """A ``/generate`` with one prompt (``text`` a string, or ``input_ids`` a flat list)."""
    text = obj.get("text")
    if text is not None:
        return not isinstance(text, list)
    ids = obj.get("input_ids")
    return not (isinstance(ids, list) and ids and isinstance(ids[0], list))

"""SGLang's ``/generate`` with ``input_ids`` on a vLLM HTTP engine. Pure.

vLLM serves no ``/generate``; its token-in route is ``POST /inference/v1/generate``
(``token_ids`` + ``sampling_params``, the route session turns and loopbacks already use). A
``/generate`` for a vLLM worker (PSRL's native agent loop) is translated to it, and the answer
back to SGLang's shape::

    {"text", "output_ids", "meta_info": {"id", "finish_reason": {"type", "length"?},
     "prompt_tokens", "completion_tokens", "cached_tokens", "weight_version"?,
     "weight_versions"?, "output_token_logprobs"? [[logprob, id, null], ...]}}

Only one prompt of token ids (``input_ids``, or a one-item batch of them): a ``text`` prompt or a
batch is refused (``Untranslatable``), as vLLM's route takes ids only. ``sampling_params`` go
across under vLLM's names (``max_new_tokens`` -> ``max_tokens``; PSRL already sends vLLM's
``logprobs``/``detokenize``); ``return_logprob`` asks for the sampled token's log-prob. ``text``
is empty unless the engine returned some (``detokenize: false`` is what PSRL asks).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from smgrl.core.errors import InvalidRequest
from smgrl.dataplane.grpc.build import Untranslatable, id_prompts

ROUTE = "/inference/v1/generate"
# SGLang sampling_params names -> vLLM's (the same name where it is not listed).
_RENAMED = {"max_new_tokens": "max_tokens", "sampling_seed": "seed"}
_PASSED = frozenset(
    {
        "max_tokens", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
        "repetition_penalty", "stop", "stop_token_ids", "ignore_eos", "seed", "n", "min_tokens",
        "skip_special_tokens", "spaces_between_special_tokens", "logprobs", "detokenize", "output_kind",
        "include_stop_str_in_output", "logit_bias", "bad_words",
    }
)  # fmt: skip


def prompt_ids(obj: Mapping[str, Any]) -> list[int]:
    """The one prompt of token ids of a ``/generate`` body (``input_ids``, or a one-item batch of
    them), read as the gRPC path reads it."""
    try:
        _, prompts = id_prompts(obj.get("input_ids"))
        if len(prompts) != 1 or not prompts[0]:
            raise Untranslatable("invalid_request", "not one prompt")
    except Untranslatable:
        raise Untranslatable(
            "invalid_request",
            "a /generate for a vLLM worker needs one prompt of token ids (`input_ids`): vLLM serves no "
            "/generate, and its token-in route takes no text and no batch",
        ) from None
    return list(prompts[0])


def to_vllm(obj: Mapping[str, Any], ids: list[int] | None = None) -> bytes:
    """The ``/inference/v1/generate`` body for a ``/generate`` body (``ids``: its prompt ids,
    e.g. a loopback's extended prompt)."""
    ids = prompt_ids(obj) if ids is None else ids
    sp = obj.get("sampling_params") if isinstance(obj.get("sampling_params"), dict) else {}
    params: dict[str, Any] = {}
    for name, value in sp.items():
        target = _RENAMED.get(name, name)
        if target in _PASSED and value is not None:
            params[target] = value
    if obj.get("return_logprob") is True:
        params.setdefault("logprobs", 0)
    elif obj.get("return_logprob") is False and params.get("logprobs") == 0 and "logprobs" not in sp:
        params.pop("logprobs")
    return json.dumps({"token_ids": ids, "sampling_params": params}, separators=(",", ":")).encode()


def _finish(reason: Any, count: int) -> dict | None:
    if reason is None:
        return None
    if reason == "length":
        return {"type": "length", "length": count}
    return {"type": str(reason)}


def to_sglang(data: bytes, prompt_len: int, want_logprobs: bool) -> bytes | None:
    """SGLang's answer for vLLM's ``data``, or None when ``data`` is not a token-in answer (an
    error body: relayed as it came)."""
    try:
        obj = json.loads(data)
        choice = obj["choices"][0]
        out = [int(t) for t in choice["token_ids"]]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    meta: dict[str, Any] = {
        "id": obj.get("request_id"),
        "finish_reason": _finish(choice.get("finish_reason"), len(out)),
        "prompt_tokens": prompt_len,
        "completion_tokens": len(out),
        "cached_tokens": 0,
    }
    spans = choice.get("weight_versions")
    if (
        isinstance(spans, list)
        and spans
        and isinstance(spans[-1], dict)
        and spans[-1].get("version") is not None
    ):
        meta["weight_version"] = str(spans[-1]["version"])
        if len(spans) > 1:
            meta["weight_versions"] = spans
    lps = choice.get("logprobs")
    if want_logprobs:
        if isinstance(lps, list) and len(lps) == len(out):
            meta["output_token_logprobs"] = [[_number(lp), t, None] for lp, t in zip(lps, out, strict=True)]
        else:
            meta["output_token_logprobs"] = None
    text = choice.get("text")
    answer = {"text": text if isinstance(text, str) else "", "output_ids": out, "meta_info": meta}
    return json.dumps(answer, separators=(",", ":")).encode()


def _number(value: Any) -> float | None:
    if isinstance(value, dict):  # {token_id: logprob}-style entries: the sampled token's
        value = next(iter(value.values()), None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@attrs.frozen
class Outbound:
    """A ``/generate`` translated for a vLLM worker: its route and body, and how to read back."""

    body: bytes
    prompt_len: int
    want_logprobs: bool
    route: str = ROUTE

    def answer(self, data: bytes) -> bytes:
        out = to_sglang(data, self.prompt_len, self.want_logprobs)
        return data if out is None else out


def outbound(worker, route: str, body: bytes, stream: bool) -> Outbound | None:
    """The translation of a ``/generate`` for ``worker`` when it is a vLLM HTTP engine, else None.
    A request vLLM's token-in route cannot serve is 400 ``invalid_request`` (never the engine's
    404 for a route it does not have)."""
    if route != "/generate" or worker is None or worker.engine != "vllm" or worker.connection_mode != "http":
        return None
    if stream:
        raise InvalidRequest(
            "a streamed /generate cannot go to a vLLM worker (vLLM serves no /generate; its token-in "
            "route answers whole): send it with stream: false",
            "invalid_request",
            "stream",
        )
    try:
        obj = json.loads(body)
        if not isinstance(obj, dict):
            raise Untranslatable("invalid_request", "the body is not a JSON object")
        ids = prompt_ids(obj)
    except (ValueError, Untranslatable) as exc:
        raise InvalidRequest(str(exc), "invalid_request", "input_ids") from None
    return Outbound(to_vllm(obj, ids), len(ids), obj.get("return_logprob") is True)

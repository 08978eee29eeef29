"""Session turns go to engines as token ids; this module speaks each engine's token-in route. Pure.

- SGLang (and TokenSpeed, same native API): ``POST /generate`` with ``input_ids``,
  ``return_logprob: true`` and ``sampling_params``; the answer's ``output_ids``,
  ``meta_info.output_token_logprobs`` (``[logprob, id, text]``), ``meta_info.finish_reason`` and
  ``meta_info.weight_version`` (+ ``weight_versions`` spans when a sync happened mid-request).
- vLLM: ``POST /inference/v1/generate`` with ``token_ids`` and ``sampling_params`` (``logprobs: 0``
  asks for the sampled token's log-prob); the answer's ``choices[0].token_ids``, ``logprobs``,
  ``finish_reason`` and ``weight_versions`` spans: vLLM reports versions only there
  (docs/engines.md, vLLM), which is why sessions never use its chat route.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from smgrl.core.sampling import SAMPLING

VLLM_ROUTE = "/inference/v1/generate"
SGLANG_ROUTE = "/generate"

# The OpenAI sampling fields (smgrl/core/sampling.py) a session turn never sends its engine, each
# with why:
NOT_SENT = frozenset(
    {
        # A session reads the engine's ids, never its text, and decodes them itself with the
        # special tokens kept (the template's boundaries: token-exact capture); the engine's text
        # is moot.
        "skip_special_tokens",
    }
)
SENT = tuple(name for name in SAMPLING if name not in NOT_SENT)
# OpenAI sampling fields -> SGLang sampling_params names (vLLM takes the OpenAI names).
_SGLANG_NAMES = {name: {"seed": "sampling_seed"}.get(name, name) for name in SENT}


class EngineAnswerError(ValueError):
    """The engine's answer does not have the shape of its token-in route."""


@attrs.frozen
class Generated:
    output_ids: list[int]
    logprobs: list[float] | None
    finish_reason: str  # "stop" | "length" | "abort" | ...
    weight_version: str | None
    spans: tuple[dict, ...]  # {"version", "start", "end"} over output tokens, when more than one


def max_tokens(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def request(kind: str, prompt_ids: Sequence[int], body: Mapping[str, Any], limit: int) -> tuple[str, bytes]:
    """(route, JSON body) of one token-in generation of at most ``limit`` tokens for an engine
    of ``kind`` (a loopback's continuation: the prompt extended, the limit what is left)."""
    if kind == "vllm":
        params: dict[str, Any] = {"max_tokens": limit, "logprobs": 0}
        for name in _SGLANG_NAMES:
            if name in body and body[name] is not None:
                params[name] = body[name]
        return VLLM_ROUTE, json.dumps({"token_ids": list(prompt_ids), "sampling_params": params}).encode()
    sp: dict[str, Any] = {"max_new_tokens": limit}
    for name, target in _SGLANG_NAMES.items():
        if name in body and body[name] is not None:
            sp[target] = body[name]
    # The template's own end-of-turn text is the stop: no extra stop strings are added.
    payload = {"input_ids": list(prompt_ids), "return_logprob": True, "sampling_params": sp, "stream": False}
    return SGLANG_ROUTE, json.dumps(payload).encode()


def request_encoded(
    kind: str, prompt_json: bytes, more_ids: Sequence[int], body: Mapping[str, Any], limit: int
) -> tuple[str, bytes]:
    """``request`` for a prompt whose ids are already JSON (``prompt_json``, as ``json.dumps``
    writes a list), followed by ``more_ids``: the same bytes, the prompt not encoded again."""
    route, small = request(kind, (), body, limit)
    ids = prompt_json
    if more_ids:
        ids = (
            prompt_json[:-1]
            + (b", " if prompt_json != b"[]" else b"")
            + json.dumps(list(more_ids)).encode()[1:]
        )
    empty = b'{"token_ids": [], ' if kind == "vllm" else b'{"input_ids": [], '
    assert small.startswith(empty)
    return route, small[: len(empty) - 4] + ids + small[len(empty) - 2 :]


def _finish(value: Any) -> str:
    if isinstance(value, dict):
        return str(value.get("type") or "stop")
    return str(value) if value else "stop"


def _spans(raw: Any) -> tuple[dict, ...]:
    if not isinstance(raw, list):
        return ()
    out = []
    for s in raw:
        if isinstance(s, dict) and isinstance(s.get("start"), int) and isinstance(s.get("end"), int):
            out.append({"version": str(s.get("version")), "start": s["start"], "end": s["end"]})
    return tuple(out)


def parse(kind: str, data: bytes) -> Generated:
    try:
        obj = json.loads(data)
    except ValueError:
        raise EngineAnswerError("the engine's answer is not JSON") from None
    if kind == "vllm":
        try:
            choice = obj["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
        except (KeyError, IndexError, TypeError, ValueError):
            raise EngineAnswerError("no choices[0].token_ids in the engine's answer") from None
        lps = choice.get("logprobs")
        logprobs = [float(x) for x in lps] if isinstance(lps, list) and len(lps) == len(ids) else None
        spans = _spans(choice.get("weight_versions"))
        version = spans[-1]["version"] if spans else None
        return Generated(
            ids, logprobs, _finish(choice.get("finish_reason")), version, spans if len(spans) > 1 else ()
        )
    if isinstance(obj, list) and len(obj) == 1:
        obj = obj[0]
    try:
        ids = [int(t) for t in obj["output_ids"]]
        meta = obj.get("meta_info") or {}
    except (KeyError, TypeError, ValueError, AttributeError):
        raise EngineAnswerError("no output_ids in the engine's answer") from None
    pairs = meta.get("output_token_logprobs")
    logprobs = None
    if isinstance(pairs, list) and len(pairs) == len(ids):
        logprobs = [float(p[0]) if p and p[0] is not None else 0.0 for p in pairs]
    version = meta.get("weight_version")
    spans = _spans(meta.get("weight_versions"))
    return Generated(
        ids, logprobs, _finish(meta.get("finish_reason")), None if version is None else str(version), spans
    )


def engine_kind(runtime: str) -> str:
    """The token-in flavour of a worker's runtime (TokenSpeed speaks SGLang's native API)."""
    return "vllm" if runtime == "vllm" else "sglang"

"""A rollout request's JSON body as gRPC Generate requests, per engine wire. Pure (no sockets).

The three routes come in as the HTTP path gets them (SGLang's ``/generate``: ``text`` or
``input_ids``, ``sampling_params``, ``return_logprob``...; OpenAI's completions and chat bodies)
and leave as one :class:`Plan`: the prompts as token ids (text tokenized, chat messages rendered
with the model's chat template, by the gateway's tokenizer), one neutral set of sampling
parameters, and what the answer must show. ``message`` then encodes one prompt for one wire
(SGLang, vLLM upstream, vLLM as PSRL's fork numbers it, TokenSpeed): the field names differ
(``max_new_tokens`` / ``max_tokens``, ``sampling_seed`` / ``seed``, where log-probs are asked
for), and so does how a DP rank is pinned (a field with presence upstream, a plain int in PSRL's
fork).
"""

from __future__ import annotations

from typing import Any

import attrs

GENERATE = "/generate"
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"


class Untranslatable(ValueError):
    """The body cannot be sent over gRPC: a clear 400 with a stable code, never a 500."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


@attrs.frozen(cache_hash=True)  # a key of the serialized shared fields' cache, on every call
class Sampling:
    """The sampling parameters every wire has a field for (None: the engine's default)."""

    max_new_tokens: int | None = None
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    seed: int | None = None
    regex: str | None = None
    json_schema: str | None = None


@attrs.frozen
class Plan:
    route: str
    prompts: tuple[tuple[int, ...], ...]  # one per answer item (n copies of a prompt included)
    sampling: Sampling
    stream: bool
    batch: bool  # /generate with a list of prompts: answers a list
    return_logprob: bool = False
    top_logprobs: int = 0
    logprob_start_len: int = -1
    texts: tuple[str | None, ...] = ()  # the prompt texts (OpenAI echo-free; /generate text)
    include_usage: bool = False  # OpenAI stream_options.include_usage
    model: str | None = None
    rids: tuple[str | None, ...] = ()  # /generate's rid per item
    n: int = 1


# -- reading the bodies ----------------------------------------------------------------------------


def _int(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise Untranslatable("invalid_request", f"`{name}` must be an integer >= {minimum}")
    return value


def _num(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise Untranslatable("invalid_request", f"`{name}` must be a number")
    return float(value)


def _stops(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise Untranslatable("invalid_request", "`stop` must be a string or a list of strings")


def _ids(value: Any, name: str) -> tuple[int, ...]:
    if isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value
    ):
        return tuple(value)
    raise Untranslatable("invalid_request", f"`{name}` must be a list of token ids")


_FLOATS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")


_SAMPLINGS: dict[tuple, Sampling] = {}


_READ = (*_FLOATS, "top_k", "min_new_tokens", "min_tokens", "stop", "stop_token_ids", "ignore_eos",
         "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "sampling_seed", "seed",
         "regex", "json_schema")  # fmt: skip


def _params_key(params: dict[str, Any], max_key: str) -> tuple | None:
    """A hashable key of what ``sampling_of`` reads of ``params`` (each value with its type:
    ``True`` and ``1`` differ here), None when such a value is not a scalar or a list of them."""
    key: list = [max_key]
    for name in (max_key, *_READ):
        value = params.get(name)
        if value is None:
            continue
        if isinstance(value, list):
            if not all(isinstance(v, (str, int, float)) for v in value):
                return None
            value = ("list", *((type(v), v) for v in value))
        elif not isinstance(value, (str, int, float)):
            return None
        key.append((name, type(value), value))
    return tuple(key)


def sampling_of(params: dict[str, Any], *, max_key: str) -> Sampling:
    """SGLang's ``sampling_params`` (``max_key`` "max_new_tokens") or an OpenAI body ("max_tokens").

    Rollouts repeat a handful of sampling settings: the Sampling of a set seen before is reused
    (bounded; an unhashable value just skips the cache)."""
    key = _params_key(params, max_key)
    if key is not None:
        cached = _SAMPLINGS.get(key)
        if cached is not None:
            return cached
    sampling = _read_sampling(params, max_key)
    if key is not None:
        if len(_SAMPLINGS) >= 1024:
            _SAMPLINGS.clear()
        _SAMPLINGS[key] = sampling
    return sampling


def _read_sampling(params: dict[str, Any], max_key: str) -> Sampling:
    fields: dict[str, Any] = {}
    for key in _FLOATS:
        if params.get(key) is not None:
            fields[key] = _num(params[key], key)
    if params.get("top_k") is not None:
        fields["top_k"] = _int(params["top_k"], "top_k", -1)
    if params.get(max_key) is not None:
        fields["max_new_tokens"] = _int(params[max_key], max_key)
    for key in ("min_new_tokens", "min_tokens"):
        if params.get(key) is not None:
            fields["min_new_tokens"] = _int(params[key], key)
    fields["stop"] = _stops(params.get("stop"))
    if params.get("stop_token_ids") is not None:
        fields["stop_token_ids"] = _ids(params["stop_token_ids"], "stop_token_ids")
    for key in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
        if params.get(key) is not None:
            fields[key] = bool(params[key])
    for key in ("sampling_seed", "seed"):
        if params.get(key) is not None:
            fields["seed"] = _int(params[key], key, -(1 << 63))
    for key in ("regex", "json_schema"):
        value = params.get(key)
        if value is not None:
            fields[key] = value if isinstance(value, str) else None
    return Sampling(**fields)


def id_prompts(input_ids: Any) -> tuple[bool, list[tuple[int, ...]]]:
    """``/generate``'s ``input_ids``: one prompt of token ids or a batch (a list of them), as
    (batch, prompts). The one reader of it, for gRPC engines and for vLLM's token-in route."""
    batch = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
    return batch, [_ids(p, "input_ids") for p in (input_ids if batch else [input_ids])]


def plan_generate(obj: dict[str, Any], tokenizer) -> Plan:
    """SGLang's ``/generate`` body."""
    text, input_ids = obj.get("text"), obj.get("input_ids")
    if (text is None) == (input_ids is None):
        raise Untranslatable("invalid_request", "Either text or input_ids should be provided, but not both.")
    if text is not None:
        batch = isinstance(text, list)
        texts = list(text) if batch else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise Untranslatable("invalid_request", "`text` must be a string or a non-empty list of strings")
        if tokenizer is None:
            raise Untranslatable(
                "tokenizer_required",
                "a text prompt to a gRPC engine needs the gateway's tokenizer (--tokenizer-path)",
            )
        prompts = [tuple(tokenizer.encode(t)) for t in texts]
    else:
        batch, prompts = id_prompts(input_ids)
        texts = [None] * len(prompts)
    if not prompts or not all(prompts):
        raise Untranslatable("invalid_request", "the request has no prompt tokens")
    params = obj.get("sampling_params") or {}
    if isinstance(params, list):
        if len(params) != len(prompts) or not all(isinstance(p, dict) for p in params):
            raise Untranslatable("invalid_request", "`sampling_params` must be an object")
        if any(p != params[0] for p in params):
            raise Untranslatable(
                "unsupported_over_grpc", "per-prompt sampling_params differ: send the prompts one by one"
            )
        params = params[0]
    if not isinstance(params, dict):
        raise Untranslatable("invalid_request", "`sampling_params` must be an object")
    sampling = sampling_of(params, max_key="max_new_tokens")
    n = _int(params.get("n", 1) or 1, "n", 1)
    rid = obj.get("rid")
    rids = list(rid) if isinstance(rid, list) else [rid] * len(prompts)
    if n > 1:
        prompts = [p for p in prompts for _ in range(n)]
        texts = [t for t in texts for _ in range(n)]
        rids = [r for r in rids for _ in range(n)]
        batch = True  # SGLang answers n > 1 as a list
    top = obj.get("top_logprobs_num") or 0
    start = obj.get("logprob_start_len", -1)
    return Plan(
        route=GENERATE,
        prompts=tuple(prompts),
        sampling=sampling,
        stream=bool(obj.get("stream")),
        batch=batch,
        return_logprob=bool(obj.get("return_logprob")),
        top_logprobs=_int(top, "top_logprobs_num"),
        logprob_start_len=start if isinstance(start, int) and not isinstance(start, bool) else -1,
        texts=tuple(texts),
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
        rids=tuple(str(r) if r is not None else None for r in rids),
        n=n,
    )


def plan_openai(route: str, obj: dict[str, Any], tokenizer) -> Plan:
    """OpenAI's completions and chat bodies: the prompt rendered and tokenized by the gateway."""
    if tokenizer is None:
        raise Untranslatable(
            "tokenizer_required",
            "the OpenAI routes to a gRPC engine need the gateway's tokenizer (--tokenizer-path)",
        )
    if route == CHAT:
        messages = obj.get("messages")
        if not isinstance(messages, list) or not messages:
            raise Untranslatable("invalid_request", "`messages` must be a non-empty list")
        kwargs = (
            obj.get("chat_template_kwargs") if isinstance(obj.get("chat_template_kwargs"), dict) else None
        )
        tools = obj.get("tools") if isinstance(obj.get("tools"), list) else None
        try:
            prompt = tuple(tokenizer.tokenize_messages(messages, tools=tools, kwargs=kwargs))
        except Exception as exc:  # noqa: BLE001 - a template failing on this input is the client's 400
            raise Untranslatable("chat_template_failed", str(exc)) from None
        top = obj.get("top_logprobs") or 0
        logprobs = bool(obj.get("logprobs"))
        max_key = "max_completion_tokens" if obj.get("max_completion_tokens") is not None else "max_tokens"
        texts: tuple[str | None, ...] = (None,)
    else:
        raw = obj.get("prompt")
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
            raw = raw[0]
        if isinstance(raw, str):
            prompt, texts = tuple(tokenizer.encode(raw)), (raw,)
        elif isinstance(raw, list):
            prompt, texts = _ids(raw, "prompt"), (None,)
        else:
            raise Untranslatable(
                "invalid_request", "`prompt` must be a string or a list of token ids (one prompt over gRPC)"
            )
        top = obj.get("logprobs")
        logprobs = top is not None and top is not False
        top = top if isinstance(top, int) and not isinstance(top, bool) else 0
        max_key = "max_tokens"
    if not prompt:
        raise Untranslatable("invalid_request", "the request has no prompt tokens")
    sampling = sampling_of(obj, max_key=max_key)
    if sampling.max_new_tokens is None and route == COMPLETIONS:
        sampling = attrs.evolve(sampling, max_new_tokens=16)  # OpenAI's completions default
    n = _int(obj.get("n", 1) or 1, "n", 1)
    options = obj.get("stream_options")
    return Plan(
        route=route,
        prompts=(prompt,) * n,
        sampling=sampling,
        stream=bool(obj.get("stream")),
        batch=n > 1,
        return_logprob=logprobs,
        top_logprobs=_int(top, "top_logprobs"),
        texts=texts * n,
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
        model=obj.get("model") if isinstance(obj.get("model"), str) else None,
        rids=(None,) * n,
        n=n,
    )


def plan(route: str, obj: dict[str, Any], tokenizer) -> Plan:
    if not isinstance(obj, dict):
        raise Untranslatable("invalid_request", "the request body must be a JSON object")
    return plan_generate(obj, tokenizer) if route == GENERATE else plan_openai(route, obj, tokenizer)


# -- one prompt as one wire's GenerateRequest --------------------------------------------------------


def message(wire, plan: Plan, index: int, request_id: str, dp_rank: int | None):
    """The ``GenerateRequest`` of prompt ``index`` of ``plan`` on ``wire`` (its ``pb`` module)."""
    pb = wire.pb
    req = _shared_fields(wire, plan)
    req.update(_own_fields(pb, plan, index, request_id, dp_rank))
    return pb.GenerateRequest(**req)


class Encoded:
    """A ``GenerateRequest`` already serialized (what the gRPC client sends: it calls
    ``SerializeToString``; the Abort names ``request_id``)."""

    __slots__ = ("data", "request_id")

    def __init__(self, request_id: str, data: bytes) -> None:
        self.request_id = request_id
        self.data = data

    def SerializeToString(self) -> bytes:
        return self.data


_SHARED: dict[tuple, bytes] = {}


def encoded(wire, plan: Plan, index: int, request_id: str, dp_rank: int | None) -> Encoded:
    """``message(...)`` serialized, the fast way: the fields every prompt of a plan shares
    (sampling, stream, log-prob asks) are serialized once per distinct set and reused, and only
    the request id, the prompt and the rank are serialized per call. Protobuf's wire format
    merges concatenated messages, and the two parts set disjoint fields, so the bytes parse to
    exactly ``message(...)`` (a unit test checks it)."""
    key = (
        wire.name,
        plan.sampling,
        plan.stream,
        plan.return_logprob,
        plan.top_logprobs,
        plan.logprob_start_len,
    )
    shared = _SHARED.get(key)
    if shared is None:
        shared = wire.pb.GenerateRequest(**_shared_fields(wire, plan)).SerializeToString()
        if len(_SHARED) >= 1024:
            _SHARED.clear()
        _SHARED[key] = shared
    own = wire.pb.GenerateRequest(**_own_fields(wire.pb, plan, index, request_id, dp_rank))
    return Encoded(request_id, own.SerializeToString() + shared)


def _own_fields(pb, plan: Plan, index: int, request_id: str, dp_rank: int | None) -> dict[str, Any]:
    text = plan.texts[index] if index < len(plan.texts) else None
    own: dict[str, Any] = {
        "request_id": request_id,
        "tokenized": pb.TokenizedInput(input_ids=plan.prompts[index], original_text=text or ""),
    }
    if dp_rank is not None:
        own["data_parallel_rank"] = dp_rank
    return own


def _shared_fields(wire, plan: Plan) -> dict[str, Any]:
    pb = wire.pb
    s = plan.sampling
    name = wire.name
    vllm = name.startswith("vllm")
    sp: dict[str, Any] = {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "frequency_penalty": s.frequency_penalty,
        "presence_penalty": s.presence_penalty,
        "repetition_penalty": s.repetition_penalty,
        "stop": list(s.stop),
        "stop_token_ids": list(s.stop_token_ids),
        "ignore_eos": s.ignore_eos,
        "skip_special_tokens": s.skip_special_tokens,
        "spaces_between_special_tokens": s.spaces_between_special_tokens,
    }
    cap = s.max_new_tokens
    if vllm:
        sp["top_k"] = max(0, s.top_k)  # uint32: 0 disables it
        if cap is not None:  # unset: the engine's default
            sp["max_tokens"] = cap
        sp["min_tokens"] = s.min_new_tokens
        if s.seed is not None:
            sp["seed"] = s.seed
        if plan.return_logprob:
            sp["logprobs"] = plan.top_logprobs
    else:
        sp["top_k"] = s.top_k
        if cap is not None:
            sp["max_new_tokens"] = cap
        sp["min_new_tokens"] = s.min_new_tokens
        sp["no_stop_trim"] = s.no_stop_trim
        if s.seed is not None and name == "tokenspeed":
            sp["sampling_seed"] = s.seed
    for key in ("regex", "json_schema"):
        if getattr(s, key) is not None:
            sp[key] = getattr(s, key)
    req: dict[str, Any] = {"sampling_params": pb.SamplingParams(**sp), "stream": plan.stream}
    if not vllm:
        req["return_logprob"] = plan.return_logprob
        req["top_logprobs_num"] = plan.top_logprobs
        req["logprob_start_len"] = plan.logprob_start_len
    return req

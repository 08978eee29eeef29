"""SGLang's native ``/generate`` (docs/engines.md, SGLang), shared by the SGLang and TokenSpeed fakes.

Single prompt -> one object, batch -> a list. ``stream: true`` -> SSE events carrying the
cumulative text/output_ids (only the new ones with ``incremental_streaming_output``, SGLang's
``--incremental-streaming-output``), then ``data: [DONE]``. Every answer's ``meta_info`` carries the
weight version; a request that straddled a version change also gets ``weight_versions`` spans.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import trio

from smgrl.core.wire import json_bytes
from smgrl.fake import model
from smgrl.fake.base import Reply
from smgrl.fake.body import loose_json
from smgrl.fake.http import Request, Response, json_response, sse_response
from smgrl.fake.limits import LimitError, check_tokens, max_tokens_arg
from smgrl.fake.scheduler import Job

if TYPE_CHECKING:
    from smgrl.fake.base import BaseEngine

DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


def _error(message: str) -> Reply:
    return Reply(json_response({"error": message}, 400))


def _per_item(value: Any, index: int, batch: bool) -> Any:
    return value[index] if batch and isinstance(value, list) else value


def parse_jobs(obj: dict[str, Any], engine: BaseEngine) -> tuple[list[Job], bool]:
    text, input_ids = obj.get("text"), obj.get("input_ids")
    if (text is None) == (input_ids is None):
        raise _error("Either text or input_ids should be provided, but not both.")
    if text is not None:
        batch = isinstance(text, list)
        if not all(isinstance(t, str) for t in (text if batch else [text])):
            raise _error("text must be a string or a list of strings.")
        prompts = [model.tokenize(t) for t in (text if batch else [text])]
    else:
        if not isinstance(input_ids, list):
            raise _error("input_ids must be a list of token ids or a list of such lists.")
        batch = bool(input_ids) and isinstance(input_ids[0], list)
        prompts = list(input_ids) if batch else [input_ids]
        if not all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompts):
            raise _error("input_ids must be a list of token ids or a list of such lists.")
    if not prompts:
        raise _error("The batch is empty.")
    jobs = []
    for i, prompt in enumerate(prompts):
        params = _per_item(obj.get("sampling_params") or {}, i, batch) or {}
        rid = _per_item(obj.get("rid"), i, batch) or uuid.uuid4().hex
        if not isinstance(params, dict):
            raise _error("sampling_params must be an object.")
        try:
            asked = max_tokens_arg(params.get("max_new_tokens"), "max_new_tokens")
            check_tokens(engine, len(prompt), asked or 0)
            max_new = 128 if asked is None else asked
        except LimitError as exc:
            raise _error(str(exc)) from None
        stop = params.get("stop") or ()
        job = Job(
            rid=str(rid),
            prompt_ids=list(prompt),
            max_new_tokens=max_new,
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            stop_token_ids=tuple(params.get("stop_token_ids") or ()),
            ignore_eos=bool(params.get("ignore_eos", False)),
            seed=params.get("sampling_seed"),
        )
        job.opts = {
            "return_logprob": bool(_per_item(obj.get("return_logprob", False), i, batch)),
            "logprob_start_len": _per_item(obj.get("logprob_start_len", -1), i, batch),
            "top_logprobs_num": _per_item(obj.get("top_logprobs_num", 0), i, batch) or 0,
            "text_in_logprobs": bool(obj.get("return_text_in_logprobs", False)),
            "prompt_token_ids": bool(obj.get("return_prompt_token_ids", False)),
        }
        jobs.append(job)
    return jobs, batch


def render(engine: BaseEngine, job: Job) -> dict[str, Any]:
    opts = job.opts
    meta: dict[str, Any] = {
        "id": job.rid,
        "finish_reason": job.finish,
        "prompt_tokens": len(job.prompt_ids),
        "weight_version": job.weight_version or engine.weight_version,
        "completion_tokens": len(job.output_ids),
        "cached_tokens": job.cached_tokens,
        "reasoning_tokens": 0,
        "num_retractions": job.num_retractions,
        "e2e_latency": round(trio.current_time() - job.created, 6),
    }
    if len(job.spans) > 1:
        meta["weight_versions"] = [{"version": v, "start": s, "end": e} for v, s, e in job.spans]
    if opts.get("return_logprob"):
        _add_logprobs(engine, job, meta)
    out: dict[str, Any] = {"text": job.text, "output_ids": list(job.output_ids), "meta_info": meta}
    if opts.get("prompt_token_ids"):
        out["prompt_token_ids"] = list(job.prompt_ids)
    return out


def _add_logprobs(engine: BaseEngine, job: Job, meta: dict[str, Any]) -> None:
    with_text = job.opts.get("text_in_logprobs")

    def text(token: int) -> str | None:
        return model.token_text(token) if with_text else None

    start = job.opts.get("logprob_start_len", -1)
    inputs = []
    if isinstance(start, int) and start >= 0:
        for i in range(start, len(job.prompt_ids)):
            token = job.prompt_ids[i]
            inputs.append([None if i == 0 else model.prompt_logprob(token, i), token, text(token)])
    meta["input_token_logprobs"] = inputs
    meta["output_token_logprobs"] = [
        [lp, token, text(token)] for lp, token in zip(job.output_logprobs, job.output_ids, strict=True)
    ]
    k = job.opts.get("top_logprobs_num") or 0
    if k > 0:
        digest = bytes.fromhex(engine.weights_digest)
        meta["input_top_logprobs"] = [None for _ in inputs]
        meta["output_top_logprobs"] = [
            [[lp, tok, text(tok)] for lp, tok in model.top_logprobs(digest, job.keys[i], job.seed, k)]
            for i in range(len(job.output_ids))
        ]


async def run_jobs(engine: BaseEngine, jobs: list[Job]) -> None:
    """Admit and run ``jobs`` to completion (concurrently, like one batched request)."""
    async with engine.admission():
        with engine.scheduler.admitted(jobs):
            if len(jobs) == 1:
                await engine.scheduler.run(jobs[0])
                return
            # One task per batch item: they generate side by side; the nursery returns when
            # all finished (aborted ones too), so the reader lock covers the whole batch.
            async with trio.open_nursery() as nursery:
                for job in jobs:
                    nursery.start_soon(engine.scheduler.run, job)


async def sglang_generate(engine: BaseEngine, req: Request) -> Response:
    obj = loose_json(req.body)
    if not isinstance(obj, dict):
        raise _error("The request body must be a JSON object.")
    jobs, batch = parse_jobs(obj, engine)
    engine.precheck_admission()
    if obj.get("stream"):
        return sse_response(_stream(engine, jobs, batch))
    await run_jobs(engine, jobs)
    outputs = [render(engine, job) for job in jobs]
    return json_response(outputs if batch else outputs[0])


def _since(out: dict[str, Any], job: Job, sent: int) -> dict[str, Any]:
    """SGLang's incremental streaming: only what is new since ``sent`` output tokens (the
    counters in ``meta_info`` stay cumulative)."""
    out["output_ids"] = out["output_ids"][sent:]
    out["text"] = job.delta_text(sent)
    meta = out["meta_info"]
    for key in ("output_token_logprobs", "output_top_logprobs"):
        if key in meta:
            meta[key] = meta[key][sent:]
    return out


async def _stream(engine: BaseEngine, jobs: list[Job], batch: bool) -> AsyncIterator[bytes]:
    interval = max(1, engine.config.stream_interval)
    incremental = engine.config.incremental_streaming_output
    async with engine.admission():
        with engine.scheduler.admitted(jobs):
            # Batch items stream one after the other (the fake's simplification; each event
            # carries its "index" as SGLang's do).
            for index, job in enumerate(jobs):
                # aclosing: if the client goes away, the job leaves the scheduler right now.
                sent = 0
                async with contextlib.aclosing(engine.scheduler.steps(job)) as steps:
                    async for _ in steps:
                        if job.finish is None and len(job.output_ids) % interval:
                            continue
                        out = render(engine, job)
                        if incremental:
                            out = _since(out, job, sent)
                            sent = len(job.output_ids)
                        if batch:
                            out["index"] = index
                        yield sse(out)
    yield DONE

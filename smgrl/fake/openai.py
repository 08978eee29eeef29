"""OpenAI-compatible ``/v1/completions`` and ``/v1/chat/completions`` for SGLang and vLLM.

Simple but correct shapes: ``model``, ``choices``, ``usage``, ``finish_reason`` ("stop",
"length" or "abort"), optional logprobs, ``n`` choices per prompt, and ``stream: true`` SSE
ending in ``data: [DONE]``. The flavour supplies admission (SGLang blocks while paused, vLLM
answers 503), its error envelope (``openai_error``) and extras (SGLang adds
``metadata.weight_version``).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from smgrl.fake import model
from smgrl.fake.base import Reply
from smgrl.fake.body import loose_json
from smgrl.fake.generate import DONE, run_jobs, sse
from smgrl.fake.http import Request, Response, json_response, sse_response
from smgrl.fake.limits import LimitError, check_n, check_tokens, context_length, max_tokens_arg
from smgrl.fake.scheduler import Job
from smgrl.tito import TitoError

if TYPE_CHECKING:
    from smgrl.fake.base import BaseEngine


def _body(engine: BaseEngine, req: Request) -> dict[str, Any]:
    obj = loose_json(req.body)
    if not isinstance(obj, dict):
        raise Reply(engine.openai_error(400, "The request body must be a JSON object."))
    model_name = obj.get("model")
    if model_name is not None and not engine.serves_model(model_name):
        raise Reply(
            engine.openai_error(404, f"The model `{model_name}` does not exist.", "NotFoundError", "model")
        )
    return obj


def _prompts(engine: BaseEngine, prompt: Any) -> list[list[int]]:
    if isinstance(prompt, str):
        return [model.tokenize(prompt)]
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return [model.tokenize(p) for p in prompt]
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        if all(isinstance(p, list) for p in prompt):
            return [list(p) for p in prompt]
    raise Reply(engine.openai_error(400, "prompt must be a string, a list of strings or token ids."))


def chat_prompt(messages: list[Any], tools: Any = None) -> list[int]:
    chat = model.chat_tokenizer()
    if chat is not None:  # a real tokenizer: its chat template renders the prompt
        return chat.tokenize_messages(messages, tools=tools if isinstance(tools, list) else None)
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        role = message.get("role", "user") if isinstance(message, dict) else "user"
        parts.append(f"<|im_start|>{role} {content or ''} <|im_end|>")
    parts.append("<|im_start|>assistant")
    return model.tokenize(" ".join(parts))


def _jobs(
    engine: BaseEngine, obj: dict[str, Any], prompts: list[list[int]], rid: str, default_max: int | None
) -> list[Job]:
    try:
        n = check_n(obj.get("n"))
        asked = max_tokens_arg(obj.get("max_completion_tokens"), "max_completion_tokens")
        if asked is None:
            asked = max_tokens_arg(obj.get("max_tokens"), "max_tokens")
        for prompt in prompts:
            check_tokens(engine, len(prompt), asked or 0)
    except LimitError as exc:
        raise Reply(engine.openai_error(400, str(exc))) from None
    stop = obj.get("stop") or ()
    jobs = []
    for i, prompt in enumerate(prompts):
        limit = asked or default_max
        if limit is None:
            limit = context_length(engine) - len(prompt)
        for j in range(n):
            seed = obj.get("seed")
            if n > 1:
                seed = (seed or 0) + j
            jobs.append(
                Job(
                    rid=f"{rid}-{i * n + j}",
                    prompt_ids=prompt,
                    max_new_tokens=max(0, int(limit)),
                    stop=(stop,) if isinstance(stop, str) else tuple(stop),
                    stop_token_ids=tuple(obj.get("stop_token_ids") or ()),
                    ignore_eos=bool(obj.get("ignore_eos", False)),
                    seed=seed,
                )
            )
    return jobs


def _finish(job: Job) -> str | None:
    return job.finish["type"] if job.finish else None


def _completion_logprobs(job: Job, k: int) -> dict[str, Any]:
    tokens = [model.token_text(t) for t in job.output_ids]
    offsets, pos = [], 0
    for text in tokens:
        offsets.append(pos)
        pos += len(text)
    top = [{tokens[i]: job.output_logprobs[i]} for i in range(len(tokens))] if k > 0 else None
    return {
        "tokens": tokens,
        "token_logprobs": list(job.output_logprobs),
        "top_logprobs": top,
        "text_offset": offsets,
    }


def _chat_logprobs(job: Job, k: int) -> dict[str, Any]:
    content = []
    for token, lp in zip(job.output_ids, job.output_logprobs, strict=True):
        text = model.token_text(token)
        entry = {"token": text, "logprob": lp, "bytes": list(text.encode())}
        entry["top_logprobs"] = [{"token": text, "logprob": lp, "bytes": list(text.encode())}][:k]
        content.append(entry)
    return {"content": content}


def _usage(jobs: list[Job]) -> dict[str, int]:
    prompt = sum(len(j.prompt_ids) for j in {id(j.prompt_ids): j for j in jobs}.values())
    completion = sum(len(j.output_ids) for j in jobs)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def completions(engine: BaseEngine, req: Request) -> Response:
    obj = _body(engine, req)
    rid = f"cmpl-{uuid.uuid4().hex}"
    jobs = _jobs(engine, obj, _prompts(engine, obj.get("prompt")), rid, 16)
    logprobs = obj.get("logprobs")
    engine.precheck_admission()
    # Shaped like the chat head below; the object name and the answer built from it differ.
    head = {
        "id": rid,
        "object": "text_completion",
        "created": int(time.time()),
        "model": engine.served_model_name,
    }
    if obj.get("stream"):
        return sse_response(_stream(engine, jobs, head, obj, chat=False))
    await run_jobs(engine, jobs)
    choices = []
    for index, job in enumerate(jobs):
        choice: dict[str, Any] = {
            "index": index,
            "text": job.text,
            "logprobs": _completion_logprobs(job, logprobs) if isinstance(logprobs, int) else None,
            "finish_reason": _finish(job),
        }
        choices.append(engine.openai_choice(choice, job))
    return json_response(engine.openai_extras({**head, "choices": choices, "usage": _usage(jobs)}, jobs))


async def chat_completions(engine: BaseEngine, req: Request) -> Response:
    obj = _body(engine, req)
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Reply(engine.openai_error(400, "messages must be a non-empty list."))
    rid = f"chatcmpl-{uuid.uuid4().hex}"
    try:
        prompt = chat_prompt(messages, obj.get("tools"))
    except TitoError as e:  # a conversation the real chat template refuses
        raise Reply(engine.openai_error(400, e.message)) from None
    jobs = _jobs(engine, obj, [prompt], rid, None)
    engine.precheck_admission()
    head = {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": engine.served_model_name,
    }
    if obj.get("stream"):
        return sse_response(
            _stream(engine, jobs, {**head, "object": "chat.completion.chunk"}, obj, chat=True)
        )
    await run_jobs(engine, jobs)
    top = obj.get("top_logprobs") or 0
    choices = []
    for index, job in enumerate(jobs):
        choice: dict[str, Any] = {
            "index": index,
            "message": {"role": "assistant", "content": job.text},
            "logprobs": _chat_logprobs(job, top) if obj.get("logprobs") else None,
            "finish_reason": _finish(job),
        }
        choices.append(engine.openai_choice(choice, job))
    return json_response(engine.openai_extras({**head, "choices": choices, "usage": _usage(jobs)}, jobs))


async def _stream(
    engine: BaseEngine, jobs: list[Job], head: dict[str, Any], obj: dict[str, Any], chat: bool
) -> AsyncIterator[bytes]:
    async with engine.admission():
        with engine.scheduler.admitted(jobs):
            for index, job in enumerate(jobs):
                sent = 0
                if chat:
                    delta = {"role": "assistant", "content": ""}
                    yield sse({**head, "choices": [{"index": index, "delta": delta, "finish_reason": None}]})
                # aclosing: a client that leaves mid-stream takes its job out of the scheduler.
                async with contextlib.aclosing(engine.scheduler.steps(job)) as steps:
                    async for _ in steps:
                        text = job.delta_text(sent)
                        sent = len(job.output_ids)
                        if not text and job.finish is None:
                            continue
                        if chat:
                            choice = {"index": index, "delta": {"content": text} if text else {}}
                        else:
                            choice = {"index": index, "text": text, "logprobs": None}
                        choice["finish_reason"] = _finish(job)
                        yield sse({**head, "choices": [choice]})
    options = obj.get("stream_options") or {}
    if options.get("include_usage"):
        yield sse({**head, "choices": [], "usage": _usage(jobs)})
    yield DONE

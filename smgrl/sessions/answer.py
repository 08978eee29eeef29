"""The OpenAI chat answer of a session turn, built by the gateway from the generated ids. Pure.

Non-streaming: one ``chat.completion``. Streaming: the completed turn re-emitted as
``chat.completion.chunk`` events (role, content, tool calls, finish, optional usage) then
``data: [DONE]``: the turn is generated whole (token-exact capture needs the final ids and
log-probs), as PSRL's SessionRouter does for a client that asked for a stream.
``choices[0].logprobs`` carries the sampled tokens' log-probs (``smgrl.sessions.logprobs``; SMG's
TITO answers null, which PSRL's TITO verifier fails).
``system_fingerprint`` carries the weight version, as elsewhere in the data plane.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from smgrl.core.wire import json_bytes


def _finish(reason: str, message: dict) -> str:
    if message.get("tool_calls") and reason == "stop":
        return "tool_calls"
    return reason


def _usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def completion(
    *,
    rid: str,
    model: str,
    message: dict,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    version,
    logprobs: dict | None = None,
) -> dict:
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": version,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": logprobs,
                "finish_reason": _finish(finish_reason, message),
            }
        ],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def _event(obj) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


# The same keyword arguments as ``completion``: the streamed form of the same answer, built differently.
def chunks(
    *,
    rid: str,
    model: str,
    message: dict,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
    version,
    include_usage: bool,
    logprobs: dict | None = None,
) -> Iterator[bytes]:
    head = {
        "id": rid,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": version,
    }

    def chunk(delta: dict, finish=None, lps=None) -> bytes:
        return _event(
            {**head, "choices": [{"index": 0, "delta": delta, "logprobs": lps, "finish_reason": finish}]}
        )

    yield chunk({"role": "assistant", "content": ""})
    if message.get("content"):
        yield chunk({"content": message["content"]}, lps=logprobs)
    for i, call in enumerate(message.get("tool_calls") or ()):
        yield chunk({"tool_calls": [{"index": i, **call}]})
    yield chunk({}, _finish(finish_reason, message))
    if include_usage:
        yield _event({**head, "choices": [], "usage": _usage(prompt_tokens, completion_tokens)})
    yield b"data: [DONE]\n\n"

"""The size bounds of a generation request, as the real engines answer them (engines.md).

A fake engine generates what it is asked for: unbounded, ``n: 10**9`` or ``max_new_tokens: 10**12``
built a billion jobs or ran a generation for hours, and a string ``n`` was a 500 with a traceback.
Real engines refuse these up front with a 400: SGLang and TokenSpeed (the ``/generate`` checks of
SGLang's tokenizer manager) and vLLM (its request validation) bound prompt + completion by the
model's context length; ``n`` is bounded too. Each check raises :class:`LimitError` with the
engine's own message; the route answers it in its error envelope.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from smgrl.fake.base import BaseEngine

__all__ = ["MAX_N", "LimitError", "check_n", "check_tokens", "context_length", "max_tokens_arg"]

# Choices per prompt. vLLM and SGLang have no fixed cap but a scheduler that cannot hold more;
# the fake refuses past this instead of allocating the jobs.
MAX_N = 128


class LimitError(ValueError):
    """A request past a bound; the message is the engine's."""


def context_length(engine: BaseEngine) -> int:
    return engine.config.context_length or engine.checkpoint.max_model_len


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_n(value: Any) -> int:
    """``n`` (choices per prompt): None is 1; an int in 1..MAX_N, else LimitError."""
    if value is None:
        return 1
    if not _is_int(value) or value < 1:
        raise LimitError(f"n must be at least 1, got {value!r}.")
    if value > MAX_N:
        raise LimitError(f"n must be at most {MAX_N}, got {value}.")
    return value


def max_tokens_arg(value: Any, name: str) -> int | None:
    """A ``max_tokens``-like argument: None, or an int >= 0, else LimitError."""
    if value is None:
        return None
    if not _is_int(value) or value < 0:
        raise LimitError(f"{name} must be at least 0, got {value!r}.")
    return value


def check_tokens(engine: BaseEngine, prompt_len: int, max_new: int) -> None:
    """Prompt and completion within the context length, with the engine's message when not."""
    ctx = context_length(engine)
    if engine.kind == "vllm":
        if prompt_len >= ctx:
            raise LimitError(
                f"This model's maximum context length is {ctx} tokens. However, your request has "
                f"{prompt_len} input tokens. Please reduce the length of the input messages."
            )
        if prompt_len + max_new > ctx:
            raise LimitError(
                f"'max_tokens' or 'max_completion_tokens' is too large: {max_new}. This model's "
                f"maximum context length is {ctx} tokens and your request has {prompt_len} input "
                f"tokens ({max_new} > {ctx} - {prompt_len})."
            )
        return
    if prompt_len >= ctx:
        raise LimitError(
            f"The input ({prompt_len} tokens) is longer than the model's context length ({ctx} tokens)."
        )
    if prompt_len + max_new > ctx:
        raise LimitError(
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. "
            f"You requested a total of {prompt_len + max_new} tokens: {prompt_len} tokens from the "
            f"input messages and {max_new} tokens for the completion. Please reduce the number of "
            "tokens in the input messages or the completion to fit within the limit."
        )

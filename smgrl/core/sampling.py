"""The sampling fields of an OpenAI request, the one list the gateway passes on to engines by.

``/v1/completions`` and ``/v1/chat/completions`` name them alike (as do SGLang's and vLLM's
OpenAI routes). The OpenAI rollout's continuation after a loopback keeps them all
(``smgrl.dataplane.loopback.openai``); a session turn passes them all but
``skip_special_tokens`` (``smgrl.sessions.engine``, which says why). The limits
(``max_tokens``, ``max_completion_tokens``) are not here: each path sets its own.
"""

from __future__ import annotations

__all__ = ["SAMPLING"]

SAMPLING: tuple[str, ...] = (
    "top_p",
    "top_k",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "seed",
    "skip_special_tokens",
    "temperature",
)

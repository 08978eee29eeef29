"""Partial-rollout loopback for the OpenAI routes, once the gateway holds the model's tokenizer.

An OpenAI answer carries text, not token ids. With ``--tokenizer-path`` the gateway tokenizes the
prompt (``/v1/completions``: the ``prompt`` string, or its ids as given; ``/v1/chat/completions``:
the chat template render with the generation prompt, ``tools`` and ``chat_template_kwargs``) and
continues an aborted answer as a token-in completion: ``POST /v1/completions`` with ``prompt`` =
the prompt ids + the ids of the text generated so far, ``max_tokens`` = the original cap minus the
tokens the engines reported (``usage.completion_tokens``). The generated text is re-tokenized for
the continuation's prompt: text-exact, while its ids may differ from the engine's (a client of the
OpenAI routes sees text; a trainer that needs exact ids sends ``/generate`` with ``input_ids``).

The stitched answer keeps the first leg's shape (``chat.completion`` or ``text_completion``, its
``id``, ``model``, ``created``): the text of every leg, the last leg's ``finish_reason``,
``usage`` with the original prompt's tokens and the total generated, and on ``choices[0]`` the
per-token version spans (``weight_versions``, in engine tokens) and ``segments``. Log-probs are
not stitched (the legs' formats differ): a continued answer has ``logprobs: null``; a chat answer's
tool calls are not parsed again (its content is the generated text). Single choice only (``n``
absent or 1). Streams: ``loopback.openai_stream``.
"""

from __future__ import annotations

from typing import Any

import attrs

from smgrl.core.sampling import SAMPLING
from smgrl.core.wire import json_bytes
from smgrl.dataplane.loopback.model import Leg, Rollout
from smgrl.dataplane.request import COMPLETIONS

# A continuation keeps every sampling field the client set (smgrl/core/sampling.py).


def _version(obj: dict) -> str | None:
    meta = obj.get("metadata")
    version = meta.get("weight_version") if isinstance(meta, dict) else None
    return str(version) if isinstance(version, (str, int)) and not isinstance(version, bool) else None


def read_leg(obj: Any) -> Leg | None:
    """The leg of a 2xx OpenAI answer (chat or completion, one choice), or None."""
    if not isinstance(obj, dict):
        return None
    choices = obj.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return None
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    usage = obj.get("usage")
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if type(count) is not int or count < 0:
        return None
    finish = choice.get("finish_reason")
    version = _version(obj)
    return Leg(
        ids=[],
        logprobs=None,
        top=None,
        text=text if isinstance(text, str) else "",
        finish=finish if isinstance(finish, str) else None,
        version=version,
        spans=[(version, 0, count)] if count else [],
        obj=obj,
        count=count,
    )


@attrs.define(eq=False)
class TextRollout(Rollout):
    """An OpenAI rollout across its legs: texts and engine token counts instead of ids."""

    tokenizer: Any = None
    count: int = 0  # tokens generated so far, as the engines reported them
    prompt_tokens: int | None = None  # the first leg's usage.prompt_tokens
    first_obj: dict = attrs.Factory(dict)

    @property
    def generated(self) -> int:
        return self.count

    def read(self, obj: Any) -> Leg | None:
        return read_leg(obj)

    def add(self, leg: Leg, instance, op_id: str | None) -> None:
        if self.first:
            usage = leg.obj.get("usage") or {}
            self.prompt_tokens = usage.get("prompt_tokens")
            self.first_obj = leg.obj  # the answer's shape, id, model, created
        start = self.count
        self.count += leg.tokens
        self.text = (self.text or []) + [leg.text or ""]
        self._segment(leg, instance, op_id, start, self.count)

    def continuation(self, stream: bool = False) -> bytes:
        obj: dict[str, Any] = {k: self.obj[k] for k in SAMPLING if self.obj.get(k) is not None}
        obj["model"] = self.obj.get("model")
        obj["prompt"] = self.prompt + self.tokenizer.encode("".join(self.text or ()))
        obj["stream"] = stream
        if stream:  # its usage counts the leg's tokens (loopback.openai_stream)
            obj["stream_options"] = {"include_usage": True}
        if self.cap is not None:
            obj["max_tokens"] = self.remaining()
        return json_bytes(obj)

    def stitch(self, last: Leg, *, length_reached: bool = False) -> dict:
        out = dict(self.first_obj)
        choice = dict(out["choices"][0])
        text = "".join(self.text or ())
        if isinstance(choice.get("message"), dict):
            choice["message"] = {**choice["message"], "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        finish = "length" if length_reached else last.finish
        choice["finish_reason"] = finish
        choice["weight_versions"] = [{"version": v, "start": s, "end": e} for v, s, e in self.spans]
        choice["segments"] = [dict(s) for s in self.segments]
        out["choices"] = [choice]
        prompt = self.prompt_tokens if isinstance(self.prompt_tokens, int) else len(self.prompt)
        out["usage"] = {
            "prompt_tokens": prompt,
            "completion_tokens": self.count,
            "total_tokens": prompt + self.count,
        }
        if last.version is not None and isinstance(out.get("metadata"), dict):
            out["metadata"] = {**out["metadata"], "weight_version": last.version}
        return out


def start(route: str, obj: Any, max_loopbacks: int, tokenizer) -> TextRollout | None:
    """The rollout of an OpenAI request whose first leg a sync aborted, or None (no tokenizer,
    several choices, a prompt that is not one string or one list of ids)."""
    if max_loopbacks <= 0 or tokenizer is None or not isinstance(obj, dict):
        return None
    if obj.get("n") not in (None, 1):
        return None
    if route == COMPLETIONS:
        prompt = obj.get("prompt")
        if isinstance(prompt, str):
            ids = tokenizer.encode(prompt)
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            ids = list(prompt)
        else:
            return None
        continuation_route = None
    else:
        messages = obj.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        kwargs = obj.get("chat_template_kwargs")
        try:
            ids = tokenizer.tokenize_messages(
                messages, tools=obj.get("tools"), kwargs=kwargs if isinstance(kwargs, dict) else None
            )
        except Exception:  # noqa: BLE001 - a template that cannot render it: the engine's abort stands
            return None
        continuation_route = COMPLETIONS
    cap = obj.get("max_completion_tokens", obj.get("max_tokens"))
    if cap is not None and (type(cap) is not int or cap < 0):
        return None
    rollout = TextRollout(
        obj=obj,
        prompt=ids,
        cap=cap,
        max_loopbacks=max_loopbacks,
        tokenizer=tokenizer,
        route=continuation_route,
    )
    rollout.text = []
    return rollout

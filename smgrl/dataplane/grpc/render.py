"""A gRPC Generate stream as the answer the HTTP path gives. Pure.

One :class:`GenItem` per prompt follows its stream (chunks of new ids, then a ``Complete`` frame),
detokenizing as ids arrive, cutting the text at a stop string (the gateway checks them, as
SMG's router does: an engine may only check stop token ids) and keeping log-probs, counters
and the weight version. An :class:`RenderedAnswer` renders the items in the route's shape: SGLang's
``/generate`` object (a list for a batch or ``n`` > 1), OpenAI's completion or chat answer,
buffered as one JSON body or streamed as server-sent events.

Streamed ``/generate`` follows SGLang's HTTP stream: each event carries the text and
``output_ids`` so far (cumulative), the last one the finish reason; the finishing event adds
only ids the stream had not sent (never the last token again).
"""

from __future__ import annotations

import time
from typing import Any

from smgrl.core.wire import json_bytes
from smgrl.dataplane.grpc.build import CHAT, COMPLETIONS, Plan
from smgrl.dataplane.grpc.detok import Detokenizer
from smgrl.dataplane.stamp import RenderedJson

DONE = b"data: [DONE]\n\n"


def sse(obj: Any) -> bytes:
    return b"data: " + json_bytes(obj) + b"\n\n"


def _pairs(lp) -> list[list]:
    """An ``OutputLogProbs`` as SGLang's ``[[logprob, id, null], ...]``."""
    return [[v, t, None] for v, t in zip(lp.token_logprobs, lp.token_ids, strict=False)]


def _tops(lp) -> list[list]:
    return [
        [[v, t, None] for v, t in zip(top.values, top.token_ids, strict=False)] for top in lp.top_logprobs
    ]


class GenItem:
    """One prompt's generation as it arrives."""

    __slots__ = ("cached", "detok", "finish", "ids", "index", "logprobs", "matched", "plan", "prompt_tokens",
                 "rid", "stop_hit", "text", "tops", "version")  # fmt: skip

    def __init__(self, plan: Plan, index: int, rid: str, version: str | None, decode) -> None:
        self.plan = plan
        self.index = index
        self.rid = rid
        self.version = version  # the projection's version at dispatch; a chunk's own wins
        self.ids: list[int] = []
        self.logprobs: list[list] | None = [] if plan.return_logprob else None
        self.tops: list[list] | None = [] if plan.return_logprob and plan.top_logprobs else None
        self.text = ""
        self.detok = Detokenizer(decode) if decode is not None else None
        self.finish: dict[str, Any] | None = None
        self.matched: Any = None
        self.prompt_tokens = len(plan.prompts[index])
        self.cached = 0
        self.stop_hit = False  # the gateway found a stop string: the call can end now

    # -- what arrives ------------------------------------------------------------------------------

    def _counters(self, msg) -> None:
        if msg.prompt_tokens:
            self.prompt_tokens = msg.prompt_tokens
        self.cached = msg.cached_tokens or self.cached
        if _has_field(msg.DESCRIPTOR, "weight_version"):
            version = msg.weight_version
            if version:
                self.version = version  # TokenSpeed names the weights of every chunk

    def chunk(self, msg) -> tuple[list[int], str]:
        """A stream chunk: the ids and text it adds (text cut at a stop string)."""
        self._counters(msg)
        if self.stop_hit:
            return [], ""
        new = list(msg.token_ids)
        self.ids.extend(new)
        self._logprobs(msg)
        return new, self._add_text(new)

    def complete(self, msg, streamed: bool) -> tuple[list[int], str]:
        """The ``Complete`` frame: the ids it adds (a buffered call's all; a stream's unsent
        tail), and the finish reason."""
        self._counters(msg)
        new: list[int] = []
        if not self.stop_hit:
            out = list(msg.output_ids)
            if not streamed or out[: len(self.ids)] == self.ids:
                new = out[len(self.ids) :] if streamed else out
            if not streamed:
                self.ids = []
            self.ids.extend(new)
            if new and msg.HasField("output_logprobs"):
                lp = msg.output_logprobs
                if self.logprobs is not None:
                    self.logprobs.extend(_pairs(lp)[-len(new) :] if streamed else _pairs(lp))
                if self.tops is not None:
                    self.tops.extend(_tops(lp)[-len(new) :] if streamed else _tops(lp))
        if self.stop_hit:
            delta = ""
        elif not streamed and self.detok is not None and not self.detok.ids:
            delta = self._check_stops(self._whole_text(new))  # a buffered answer: one decode
        else:
            delta = self._add_text(new)
        if self.detok is not None and not self.stop_hit:
            tail = self.detok.flush()
            delta += tail
            self.text += tail
            delta = self._check_stops(delta)
        if self.finish is None:
            self.finish = _finish(msg, len(self.ids))
            self.matched = _matched(msg)
        return new, delta

    def _logprobs(self, msg) -> None:
        if not msg.HasField("output_logprobs"):
            return
        if self.logprobs is not None:
            self.logprobs.extend(_pairs(msg.output_logprobs))
        if self.tops is not None:
            self.tops.extend(_tops(msg.output_logprobs))

    def _whole_text(self, ids: list[int]) -> str:
        text = self.detok.whole(ids) if ids else ""
        self.text += text
        return text

    def _add_text(self, new: list[int]) -> str:
        if self.detok is None or not new:
            return ""
        delta = self.detok.add(new)
        self.text += delta
        return self._check_stops(delta)

    def _check_stops(self, delta: str) -> str:
        stops = self.plan.sampling.stop
        if not stops or not delta:
            return delta
        text = self.text
        start = len(text) - len(delta)
        best = None
        for stop in stops:
            at = text.find(stop, max(0, start - len(stop) + 1))
            if at >= 0 and (best is None or at < best[0]):
                best = (at, stop)
        if best is None:
            return delta
        at, stop = best
        end = at + len(stop) if self.plan.sampling.no_stop_trim else at
        self.text = text[:end]
        self.stop_hit = True
        self.finish = {"type": "stop", "matched": stop}
        self.matched = stop
        return self.text[start:] if end > start else ""

    # -- SGLang's /generate object ---------------------------------------------------------------------

    def generate_obj(self, finished: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": self.rid,
            "finish_reason": self.finish if finished else None,
            "prompt_tokens": self.prompt_tokens,
            "weight_version": self.version if self.version is not None else "default",
            "completion_tokens": len(self.ids),
            "cached_tokens": self.cached,
        }
        if self.logprobs is not None:
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = list(self.logprobs)
            if self.tops is not None:
                meta["output_top_logprobs"] = list(self.tops)
        return {"text": self.text, "output_ids": list(self.ids), "meta_info": meta}

    @property
    def openai_finish(self) -> str | None:
        return self.finish["type"] if self.finish else None


def _finish(msg, count: int) -> dict[str, Any]:
    reason = msg.finish_reason or "stop"
    if reason == "length":
        return {"type": "length", "length": count}
    if reason == "abort":
        return {"type": "abort", "message": "Aborted"}
    matched = _matched(msg)
    out: dict[str, Any] = {"type": reason}
    if matched is not None:
        out["matched"] = matched
    return out


def _matched(msg) -> Any:
    has_oneof = _has_matched_oneof(msg.DESCRIPTOR)
    which = msg.WhichOneof("matched_stop") if has_oneof else None
    if which == "matched_token_id":
        return msg.matched_token_id
    if which == "matched_stop_str":
        return msg.matched_stop_str
    if which is None and not has_oneof:
        if msg.matched_stop_str:
            return msg.matched_stop_str
        if msg.matched_token_id:
            return msg.matched_token_id
    return None


_MATCHED_ONEOF: dict[Any, bool] = {}
_FIELDS: dict[tuple[Any, str], bool] = {}


def _has_field(descriptor, name: str) -> bool:
    """Whether this wire's message type has field ``name`` (looked up once per type: a
    ``getattr`` with a default on a field it lacks raises and catches an AttributeError inside
    on every message)."""
    key = (descriptor, name)
    known = _FIELDS.get(key)
    if known is None:
        known = _FIELDS[key] = name in descriptor.fields_by_name
    return known


def _has_matched_oneof(descriptor) -> bool:
    """Whether this wire's Complete names the match in a ``matched_stop`` oneof (looked up once
    per message type: the descriptor's oneof table is built on each access)."""
    known = _MATCHED_ONEOF.get(descriptor)
    if known is None:
        known = _MATCHED_ONEOF[descriptor] = "matched_stop" in descriptor.oneofs_by_name
    return known


class RenderedAnswer:
    """Every item of one request, rendered in its route's shape."""

    def __init__(self, plan: Plan, items: list[GenItem], model: str, rid: str) -> None:
        self.plan = plan
        self.items = items
        self.model = plan.model or model
        self.rid = rid
        self.created = int(time.time())
        self.started = [False] * len(items)

    # -- buffered ----------------------------------------------------------------------------------

    def body(self) -> bytes:
        plan = self.plan
        if plan.route not in (COMPLETIONS, CHAT):
            objs = [item.generate_obj(True) for item in self.items]
            return RenderedJson.of(objs if plan.batch else objs[0])  # stamped without a parse
        chat = plan.route == CHAT
        choices = []
        for item in self.items:
            choice: dict[str, Any] = {"index": item.index}
            if chat:
                choice["message"] = {"role": "assistant", "content": item.text}
                choice["logprobs"] = self._chat_logprobs(item)
            else:
                choice["text"] = item.text
                choice["logprobs"] = self._completion_logprobs(item)
            choice["finish_reason"] = item.openai_finish
            choice["matched_stop"] = item.matched
            choices.append(choice)
        return RenderedJson.of({**self._head(chunk=False), "choices": choices, "usage": self._usage(),
                           "metadata": {"weight_version": self._version()}})  # fmt: skip

    def _version(self) -> str:
        version = self.items[0].version if self.items else None
        return version if version is not None else "default"

    def _head(self, chunk: bool) -> dict[str, Any]:
        chat = self.plan.route == CHAT
        prefix = "chatcmpl-" if chat else "cmpl-"
        kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
        return {"id": prefix + self.rid, "object": kind, "created": self.created, "model": self.model}

    def _usage(self) -> dict[str, int]:
        prompt = self.items[0].prompt_tokens if self.items else 0
        completion = sum(len(i.ids) for i in self.items)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def _completion_logprobs(self, item: GenItem):
        if item.logprobs is None:
            return None
        return {"tokens": [None] * len(item.logprobs), "token_logprobs": [lp[0] for lp in item.logprobs],
                "token_ids": [lp[1] for lp in item.logprobs], "top_logprobs": None, "text_offset": None}  # fmt: skip

    def _chat_logprobs(self, item: GenItem):
        if item.logprobs is None:
            return None
        content = []
        for i, (lp, token, _) in enumerate(item.logprobs):
            entry: dict[str, Any] = {"token_id": token, "logprob": lp}
            if item.tops is not None and i < len(item.tops):
                entry["top_logprobs"] = [{"token_id": t, "logprob": v} for v, t, _ in item.tops[i]]
            content.append(entry)
        return {"content": content}

    # -- streamed ----------------------------------------------------------------------------------

    def event(self, item: GenItem, new: list[int], delta: str, finished: bool) -> bytes:
        """The events one message of ``item``'s stream gives (maybe none)."""
        plan = self.plan
        if plan.route not in (COMPLETIONS, CHAT):
            if not new and not delta and not finished:
                return b""
            obj = item.generate_obj(finished)
            if plan.batch:
                obj["index"] = item.index
            return sse(obj)
        out = b""
        head = self._head(chunk=True)
        if plan.route == CHAT and not self.started[item.index]:
            self.started[item.index] = True
            role = {"index": item.index, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
            out += sse({**head, "choices": [role]})
        if delta or finished:
            if plan.route == CHAT:
                choice: dict[str, Any] = {"index": item.index, "delta": {"content": delta} if delta else {}}
            else:
                choice = {"index": item.index, "text": delta, "logprobs": None}
            choice["finish_reason"] = item.openai_finish if finished else None
            if finished:
                choice["matched_stop"] = item.matched
            out += sse({**head, "choices": [choice]})
        return out

    def tail(self) -> bytes:
        """After every item finished: the usage event (when asked for) and ``[DONE]``."""
        if self.plan.route in (COMPLETIONS, CHAT) and self.plan.include_usage:
            return sse({**self._head(chunk=True), "choices": [], "usage": self._usage()}) + DONE
        return DONE

"""The values of a partial rollout (pure): a leg (one engine answer's ids, log-probs, version), the
rollout that accumulates legs and builds each continuation, the stitched answer."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import attrs

from smgrl.core.errors import LoopbackLimitExceeded
from smgrl.core.wire import json_bytes

log = logging.getLogger("smgrl.dataplane")


def _finish_type(meta: dict) -> str | None:
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):
        kind = finish.get("type")
        return kind if isinstance(kind, str) else None
    return finish if isinstance(finish, str) else None


@attrs.define(eq=False)
class Leg:
    """One engine answer (a segment of the rollout)."""

    ids: list[int]
    logprobs: list | None  # output_token_logprobs entries, None when the leg had none
    top: list | None  # output_top_logprobs entries
    text: str | None
    finish: str | None  # the finish reason's type
    version: str | None
    spans: list[tuple[str | None, int, int]]  # (version, start, end) over this leg's ids
    obj: dict
    count: int | None = None  # generated tokens when the answer carries no ids (OpenAI routes)

    @property
    def tokens(self) -> int:
        return len(self.ids) if self.count is None else self.count


def read_leg(obj: Any) -> Leg | None:
    """The leg of a 2xx single-prompt ``/generate`` answer, or None when it is not one."""
    if isinstance(obj, list) and len(obj) == 1:
        obj = obj[0]
    if not isinstance(obj, dict):
        return None
    ids = obj.get("output_ids")
    meta = obj.get("meta_info")
    if not isinstance(ids, list) or not isinstance(meta, dict) or not all(type(t) is int for t in ids):
        return None
    lps = meta.get("output_token_logprobs")
    top = meta.get("output_top_logprobs")
    version = meta.get("weight_version")
    version = str(version) if isinstance(version, (str, int)) and not isinstance(version, bool) else None
    spans: list[tuple[str | None, int, int]] = []
    history = meta.get("weight_versions")
    if isinstance(history, list) and history:
        for span in history:
            if (
                isinstance(span, dict)
                and isinstance(span.get("start"), int)
                and isinstance(span.get("end"), int)
            ):
                spans.append((str(span.get("version")), span["start"], span["end"]))
    if not spans and ids:
        spans = [(version, 0, len(ids))]
    text = obj.get("text")
    return Leg(
        ids=ids,
        logprobs=lps if isinstance(lps, list) and len(lps) == len(ids) else None,
        top=top if isinstance(top, list) and len(top) == len(ids) else None,
        text=text if isinstance(text, str) else None,
        finish=_finish_type(meta),
        version=version,
        spans=spans,
        obj=obj,
    )


@attrs.define(eq=False)
class Rollout:
    """A ``/generate`` rollout across its legs (pure state; the relay drives it)."""

    obj: dict  # the original request body
    prompt: Sequence[int]  # the iteration-1 prompt (a session turn's long prompt: an array("i"))
    cap: int | None  # the original max_new_tokens (None: uncapped)
    max_loopbacks: int
    ids: list[int] = attrs.Factory(list)
    logprobs: list | None = attrs.Factory(list)
    top: list | None = attrs.Factory(list)
    text: list[str] | None = attrs.Factory(list)
    spans: list[list] = attrs.Factory(list)  # merged [version, start, end)
    segments: list[dict] = attrs.Factory(list)
    input_logprobs: Any = None
    first: bool = True
    route: str | None = None  # the continuation's route when not the request's (chat -> completions)

    @property
    def loopbacks(self) -> int:
        return max(0, len(self.segments) - 1)

    @property
    def generated(self) -> int:
        """Tokens generated so far, every leg."""
        return len(self.ids)

    def limit_exceeded(self) -> LoopbackLimitExceeded:
        """The error for one abort more than ``--max-loopbacks`` allows (buffered and streamed
        relays alike)."""
        return LoopbackLimitExceeded(
            f"the rollout was aborted by weight syncs {self.loopbacks + 1} times; "
            f"--max-loopbacks is {self.max_loopbacks}",
            tokens=self.generated,
        )

    @property
    def kept(self) -> int:
        """Tokens decoded before the last loopback: what the loopback saved from regenerating."""
        return self.segments[-1]["start"] if self.segments else 0

    def add(self, leg: Leg, instance, op_id: str | None) -> None:
        start = len(self.ids)
        self.ids.extend(leg.ids)
        if self.logprobs is not None:
            self.logprobs = self.logprobs + leg.logprobs if leg.logprobs is not None else None
        if self.top is not None:
            self.top = self.top + leg.top if leg.top is not None else None
        if self.text is not None:
            self.text = self.text + [leg.text] if leg.text is not None else None
        if self.first:
            self.input_logprobs = leg.obj.get("meta_info", {}).get("input_token_logprobs")
        self._segment(leg, instance, op_id, start, len(self.ids))

    def _segment(self, leg: Leg, instance, op_id: str | None, start: int, end: int) -> None:
        """The leg's version spans (merged with the last when contiguous) and its segment,
        tokens ``start``-``end`` of the rollout (every rollout kind's ``add`` ends here)."""
        for version, s, e in leg.spans:
            if self.spans and self.spans[-1][0] == version and self.spans[-1][2] == start + s:
                self.spans[-1][2] = start + e
            else:
                self.spans.append([version, start + s, start + e])
        self.first = False
        self.segments.append(
            {
                "iteration": len(self.segments),
                "worker_id": instance.worker_id,
                "url": instance.url,
                "dp_rank": instance.dp_rank or 0,
                "version": leg.version,
                "start": start,
                "end": end,
                "finish_reason": leg.finish,
                "op_id": op_id,
            }
        )

    def remaining(self) -> int | None:
        return None if self.cap is None else max(0, self.cap - self.generated)

    def read(self, obj: Any) -> Leg | None:
        """A continuation leg's answer."""
        return read_leg(obj)

    def adapt(self, body: bytes | None = None):
        """``DataPlane.dispatch``'s ``adapt`` for a continuation (``body``, else
        ``continuation()``): None (the request's own route), or the other route a
        continuation takes (a chat rollout continues as a completion)."""
        if self.route is None:
            return None
        route = self.route
        body = self.continuation() if body is None else body
        return lambda entry: (route, body)

    def continuation(self) -> bytes:
        """The next leg's body: the original prompt plus every id so far, the cap reduced."""
        obj = dict(self.obj)
        obj["input_ids"] = [*self.prompt, *self.ids]  # the prompt may be an array("i")
        if self.cap is not None:
            params = dict(obj.get("sampling_params") or {})
            params["max_new_tokens"] = self.remaining()
            obj["sampling_params"] = params
        return json_bytes(obj)

    def stitch(self, last: Leg, *, length_reached: bool = False) -> dict:
        """The final answer: the last leg's object carrying the whole rollout."""
        out = dict(last.obj)
        meta = dict(out.get("meta_info") or {})
        out["output_ids"] = list(self.ids)
        if self.text is not None:
            out["text"] = "".join(self.text)
        meta["prompt_tokens"] = len(self.prompt)
        meta["completion_tokens"] = len(self.ids)
        if self.logprobs is not None and "output_token_logprobs" in meta:
            meta["output_token_logprobs"] = self.logprobs
        else:
            meta.pop("output_token_logprobs", None)
        if self.top is not None and "output_top_logprobs" in meta:
            meta["output_top_logprobs"] = self.top
        else:
            meta.pop("output_top_logprobs", None)
        if self.input_logprobs is not None:
            meta["input_token_logprobs"] = self.input_logprobs
        meta["weight_versions"] = [{"version": v, "start": s, "end": e} for v, s, e in self.spans]
        meta["segments"] = [dict(s) for s in self.segments]
        if length_reached:
            meta["finish_reason"] = {"type": "length", "length": self.cap}
        out["meta_info"] = meta
        return out


def start(obj: Any, single: bool, max_loopbacks: int, tokenizer=None) -> Rollout | None:
    """A rollout that may loop back, or None (batch, disabled; a ``text`` prompt without the
    gateway's tokenizer). With the tokenizer (``--tokenizer-path``) a ``text`` prompt is
    tokenized and continued as ``input_ids``."""
    if max_loopbacks <= 0 or not single or not isinstance(obj, dict):
        return None
    text = obj.get("text")
    if isinstance(text, str) and tokenizer is not None and obj.get("input_ids") is None:
        obj = {k: v for k, v in obj.items() if k != "text"}
        obj["input_ids"] = tokenizer.encode(text)
    ids = obj.get("input_ids")
    if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
        return None
    params = obj.get("sampling_params")
    cap = params.get("max_new_tokens") if isinstance(params, dict) else None
    if cap is not None and (type(cap) is not int or cap < 0):
        return None
    return Rollout(obj=obj, prompt=list(ids), cap=cap, max_loopbacks=max_loopbacks)


@attrs.define(eq=False)
class Answer:
    status: int
    dispatched: Any  # the last leg's Dispatch (head, entry)
    head: list
    data: bytes


def versioned(leg: Leg, version: str | None) -> Leg:
    """``leg`` with ``version`` where the engine named none."""
    if leg.version is not None or version is None:
        return leg
    return attrs.evolve(
        leg, version=version, spans=[(v if v is not None else version, a, b) for v, a, b in leg.spans]
    )


def preview(rollout: Rollout) -> Rollout:
    """A copy to stitch a continuation leg's (cumulative) event with, keeping the original."""
    return attrs.evolve(
        rollout,
        ids=list(rollout.ids),
        logprobs=None if rollout.logprobs is None else list(rollout.logprobs),
        top=None if rollout.top is None else list(rollout.top),
        text=None if rollout.text is None else list(rollout.text),
        spans=[list(s) for s in rollout.spans],
        segments=[dict(s) for s in rollout.segments],
    )


CUMULATIVE, INCREMENTAL = "cumulative", "incremental"


def stream_mode(leg: Leg) -> str | None:
    """How an engine streams ``/generate``, read off one event, or None (not yet known): SGLang's
    default repeats every id so far in each event (``output_ids`` as long as the cumulative
    ``meta_info.completion_tokens``); with ``--incremental-streaming-output`` (and TokenSpeed's
    shim in front of it) an event carries only the new ids. One event of a single token says
    nothing; an event without the counter is taken as cumulative (the default)."""
    count = leg.obj.get("meta_info", {}).get("completion_tokens")
    if type(count) is not int:
        return CUMULATIVE
    if len(leg.ids) < count:
        return INCREMENTAL
    return CUMULATIVE if count > 1 else None


def extend(acc: Leg | None, leg: Leg) -> Leg:
    """An incremental stream's leg so far: ``acc`` (None at first) followed by ``leg``'s new
    tokens; the latest event's finish, version and object."""
    if acc is None:
        acc = Leg(ids=[], logprobs=[], top=[], text="", finish=None, version=None, spans=[], obj={})
    start = len(acc.ids)
    acc.ids = acc.ids + leg.ids
    acc.logprobs = None if acc.logprobs is None or leg.logprobs is None else acc.logprobs + leg.logprobs
    acc.top = None if acc.top is None or leg.top is None else acc.top + leg.top
    acc.text = None if acc.text is None or leg.text is None else acc.text + leg.text
    acc.finish, acc.obj = leg.finish, leg.obj
    acc.version = leg.version or acc.version
    history = leg.obj.get("meta_info", {}).get("weight_versions")
    if isinstance(history, list) and history:
        acc.spans = list(leg.spans)  # the engine's spans cover the whole leg
    elif leg.ids:
        v = leg.version
        if acc.spans and acc.spans[-1][0] == v and acc.spans[-1][2] == start:
            acc.spans[-1] = (v, acc.spans[-1][1], start + len(leg.ids))
        else:
            acc.spans.append((v, start, start + len(leg.ids)))
    return acc

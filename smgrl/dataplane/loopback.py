"""Partial-rollout loopback: a rollout aborted by a weight sync continues where it stopped.

PSRL's gateway keeps every token an engine decoded before a sync aborted the request
(docs/data-plane.md, "Partial-rollout loopback", without the two defects it names). Here:

- **Which aborts**: an engine's ``finish_reason: abort`` is looped back only when a control call
  that aborts running requests (``smgrl.core.aborts``) went through this gateway to that engine
  and had not finished when the request was sent (``FleetState.aborts``, from the journal).
  A trainer's own
  ``abort_request``, an abort sent straight to the engine, or a client that disconnects is a
  deliberate cancellation: the abort is answered as the engine gave it.
- **Which requests**: ``/generate`` with ``input_ids`` and one prompt (the gateway has no
  tokenizer: ``text`` prompts, batches and the OpenAI routes answer the engine's abort).
- **The continuation**: prompt = the ORIGINAL prompt + every id accumulated so far (never the
  previous leg's prompt: no duplicated tokens on a second abort), ``max_new_tokens`` = the
  original cap minus what was produced (uncapped stays uncapped), pinned to the instance that
  aborted (eligible again once its sync completes) or any instance at the request's pinned
  version floor (staged selection, ``routed.loop_hint``).
- **The answer**: one object as if one engine had generated it: ``output_ids`` and
  ``output_token_logprobs`` of every leg, ``text`` concatenated, ``prompt_tokens`` the original
  prompt's length, ``completion_tokens`` the total, ``weight_versions`` per-token version spans,
  and ``segments``: per leg the engine, DP rank, loopback iteration, token span and the
  operation whose abort ended it.
- **Bounded**: at most ``--max-loopbacks`` per request, then 503 ``loopback_limit_exceeded``.
- **Journaled**: each looped-back request is one ``dataplane.request_looped_back`` event.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs
import trio

from journal.events import RequestLoopedBack
from smgrl.core import Version
from smgrl.dataplane.stamp import TokenTail, first_event_version, stream_version
from smgrl.errors import DataPlaneError, LoopbackLimitExceeded, UpstreamUnreachable
from smgrl.routing import InstanceId

log = logging.getLogger("smgrl.dataplane")


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


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
    prompt: list[int]  # the iteration-1 prompt
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
        obj["input_ids"] = self.prompt + self.ids
        if self.cap is not None:
            params = dict(obj.get("sampling_params") or {})
            params["max_new_tokens"] = self.remaining()
            obj["sampling_params"] = params
        return _dumps(obj)

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


def loopable(req, max_loopbacks: int, tokenizer) -> bool:
    """May this request loop back? A single-prompt ``/generate`` with ``input_ids``; with the
    gateway's tokenizer also a ``text`` prompt and the OpenAI routes (``loopback_openai``)."""
    if max_loopbacks <= 0 or not req.single:
        return False
    if req.route == "/generate":
        return isinstance(req.prefix, tuple) or tokenizer is not None
    return tokenizer is not None


def worth_a_look(req, status: int, data: bytes, max_loopbacks: int, tokenizer=None) -> bool:
    """Cheap test on every buffered answer: could this be a rollout that may loop back and
    that an engine aborted? Only then is anything parsed."""
    return 200 <= status < 300 and b'"abort"' in data and loopable(req, max_loopbacks, tokenizer)


def reader(req):
    """How a leg is read from an answer of ``req``'s route."""
    if req.route == "/generate":
        return read_leg
    from smgrl.dataplane import loopback_openai

    return loopback_openai.read_leg


def begin(req, body: bytes, max_loopbacks: int, tokenizer) -> Rollout | None:
    """The rollout of ``req`` (its first leg just ended in a sync's abort), or None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if req.route == "/generate":
        return start(obj, req.single, max_loopbacks, tokenizer)
    from smgrl.dataplane import loopback_openai

    return loopback_openai.start(req.route, obj, max_loopbacks, tokenizer)


async def run_buffered(
    dataplane,
    req,
    body: bytes,
    headers,
    model: str,
    bounds: dict,
    make_head,
    journal,
    first: Answer,
    tokenizer=None,
) -> Answer:
    """Continue a buffered rollout whose first answer is ``first`` while its legs end in a
    sync's abort; answer the stitched rollout. ``make_head(dispatched)`` builds the head."""
    routed = bounds["routed"]
    answer = first
    rollout: Rollout | None = None
    outcome = "cancelled"
    read = reader(req)
    try:
        while True:
            try:
                leg = read(json.loads(answer.data)) if 200 <= answer.status < 300 else None
            except ValueError:
                leg = None
            if leg is None:
                outcome = "failed"
                return answer
            dispatched = answer.dispatched
            instance = dispatched.instance
            leg = versioned(leg, current_version(dataplane, dispatched))
            ops = (
                dataplane.fleet.aborts.since(instance.base_url, dispatched.seq)
                if leg.finish == "abort"
                else []
            )
            if rollout is None:
                if not ops:
                    return answer  # not a sync's abort: answered as the engine gave it
                rollout = begin(req, body, dataplane.cfg.dataplane.max_loopbacks, tokenizer)
                if rollout is None:
                    return answer
                read = rollout.read  # a chat rollout's continuations answer as completions
            rollout.add(leg, instance, ops[0] if ops else None)
            if not ops:
                outcome = "aborted" if leg.finish == "abort" else "completed"
                answer.data = _dumps(rollout.stitch(leg))
                return answer
            if rollout.remaining() == 0:
                outcome = "completed"
                answer.data = _dumps(rollout.stitch(leg, length_reached=True))
                return answer
            if rollout.loopbacks >= rollout.max_loopbacks:
                outcome = "limit_exceeded"
                raise rollout.limit_exceeded()
            prepare(dataplane, routed, rollout, instance, leg, ops)
            async with dataplane.dispatch(
                req,
                rollout.continuation(),
                headers,
                model=model,
                buffered=True,
                adapt=rollout.adapt(),
                **bounds,
            ) as dispatched:
                answer = Answer(
                    dispatched.response.status, dispatched, make_head(dispatched), dispatched.body or b""
                )
    except DataPlaneError:
        if outcome == "cancelled":
            outcome = "failed"
        raise
    finally:
        await record(journal, rollout, routed, req, model, outcome)


def current_version(dataplane, dispatched) -> str | None:
    """The routing table's version NOW for the instance that served ``dispatched``: for an
    answer that names no version. A continuation sent while its engine's pause was not yet
    confirmed waited at the engine and ran on the weights the table shows after the sync, not
    those it showed at dispatch."""
    instance = dispatched.instance
    slot = dataplane.table().models.get(instance.model)
    for entry in slot.entries if slot is not None else ():
        if entry.instance.worker_id == instance.worker_id:
            return entry.version
    return dispatched.entry.version


def versioned(leg: Leg, version: str | None) -> Leg:
    """``leg`` with ``version`` where the engine named none."""
    if leg.version is not None or version is None:
        return leg
    return attrs.evolve(
        leg, version=version, spans=[(v if v is not None else version, a, b) for v, a, b in leg.spans]
    )


def prepare(dataplane, routed, rollout: Rollout, instance, leg: Leg, ops=()) -> None:
    """Route the next leg: once the syncs that aborted it (``ops``) have finished, back to the
    instance that aborted (eligible again once its sync completes), or any instance at the
    pinned version floor: never older weights."""
    routed.after_ops = tuple(ops)
    dataplane.metrics.loopbacks.inc()
    dataplane.metrics.tokens_kept.inc(leg.tokens)
    # Per-instance tokens: the aborted leg's go to the instance that decoded them; the stitched
    # answer then reports the total, of which only the part after ``routed.kept`` is new.
    dataplane.count_tokens(instance.worker_id, leg.tokens)
    routed.kept += leg.tokens
    routed.loop_hint = InstanceId(instance.group, instance.dp_rank or 0)
    routed.loopbacks += 1
    first = rollout.segments[0]["version"]
    if routed.floor is None and first is not None and first != "default":
        routed.floor = Version.parse(first)
        routed.pinned = routed.pinned or first


async def record(journal, rollout: Rollout | None, routed, req, model: str, outcome: str) -> None:
    """One ``dataplane.request_looped_back`` event per looped-back request (every route): one
    whose rollout went on after an abort (a continuation was sent, ``routed.loopbacks``, even if
    that continuation then failed), or that the loopback bound stopped. Shielded and bounded: it
    runs while the request may be cancelled (client gone), and a loopback that happened must be
    in the journal; a journal stuck for 5 s is given up (logged)."""
    if journal is None or rollout is None:
        return
    if not (rollout.loopbacks or routed.loopbacks or outcome == "limit_exceeded"):
        return  # never aborted by a sync: nothing was looped back
    event = RequestLoopedBack(
        request_id=routed.meta.request_id,
        route=req.route,
        model=model,
        prompt_tokens=len(rollout.prompt),
        generated_tokens=rollout.generated,
        tokens_kept=rollout.kept,
        loopbacks=rollout.loopbacks,
        outcome=outcome,
        op_ids=tuple(dict.fromkeys(s["op_id"] for s in rollout.segments if s["op_id"])),
        segments=tuple(rollout.segments),
    )
    with trio.CancelScope(shield=True), trio.move_on_after(5) as scope:
        try:
            await journal.append("dataplane", event)
        except Exception as exc:  # noqa: BLE001 - the answer must not fail on the record
            log.warning("could not journal a partial-rollout loopback: %r", exc)
    if scope.cancelled_caught:
        log.warning("journaling a partial-rollout loopback timed out")


def streamable(req, max_loopbacks: int, tokenizer=None) -> bool:
    """A streamed single-prompt ``/generate`` that may loop back (``input_ids``; a ``text``
    prompt with the gateway's tokenizer)."""
    return req.route == "/generate" and loopable(req, max_loopbacks, tokenizer)


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


class _Seam:
    """Relays one leg's SSE events; holds back a sync's abort (and its ``[DONE]``) so the client
    never sees the seam, and rewrites the events once the rollout has looped back, in the
    engine's own streaming mode (``stream_mode``): cumulative events are re-stitched to carry
    the whole rollout from its first token; incremental ones keep their new tokens and get the
    rollout's counters. The mode is learnt from the first leg's events (a couple of parses) and
    shared across legs; an incremental leg is parsed event by event (its ids are needed to
    continue it)."""

    def __init__(self, dataplane, rollout_ref: list, dispatched, body: bytes, tokenizer=None) -> None:
        self.dataplane = dataplane
        self.tokenizer = tokenizer
        self.ref = rollout_ref  # [Rollout | None, mode | None]: shared across legs
        self.dispatched = dispatched
        self.body = body
        self.held: tuple[Leg, list[str]] | None = None  # the sync's abort of this leg
        self.last: Leg | None = None  # the leg so far, once the rollout looped back
        self.acc: Leg | None = None  # incremental mode: this leg's tokens so far
        self.seen: list[Leg] = []  # events parsed before the mode was known
        self.buf = b""

    def feed(self, chunk: bytes) -> bytes:
        complete, self.buf = complete_events(self.buf, chunk)
        if not complete:
            return b""
        if self.ref[0] is None and self.ref[1] == CUMULATIVE and b'"abort"' not in complete:
            return complete  # the common case: nothing to look at
        out = []
        for event in complete.split(b"\n\n")[:-1]:
            out.append(self._event(event))
        return b"".join(out)

    def flush(self) -> bytes:
        rest, self.buf = self.buf, b""
        return rest

    def _learn(self, leg: Leg) -> None:
        """Track the leg: learn the mode, accumulate an incremental leg."""
        mode = self.ref[1]
        if mode is None:
            self.seen.append(leg)
            mode = self.ref[1] = stream_mode(leg)
            if mode is None:
                return
            if mode == CUMULATIVE:
                self.seen = []
                return
            for earlier in self.seen:
                self.acc = extend(self.acc, earlier)
            self.seen = []
            return
        if mode == INCREMENTAL:
            self.acc = extend(self.acc, leg)

    def _event(self, event: bytes) -> bytes:
        if event.startswith(b"data: [DONE]"):
            return b"" if self.held is not None else event + b"\n\n"
        rollout = self.ref[0]
        if not event.startswith(b"data: {"):
            return event + b"\n\n"
        try:
            leg = read_leg(json.loads(event[6:]))
        except ValueError:
            leg = None
        if leg is None:
            return event + b"\n\n"
        self._learn(leg)
        incremental = self.ref[1] == INCREMENTAL
        whole = self.acc if incremental else leg  # this leg so far
        if leg.finish == "abort":
            instance = self.dispatched.instance
            ops = self.dataplane.fleet.aborts.since(instance.base_url, self.dispatched.seq)
            if ops:
                if rollout is None:
                    rollout = self.ref[0] = start(
                        json.loads(self.body),
                        True,
                        self.dataplane.cfg.dataplane.max_loopbacks,
                        self.tokenizer,
                    )
                if rollout is not None:
                    self.held = (whole if whole is not None else leg, ops)
                    if incremental and leg.ids:
                        # Its new tokens are the client's: sent as an ordinary event.
                        return self._incremental(rollout, leg, whole, final=False)
                    return b""
        if rollout is None:
            return event + b"\n\n"
        self.last = whole
        if incremental:
            return self._incremental(rollout, leg, whole, final=leg.finish is not None)
        tmp = preview(rollout)
        tmp.add(leg, self.dispatched.instance, None)
        return b"data: " + _dumps(tmp.stitch(leg)) + b"\n\n"

    def _incremental(self, rollout: Rollout, leg: Leg, whole: Leg, *, final: bool) -> bytes:
        """An incremental event of a looped-back rollout: its new tokens, the rollout's counters;
        the last one also the rollout's version spans and segments."""
        out = dict(leg.obj)
        meta = dict(out.get("meta_info") or {})
        meta["prompt_tokens"] = len(rollout.prompt)
        meta["completion_tokens"] = rollout.generated + len(whole.ids)
        if final:
            tmp = preview(rollout)
            tmp.add(whole, self.dispatched.instance, None)
            meta["weight_versions"] = [{"version": v, "start": a, "end": b} for v, a, b in tmp.spans]
            meta["segments"] = [dict(seg) for seg in tmp.segments]
        else:
            meta["finish_reason"] = None
        out["meta_info"] = meta
        return b"data: " + _dumps(out) + b"\n\n"


async def relay_failed_leg(send, started: bool, status: int, chunks) -> None:
    """A leg the engine answered non-2xx (both stream loopbacks). The first one is relayed as it
    is (its head, with the engine's status, already sent) and the stream ends; a continuation
    cannot change the 200 already sent: it raises, ending the stream as an unreachable upstream
    (the rollout's outcome is ``failed`` either way; the caller records it)."""
    if started:
        raise UpstreamUnreachable(f"a continuation leg was answered {status}")
    async for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def complete_events(pending: bytes, chunk: bytes) -> tuple[bytes, bytes]:
    """``pending + chunk`` split into its complete SSE events (each ending in a blank line; b""
    if none) and the partial one left to buffer."""
    data = pending + chunk if pending else chunk
    end = data.rfind(b"\n\n")
    if end < 0:
        return b"", data
    return data[: end + 2], data[end + 2 :]


async def run_stream(
    relay, dataplane, req, body: bytes, headers, model: str, bounds: dict, journal, tokenizer=None
) -> None:
    """A streamed ``/generate`` across its legs: the head goes once (the first leg's), each
    leg's events are relayed as they come (rewritten after a loopback), a sync's abort starts
    the next leg instead of ending the stream."""
    routed = bounds["routed"]
    send = relay.send
    ref: list = [None, None]  # [the Rollout once looped back, the engine's stream mode]
    outcome = "cancelled"
    leg_body = body
    try:
        while True:
            async with dataplane.dispatch(
                req, leg_body, headers, model=model, buffered=False, **bounds
            ) as dispatched:
                response = dispatched.response
                ok = 200 <= response.status < 300
                chunks = response.aiter_chunks()
                first = b""
                started = relay.started
                if not started:
                    version = stream_version(dispatched.entry.version)
                    if ok:
                        # As the plain relay: the head waits for the first event (its version).
                        first = await anext(chunks, b"")
                        version = first_event_version(first) or version
                    await relay.start_stream(dispatched, version)
                if not ok:
                    outcome = "failed"
                    await relay_failed_leg(send, started, response.status, chunks)
                    return
                seam = _Seam(dataplane, ref, dispatched, body, tokenizer)
                tail = TokenTail()  # what the relayed events say was generated (stitched: in all)
                for chunk in (first,) if first else ():
                    out = seam.feed(chunk)
                    if out:
                        tail.see(out)
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                async for chunk in chunks:
                    out = seam.feed(chunk)
                    if out:
                        tail.see(out)
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                rest = seam.flush()
                tail.see(rest)
            rollout = ref[0]
            if seam.held is None:
                if rest:
                    await send({"type": "http.response.body", "body": rest, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                outcome = "completed"
                tokens = tail.tokens
                dataplane.count_tokens(dispatched.instance.worker_id, tokens and max(0, tokens - routed.kept))
                if rollout is not None and seam.last is not None:
                    rollout.add(seam.last, dispatched.instance, None)  # the final segment
                return
            leg, ops = seam.held
            rollout.add(leg, dispatched.instance, ops[0])
            if rollout.remaining() == 0:
                final = rollout.stitch(leg, length_reached=True)
                if ref[1] == INCREMENTAL:  # its tokens went out already, event by event
                    meta = final["meta_info"]
                    for key in ("output_token_logprobs", "output_top_logprobs"):
                        if key in meta:
                            meta[key] = []
                    final = {**final, "output_ids": [], "text": ""}
                dataplane.count_tokens(dispatched.instance.worker_id, len(leg.ids))
                out = b"data: " + _dumps(final) + b"\n\ndata: [DONE]\n\n"
                await send({"type": "http.response.body", "body": out, "more_body": False})
                outcome = "completed"
                return
            if rollout.loopbacks >= rollout.max_loopbacks:
                outcome = "limit_exceeded"
                raise rollout.limit_exceeded()
            prepare(dataplane, routed, rollout, dispatched.instance, leg, ops)
            leg_body = rollout.continuation()
    except DataPlaneError:
        if outcome == "cancelled":
            outcome = "failed"
        raise
    finally:
        rollout = ref[0]
        await record(journal, rollout, routed, req, model, outcome)

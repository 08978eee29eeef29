"""Streamed OpenAI requests across a partial-rollout loopback (with ``--tokenizer-path``).

OpenAI streams carry deltas: the relay passes the first leg's events through (``system_fingerprint``
stamped, as the plain relay does), adding up the text. When a sync through the gateway aborts the
leg (``finish_reason: "abort"``) the abort event, the leg's ``usage`` event and its ``[DONE]`` are
held back, and the continuation (``loopback.openai.TextRollout``: a token-in ``/v1/completions``,
asked for its usage) streams on: each of its events is rewritten into the first leg's shape (a
``chat.completion.chunk`` with ``delta.content``, or a ``text_completion`` chunk), with the first
leg's ``id``, ``created`` and ``model``. The last event's choice carries ``weight_versions`` and
``segments``; a client that asked for ``stream_options.include_usage`` gets one usage event with
the original prompt's tokens and the total generated. A leg's token count is its ``usage`` when
the engine streamed one, else its text re-tokenized.
"""

from __future__ import annotations

import json
from typing import Any

from smgrl.core.errors import DataPlaneError
from smgrl.core.wire import json_bytes
from smgrl.dataplane.loopback.decide import loop_causes
from smgrl.dataplane.loopback.legs import current_version, prepare, record
from smgrl.dataplane.loopback.model import Leg, preview
from smgrl.dataplane.loopback.openai import start as start_openai
from smgrl.dataplane.loopback.stream import complete_events, relay_failed_leg
from smgrl.dataplane.stamp import stream_version


class _StreamLeg:
    """One leg's stream: its text and token count, and whether a sync's abort ended it."""

    def __init__(self) -> None:
        self.text = ""
        self.count: int | None = None  # from a usage event
        self.finish: str | None = None
        self.held = False  # a sync's abort: the rest of this leg is not relayed
        self.ops: list[str] = []


class _ChunkSeam:
    def __init__(self, dataplane, state: dict, dispatched, version: str) -> None:
        self.dataplane = dataplane
        self.state = state  # shared across legs: rollout, first event's shape, usage wanted
        self.dispatched = dispatched
        self.version = version
        self.leg = _StreamLeg()
        self.buf = b""
        self.final: tuple[str, str] | None = None  # a looped-back stream's last event, held
        self.versioned = False

    def feed(self, chunk: bytes) -> bytes:
        complete, self.buf = complete_events(self.buf, chunk)
        if not complete:
            return b""
        return b"".join(self._event(e) for e in complete.split(b"\n\n")[:-1])

    def flush(self) -> bytes:
        rest, self.buf = self.buf, b""
        return rest

    def _event(self, event: bytes) -> bytes:
        leg = self.leg
        if event.startswith(b"data: [DONE]"):
            return b"" if leg.held or self.state["rollout"] is not None else event + b"\n\n"
        if not event.startswith(b"data: {"):
            return event + b"\n\n"
        try:
            obj = json.loads(event[6:])
        except ValueError:
            return event + b"\n\n"
        if not isinstance(obj, dict) or "error" in obj:
            return event + b"\n\n"
        if not self.versioned:
            # OpenAI chunks name no version: the table's when the leg's first event arrives
            # (a continuation sent while its engine's pause was not yet confirmed waited at
            # the engine and runs on the weights the table shows now, not at dispatch).
            self.versioned = True
            self.version = stream_version(current_version(self.dataplane, self.dispatched) or self.version)
        usage = obj.get("usage")
        choices = obj.get("choices") or []
        if not choices and isinstance(usage, dict):
            count = usage.get("completion_tokens")
            leg.count = count if type(count) is int else None
            if leg.held or self.state["rollout"] is not None:
                return b""  # a looped-back stream's usage is the relay's to write (``run``)
            obj["system_fingerprint"] = self.version
            return b"data: " + json_bytes(obj) + b"\n\n"
        choice = choices[0] if isinstance(choices[0], dict) else {}
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        text = text if isinstance(text, str) else ""
        leg.text += text
        finish = choice.get("finish_reason")
        if self.state["first"] is None:
            self.state["first"] = obj  # the shape every later event takes
        if finish == "abort" and not leg.held:
            instance = self.dispatched.instance
            ops = loop_causes(self.dataplane, self.state.get("routed"), instance, self.dispatched.seq)
            if ops is not None and self.state["rollout"] is None:
                self.state["rollout"] = self.state["start"]()
            if ops is not None and self.state["rollout"] is not None:
                leg.held, leg.ops = True, ops
                return self._out(text, None) if text else b""
        if leg.held:
            return b""
        leg.finish = finish if isinstance(finish, str) else None
        if self.state["rollout"] is None:
            obj["system_fingerprint"] = self.version
            return b"data: " + json_bytes(obj) + b"\n\n"
        if leg.finish is not None:
            # The last event names the leg's tokens: sent once the leg's usage is in (``run``).
            self.final = (text, leg.finish)
            return b""
        return self._out(text, None)

    def _out(self, text: str, finish: str | None, done=None) -> bytes:
        """An event of a looped-back stream, in the first leg's shape; the last one (``finish``)
        names the version spans and segments of ``done`` (the whole rollout), else of the
        rollout so far plus this leg."""
        first = self.state["first"]
        chat = first.get("object") == "chat.completion.chunk"
        choice: dict[str, Any] = {"index": 0}
        if chat:
            choice["delta"] = {"content": text} if text else {}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        choice["finish_reason"] = finish
        if finish is not None:
            tmp = done
            if tmp is None:
                tmp = preview(self.state["rollout"])
                tmp.add(self.as_leg(), self.dispatched.instance, None)
            choice["weight_versions"] = [{"version": v, "start": a, "end": b} for v, a, b in tmp.spans]
            choice["segments"] = [dict(s) for s in tmp.segments]
        out = {k: first[k] for k in ("id", "object", "created", "model") if k in first}
        out["system_fingerprint"] = self.version
        out["choices"] = [choice]
        return b"data: " + json_bytes(out) + b"\n\n"

    def as_leg(self) -> Leg:
        leg = self.leg
        count = leg.count if leg.count is not None else len(self.state["tokenizer"].encode(leg.text))
        version = self.version
        return Leg(
            ids=[],
            logprobs=None,
            top=None,
            text=leg.text,
            finish=leg.finish or ("abort" if leg.held else None),
            version=version,
            spans=[(version, 0, count)] if count else [],
            obj=self.state["first"] or {},
            count=count,
        )


def _usage_event(state: dict, rollout) -> bytes:
    first = state["first"] or {}
    out = {k: first[k] for k in ("id", "object", "created", "model") if k in first}
    prompt = rollout.prompt_tokens if isinstance(rollout.prompt_tokens, int) else len(rollout.prompt)
    out["choices"] = []
    out["usage"] = {
        "prompt_tokens": prompt,
        "completion_tokens": rollout.generated,
        "total_tokens": prompt + rollout.generated,
    }
    return b"data: " + json_bytes(out) + b"\n\n"


async def run(
    relay, dataplane, req, body: bytes, headers, model: str, bounds: dict, journal, tokenizer
) -> None:
    """A streamed OpenAI request that may loop back: relayed leg by leg, one stream for the
    client."""
    routed = bounds["routed"]
    send = relay.send
    try:
        obj = json.loads(body)
    except ValueError:
        obj = {}
    options = obj.get("stream_options") if isinstance(obj, dict) else None
    state: dict[str, Any] = {
        "rollout": None,
        "first": None,
        "tokenizer": tokenizer,
        "usage": isinstance(options, dict) and options.get("include_usage") is True,
        "routed": routed,
        "start": lambda: start_openai(req.route, obj, dataplane.cfg.dataplane.max_loopbacks, tokenizer),
    }
    leg_body, adapt = body, None
    outcome = "cancelled"
    try:
        while True:
            async with dataplane.dispatch(
                req, leg_body, headers, model=model, buffered=False, adapt=adapt, **bounds
            ) as dispatched:
                response = dispatched.response
                ok = 200 <= response.status < 300
                version = stream_version(dispatched.entry.version)
                started = relay.started
                if not started:
                    await relay.start_stream(dispatched, version)
                if not ok:
                    outcome = "failed"
                    await relay_failed_leg(send, started, response.status, response.aiter_chunks())
                    return
                seam = _ChunkSeam(dataplane, state, dispatched, version)
                async for chunk in response.aiter_chunks():
                    out = seam.feed(chunk)
                    if out:
                        await send({"type": "http.response.body", "body": out, "more_body": True})
                rest = seam.flush()
            rollout = state["rollout"]
            leg = seam.as_leg()
            if not seam.leg.held:
                dataplane.count_tokens(dispatched.instance.worker_id, leg.tokens)
                tail = rest
                if rollout is not None:
                    rollout.add(leg, dispatched.instance, None)  # the final segment
                    text, finish = seam.final or ("", leg.finish or "stop")
                    tail += seam._out(text, finish, done=rollout)
                    if state["usage"]:
                        tail += _usage_event(state, rollout)
                    tail += b"data: [DONE]\n\n"
                await send({"type": "http.response.body", "body": tail, "more_body": False})
                outcome = "completed"
                return
            rollout.add(leg, dispatched.instance, seam.leg.ops[0] if seam.leg.ops else None)
            if rollout.remaining() == 0:
                dataplane.count_tokens(dispatched.instance.worker_id, leg.tokens)
                final = seam._out("", "length", done=rollout)
                if state["usage"]:
                    final += _usage_event(state, rollout)
                await send(
                    {"type": "http.response.body", "body": final + b"data: [DONE]\n\n", "more_body": False}
                )
                outcome = "completed"
                return
            if rollout.loopbacks >= rollout.max_loopbacks:
                outcome = "limit_exceeded"
                raise rollout.limit_exceeded()
            prepare(dataplane, routed, rollout, dispatched.instance, leg, seam.leg.ops)  # counts its tokens
            leg_body = rollout.continuation(stream=True)
            adapt = rollout.adapt(leg_body)
    except DataPlaneError:
        if outcome == "cancelled":
            outcome = "failed"
        raise
    finally:
        rollout = state["rollout"]
        await record(journal, rollout, routed, req, model, outcome)

"""A streamed rollout's loopbacks: relay the events, hold back the abort, stitch the continuation
onto the same stream."""

from __future__ import annotations

import json
import logging

from smgrl.core.errors import DataPlaneError, UpstreamUnreachable
from smgrl.core.wire import json_bytes
from smgrl.dataplane.loopback.decide import loop_causes
from smgrl.dataplane.loopback.legs import prepare, record
from smgrl.dataplane.loopback.model import (
    CUMULATIVE,
    INCREMENTAL,
    Leg,
    Rollout,
    extend,
    preview,
    read_leg,
    start,
    stream_mode,
)
from smgrl.dataplane.stamp import TokenTail, first_event_version, stream_version

log = logging.getLogger("smgrl.dataplane")


class _Seam:
    """Relays one leg's SSE events; holds back a sync's abort (and its ``[DONE]``) so the client
    never sees the seam, and rewrites the events once the rollout has looped back, in the
    engine's own streaming mode (``stream_mode``): cumulative events are re-stitched to carry
    the whole rollout from its first token; incremental ones keep their new tokens and get the
    rollout's counters. The mode is learnt from the first leg's events (a couple of parses) and
    shared across legs; an incremental leg is parsed event by event (its ids are needed to
    continue it)."""

    def __init__(
        self, dataplane, rollout_ref: list, dispatched, body: bytes, tokenizer=None, routed=None
    ) -> None:
        self.dataplane = dataplane
        self.routed = routed
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
            ops = loop_causes(self.dataplane, self.routed, instance, self.dispatched.seq)
            if ops is not None:
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
        return b"data: " + json_bytes(tmp.stitch(leg)) + b"\n\n"

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
        return b"data: " + json_bytes(out) + b"\n\n"


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
                seam = _Seam(dataplane, ref, dispatched, body, tokenizer, routed)
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
            rollout.add(leg, dispatched.instance, ops[0] if ops else None)
            if rollout.remaining() == 0:
                final = rollout.stitch(leg, length_reached=True)
                if ref[1] == INCREMENTAL:  # its tokens went out already, event by event
                    meta = final["meta_info"]
                    for key in ("output_token_logprobs", "output_top_logprobs"):
                        if key in meta:
                            meta[key] = []
                    final = {**final, "output_ids": [], "text": ""}
                dataplane.count_tokens(dispatched.instance.worker_id, len(leg.ids))
                out = b"data: " + json_bytes(final) + b"\n\ndata: [DONE]\n\n"
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

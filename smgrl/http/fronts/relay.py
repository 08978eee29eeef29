"""Sending one rollout request's answer (``Relay``): buffered or streamed, the version stamp and the
serving instance's headers, errors before the first byte, partial-rollout loopbacks on the way."""

from __future__ import annotations

import functools
import logging

from smgrl.core.errors import (
    DataPlaneError,
    openai_body,
)
from smgrl.core.wire import json_bytes
from smgrl.dataplane import (
    GENERATE,
    FingerprintEvents,
    RolloutRequest,
    Routed,
    Stamp,
    TokenTail,
    first_event_version,
    loopback,
    stamp_generate,
    stamp_openai,
    stream_version,
    version_tag,
)
from smgrl.http.fronts.asgi import Send

# Engine response headers relayed to the client (framing and hop-by-hop headers are the gateway's).
RELAYED = frozenset({b"content-type", b"cache-control", b"x-accel-buffering"})

log = logging.getLogger("smgrl.dataplane")


@functools.lru_cache(maxsize=1024)
def _instance_headers(url: str, worker_id: str, group: str, dp_rank: int | None) -> tuple:
    """The serving instance's headers, encoded once per instance (a few per fleet) rather than
    on every answer."""
    return (
        # SMG names the serving worker's URL (``@rank`` for DP ranks); smgrl adds its registry id.
        (b"x-smg-routed-worker-id", url.encode()),
        (b"x-smgrl-worker-id", worker_id.encode()),
        # PSRL's echo: the serving instance (worker, DP rank), so a session can re-send it.
        (b"x-base-worker-id", group.encode()),
        (b"x-target-dp-rank", str(dp_rank or 0).encode()),
    )


class Relay:
    """Sends one rollout request's answer: buffered or streamed, errors before the first byte."""

    __slots__ = ("api", "hold", "rid", "routed", "send", "started")

    def __init__(self, api, send: Send, rid: bytes, hold, routed: Routed) -> None:
        # Attribute assignments, shaped like the services' constructors: nothing to share.
        self.api = api
        self.send = send
        self.rid = rid
        self.hold = hold
        self.routed = routed
        self.started = False

    async def start_stream(self, dispatched, version: str | None) -> None:
        """Send a streamed answer's head (the engine's status, stamped with ``version``) once:
        the plain relay and every loopback's first leg start their streams here."""
        head = self._head(dispatched) + self._stamped(Stamp(version, False, b""))
        await self.send(
            {"type": "http.response.start", "status": dispatched.response.status, "headers": head}
        )
        self.started = True

    def _head(self, dispatched) -> list[tuple[bytes, bytes]]:
        response = dispatched.response
        out = [(k, v) for k, v in response.headers if k in RELAYED]
        out.append((b"x-request-id", self.rid))
        instance = dispatched.instance
        out.extend(_instance_headers(instance.url, instance.worker_id, instance.group, instance.dp_rank))
        return out

    def _stamped(self, stamp: Stamp) -> list[tuple[bytes, bytes]]:
        """The stamp's headers; a staged request echoes its pinned version as x-version-tag
        (PSRL: once pinned, never changes), the others the serving engine's."""
        out = stamp.headers()
        routed = self.routed
        if routed.staged:
            out = [(k, version_tag(routed.pinned) if k == b"x-version-tag" else v) for k, v in out]
        return out

    async def run(
        self, req: RolloutRequest, body: bytes, headers, model: str, routing_key, policy, floor
    ) -> None:
        dataplane = self.api.dataplane
        bounds = {
            "routing_key": routing_key,
            "policy": policy,
            "floor": floor,
            "hold": self.hold,
            "routed": self.routed,
        }
        try:
            tokenizer = self.api.tokenizer
            if req.stream and loopback.streamable(req, dataplane.cfg.dataplane.max_loopbacks, tokenizer):
                # A rollout stream that a sync may abort: continued without a seam.
                await loopback.run_stream(
                    self, dataplane, req, body, headers, model, bounds, self.api.gateway.journal, tokenizer
                )
                return
            if (
                req.stream
                and req.openai
                and loopback.loopable(req, dataplane.cfg.dataplane.max_loopbacks, tokenizer)
            ):
                # With the tokenizer an OpenAI stream a sync aborts continues too.
                await loopback.run_openai_stream(
                    self, dataplane, req, body, headers, model, bounds, self.api.gateway.journal, tokenizer
                )
                return
            if req.stream:
                async with dataplane.dispatch(
                    req, body, headers, model=model, buffered=False, **bounds
                ) as dispatched:
                    await self._stream(req, dispatched)
                return
            async with dataplane.dispatch(
                req, body, headers, model=model, buffered=True, **bounds
            ) as dispatched:
                status = dispatched.response.status
                head = self._head(dispatched)
                data = dispatched.body or b""
                table_version = dispatched.entry.version
            served = dispatched.instance.worker_id
            if loopback.worth_a_look(req, status, data, dataplane.cfg.dataplane.max_loopbacks, tokenizer):
                # Maybe a rollout a weight sync aborted: continue it (smgrl/dataplane/loopback/).
                first = loopback.Answer(status, dispatched, head, data)
                answer = await loopback.run_buffered(
                    dataplane,
                    req,
                    body,
                    headers,
                    model,
                    bounds,
                    self._head,
                    self.api.gateway.journal,
                    first,
                    tokenizer,
                )
                status, head, data = answer.status, answer.head, answer.data
                table_version = answer.dispatched.entry.version
                served = answer.dispatched.instance.worker_id
            if 200 <= status < 300:
                if req.route == GENERATE:
                    stamp = stamp_generate(data, table_version, req.single)
                else:
                    stamp = stamp_openai(data, table_version)
                data = stamp.body
                # A looped-back answer reports every leg's tokens; the aborted legs' were counted.
                tokens = stamp.tokens
                dataplane.count_tokens(served, tokens and max(0, tokens - self.routed.kept))
                if stamp.mixed:
                    dataplane.metrics.mixed_answer()
            else:
                stamp = Stamp(stream_version(table_version), False, data)
            head += self._stamped(stamp)
            head.append((b"content-length", str(len(data)).encode()))
            self.started = True
            await self.send({"type": "http.response.start", "status": status, "headers": head})
            await self.send({"type": "http.response.body", "body": data, "more_body": False})
        except DataPlaneError as exc:
            if not self.started:
                await self.api._error(self.send, self.rid, exc)
            else:
                await self._abort_stream(exc)

    async def _stream(self, req: RolloutRequest, dispatched) -> None:
        send = self.send
        response = dispatched.response
        version = stream_version(dispatched.entry.version)
        chunks = response.aiter_chunks()
        first = b""
        ok = 200 <= response.status < 300
        if ok and req.route == GENERATE:
            # The head waits for the first event, which says which weights the engine is using:
            # the table can lag by a refit the request raced with. The client has nothing to
            # read before the first token anyway.
            first = await anext(chunks, b"")
            version = first_event_version(first) or version
        tail = TokenTail()  # the tokens the stream reports, read without parsing it
        tail.see(first)
        await self.start_stream(dispatched, version)
        if req.openai and ok:
            events = FingerprintEvents(version)
            async for chunk in chunks:
                tail.see(chunk)
                out = events.feed(chunk)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
            await send({"type": "http.response.body", "body": events.flush(), "more_body": False})
            self.api.dataplane.count_tokens(dispatched.instance.worker_id, tail.tokens)
            return
        if first:
            await send({"type": "http.response.body", "body": first, "more_body": True})
        async for chunk in chunks:
            tail.see(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        if ok:
            self.api.dataplane.count_tokens(dispatched.instance.worker_id, tail.tokens)

    async def _abort_stream(self, exc: DataPlaneError) -> None:
        # The head is out: the status cannot change. Say what happened in the stream's own
        # language (an SSE error event, as SGLang does) and end it; no [DONE] follows.
        log.warning("stream cut short: %s", exc.message)
        event = b"data: " + json_bytes(openai_body(exc)) + b"\n\n"
        await self.send({"type": "http.response.body", "body": event, "more_body": False})


# -- /openapi.json: these routes, their models and their errors (smgrl/http/openapi/apidoc.py) ---------------

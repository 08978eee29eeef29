"""Rollout routes served as raw ASGI in front of the Quart app, on the same port.

``POST /generate``, ``POST /v1/completions``, ``POST /v1/chat/completions`` and ``GET /v1/models``
are answered here; every other request goes on to Quart unchanged. Why not Quart routes:
measured (``benchmarks/dataplane.py --front``, docs/data-plane.md), Quart's request/response
machinery costs more per request than the whole proxy hop, and rollout traffic is the gateway's
high-rate path. Trainers keep ONE URL for control and data, as with SMG.

Per request: read the body (413 over ``--max-payload-size``), check the data-plane key, parse the
JSON (model, stream, prompt prefix), then, with a task watching for the client's disconnect
(which cancels the engine call: the pool closes that connection and the engine aborts the
request), dispatch through ``smgrl.dataplane.service`` and relay: buffered answers whole,
streams chunk by chunk as they arrive, never buffered.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any, Literal

import trio

from smgrl.core.auth import Denied, check_api_key
from smgrl.core.errors import (
    INVALID_REQUEST_CODES,
    DataPlaneError,
    InvalidRoutingMetadataHeader,
    InvalidVersionPolicyHeader,
    LoopbackLimitExceeded,
    MemoryBudgetExceeded,
    ModelNotFound,
    ModelRequired,
    NoAvailableWorkers,
    NoEligibleWorkers,
    QueueFull,
    QueueTimeout,
    RequestBodyStalled,
    RequestTimeout,
    UpstreamUnreachable,
    openai_body,
    openai_headers,
)
from smgrl.core.numbers import parse_uint
from smgrl.dataplane import loopback, loopback_openai_stream
from smgrl.dataplane.affinity import Routed
from smgrl.dataplane.request import CHAT, COMPLETIONS, GENERATE, RolloutRequest
from smgrl.dataplane.service import DataPlane
from smgrl.dataplane.stamp import (
    FingerprintEvents,
    Stamp,
    TokenTail,
    first_event_version,
    stamp_generate,
    stamp_openai,
    stream_version,
    version_tag,
)
from smgrl.http.bodies import dataplane_body
from smgrl.http.bodies import envelopes as env
from smgrl.http.fronts.scope import header as _header
from smgrl.http.fronts.sessions import SessionsASGI
from smgrl.http.hypercorn_patches import DISCONNECT_EXTENSION, RECEIVE_NOWAIT
from smgrl.http.openapi.apidoc import (
    ANY,
    STRING,
    Body,
    Param,
    Resp,
    RlOnly,
    Route,
    allow_table,
    as_json,
    evolve,
    field,
    model,
    path_param,
)
from smgrl.http.openapi.schemas import (
    DP_ERROR_CODE,
    DP_UNAUTHORIZED,
    METHOD_NOT_ALLOWED,
    RETRY_AFTER,
    ChatCompletionRequest,
    DataPlaneErrorModel,
    OpenAIErrorModel,
    rl_error,
)
from smgrl.routing import InvalidVersionPolicy, VersionPolicy, metadata
from smgrl.sessions.errors import (
    EngineAnswerInvalid,
    InvalidTurn,
    SessionClosing,
    SessionGone,
    SessionsDisabled,
    TemplateRefused,
    TooManySessions,
    TurnAborted,
)

log = logging.getLogger("smgrl.dataplane")

JSON_CT = b"application/json"
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
# Engine response headers relayed to the client (framing and hop-by-hop headers are the gateway's).
RELAYED = frozenset({b"content-type", b"cache-control", b"x-accel-buffering"})
MODELS = "/v1/models"
MODEL_CARD = "/v1/models/{model}"
MODEL_CARD_PREFIX = MODELS + "/"


class _Disconnected(Exception):
    pass


class _TooLarge(Exception):
    pass


def _json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


_RID_HEADERS = frozenset(name.encode() for name in env.REQUEST_ID_HEADERS)


def _latin1(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


class DataPlaneASGI:
    """ASGI middleware: the data-plane paths are served here, the rest by ``inner`` (Quart)."""

    def __init__(self, inner: Callable, gateway, service: DataPlane, sessions=None) -> None:
        self.inner = inner
        self.gateway = gateway
        self.dataplane = service
        self.max_body = service.max_body
        self.body_timeout = gateway.cfg.dataplane.body_timeout_secs
        self.stall_timeout = gateway.cfg.dataplane.stall_timeout_secs
        auth = gateway.auth
        # Data-plane keys: --api-key and the tenant keys (control-plane keys are for /v1/rl).
        self._keys = tuple(k for k in (auth.api_key, *(t.key for t in auth.tenant_keys)) if k)
        self.routes: dict[str, Callable[[Scope, Receive, Send], Awaitable[None]]] = {
            path: self._models if path == MODELS else self._rollout for path in ALLOW if "{" not in path
        }
        # Agent sessions (smgrl/http/fronts/sessions.py): their routes, and chat turns with SMG's TITO header.
        self.sessions = SessionsASGI(self, sessions)
        # The model's tokenizer (--tokenizer-path): text prompts and the OpenAI routes can then
        # loop back across a weight sync (smgrl/dataplane/loopback.py).
        self.tokenizer = sessions.chat if sessions is not None else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if self.sessions.handles(scope):
                try:
                    await self.sessions(scope, receive, send)
                except Exception:
                    log.exception("unhandled error on %s %r", scope["method"], scope["path"])
                    await self._internal_error(scope, send)
                return
            handler = self.routes.get(scope["path"])
            if (
                handler is None
                and scope["path"].startswith(MODEL_CARD_PREFIX)
                and scope["path"] != MODEL_CARD_PREFIX
            ):
                handler = self._models  # GET /v1/models/{model}: the id may hold slashes (as SMG)
            if handler is not None:
                try:
                    await handler(scope, receive, send)
                except Exception:
                    # A bug, not bad input (bad input has its own 4xx): the operator gets the
                    # traceback, the client the stable internal_error envelope, as from Quart.
                    log.exception("unhandled error on %s %r", scope["method"], scope["path"])
                    await self._internal_error(scope, send)
                return
        await self.inner(scope, receive, send)

    async def _internal_error(self, scope: Scope, send: Send) -> None:
        error = DataPlaneError("internal error; the gateway log has the details")
        try:
            await self._error(send, self._request_id(scope), error)
        except Exception:  # noqa: BLE001 - whatever the server raises for a second head
            # The head was already sent: nothing more can be said on this response; the server
            # closes the connection.
            log.debug("could not answer internal_error: the response had started")

    # -- small helpers -------------------------------------------------------------------------

    @staticmethod
    def _request_id(scope: Scope, found: dict[bytes, bytes] | None = None) -> bytes:
        """The caller's id (SMG's headers, ``env.caller_request_id``; 128 characters at most),
        else a generated one in SMG's format (``env.request_id_prefix`` + 24 alphanumerics).
        ``found``: the request's headers already collected by ``_headers_of`` (SMG's four names
        among them)."""
        # One pass over the headers for SMG's four names (first occurrence of each wins); most
        # rollout clients send none of them (measured: a scan per name was ~10 us per request).
        if found is None:
            found = _headers_of(scope, _RID_HEADERS)
        header = found.get(b"x-request-id")
        if header is None and not _RID_HEADERS.isdisjoint(found):
            caller = env.caller_request_id(lambda n: _latin1(found.get(n.encode())))
            header = caller.encode("latin-1") if caller is not None else None
        if header and len(header) <= env.MAX_REQUEST_ID:
            return header
        return env.new_request_id(scope["path"]).encode()

    @staticmethod
    async def _respond(
        send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]], ctype: bytes = JSON_CT
    ) -> None:
        head = [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), *headers]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _error(self, send: Send, rid: bytes, exc: DataPlaneError) -> None:
        # The rollout family's envelope, named here: an UpstreamUnreachable is also an RlError.
        await self._respond(
            send, exc.status, _json(openai_body(exc)), [(b"x-request-id", rid), *openai_headers(exc)]
        )

    async def _openai_error(
        self, send: Send, rid: bytes, status: int, code: str, message: str, extra=()
    ) -> None:
        body = {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": None}}
        headers = [(b"x-request-id", rid), (b"x-smg-error-code", code.encode()), *extra]
        await self._respond(send, status, _json(body), headers)

    async def _not_allowed(self, scope: Scope, send: Send, rid: bytes, allow: str) -> None:
        message = (
            f"Invalid URL ({scope['method']} {scope.get('raw_path', b'').decode('latin-1') or scope['path']})"
        )
        await self._openai_error(send, rid, 405, "method_not_allowed", message, [(b"allow", allow.encode())])

    def _denied(self, scope: Scope, found: dict[bytes, bytes] | None = None) -> Denied | None:
        """The refusal when the data-plane key check fails, else None (no keys: open)."""
        if not self._keys:
            return None
        header = _header(scope, b"authorization") if found is None else found.get(b"authorization")
        return check_api_key(header.decode("latin-1") if header else None, self._keys)

    async def _auth_error(self, send: Send, rid: bytes, denied: Denied) -> None:
        body = env.api_key_error_body(denied.message)
        headers = [(b"x-request-id", rid), (b"www-authenticate", denied.www_authenticate.encode())]
        await self._respond(send, denied.status, _json(body), headers)

    def _version_bounds(self, found: dict[bytes, bytes], fields: dict[str, Any] | None):
        """The request's version policy (``x-smg-version-policy``, with --enable-rl only) and
        PSRL routing metadata (``x-version-tag`` floor, prompt group, instance hint...)."""
        policy = None
        if self.gateway.cfg.rl.enabled:
            header = found.get(b"x-smg-version-policy")
            if header is not None:
                policy = VersionPolicy.parse(header.decode("latin-1"))
        if fields is None and _ROUTING_HEADERS.isdisjoint(found):
            # No routing header and no routing field: what ``metadata.parse`` answers for
            # nothing, without its dozen lookups (most rollout requests carry none).
            return policy, metadata.PLAIN
        return policy, metadata.parse(_routing_headers(found), fields)

    async def _read_body(self, length: bytes | None, receive: Receive, hold, scope: Scope) -> bytes:
        nowait = scope.get("extensions", {}).get(RECEIVE_NOWAIT)
        first = nowait() if nowait is not None else None
        if first is not None and not first.get("more_body", False):
            # The whole body had arrived (a small body always has, with its head): nothing to
            # wait for, so no deadline scopes (measured: a visible share of a rollout request).
            return await self._read_body_now(length, receive, hold, first)
        # A deadline for the whole body: a declared body holds its bytes of the memory budget
        # from the first read, so a client with the key trickling it (or never sending it) held
        # them up to --request-timeout-secs. Cancelling receive() only stops waiting for hypercorn's
        # next body message; the caller answers 408 and the connection is closed by h11.
        with trio.move_on_after(self.body_timeout):
            return await self._read_body_now(length, self.stalling(receive), hold, first)
        raise RequestBodyStalled(
            f"The request body did not arrive within {self.body_timeout:g} seconds "
            "(--dataplane-body-timeout-secs)"
        )

    def stalling(self, receive: Receive) -> Receive:
        """``receive`` with SMG's stall bound (--stream-body-stall-timeout-secs; 0: none): no
        body message for that long is SMG's 408, with its text."""
        stall = self.stall_timeout
        if not stall:
            return receive

        async def bounded() -> dict[str, Any]:
            with trio.move_on_after(stall):
                return await receive()
            raise RequestBodyStalled(f"No request body bytes arrived from the client for {stall:g} seconds")

        return bounded

    async def _read_body_now(self, length: bytes | None, receive: Receive, hold, first=None) -> bytes:
        """The body; ``first``: its first message, already taken (``RECEIVE_NOWAIT``)."""
        declared_size = parse_uint(length)
        declared = declared_size is not None
        if declared_size is not None:
            if declared_size > self.max_body:
                raise _TooLarge
            hold.take(declared_size)  # the memory budget, before a byte is read (503 otherwise)
        chunks = []
        size = 0
        message = first
        while True:
            if message is None:
                message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            if chunk:
                size += len(chunk)
                if size > self.max_body:
                    raise _TooLarge
                if not declared:
                    hold.take(len(chunk))
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            message = None

    # -- routes --------------------------------------------------------------------------------

    async def _models(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = self._request_id(scope)
        card = scope["path"][len(MODEL_CARD_PREFIX) :] if scope["path"] != MODELS else None
        allow = ALLOW[MODELS if card is None else MODEL_CARD]
        if scope["method"] not in allow.split(","):
            await self._not_allowed(scope, send, rid, allow)
            return
        denied = self._denied(scope)
        if denied is not None:
            await self._auth_error(send, rid, denied)
            return
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "self_hosted"}
            for name in self.dataplane.served_models()
        ]
        if card is None:
            body = _json({"object": "list", "data": data})
        else:
            found = next((c for c in data if c["id"] == card), None)
            if found is None:
                await self._error(send, rid, ModelNotFound(f"No worker available for model '{card}'"))
                return
            body = _json(found)
        if scope["method"] == "HEAD":
            head = [
                (b"content-type", JSON_CT),
                (b"content-length", str(len(body)).encode()),
                (b"x-request-id", rid),
            ]
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            return
        await self._respond(send, 200, body, [(b"x-request-id", rid)])

    async def _rollout(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A duration only: the monotonic clock trio's own reads (without its three calls).
        started = perf_counter()
        status = 0

        async def counted(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        hold = self.dataplane.budget.hold()
        try:
            await self._serve_rollout(scope, receive, counted, hold)
        finally:
            hold.release()
            self.dataplane.metrics.answered(scope["path"], status, perf_counter() - started)

    async def _serve_rollout(self, scope: Scope, receive: Receive, send: Send, hold) -> None:
        # Every header this path reads, in one pass over the request's headers.
        found = _headers_of(scope, _ROLLOUT_HEADERS)
        rid = self._request_id(scope, found)
        allow = ALLOW[scope["path"]]
        if scope["method"] not in allow.split(","):
            await self._not_allowed(scope, send, rid, allow)
            return
        # The key first, as SMG's auth layer does, before a byte of the body is read or reserved:
        # a client without a key must not hold the memory budget (a stalled declared body did,
        # for every rollout, up to --request-timeout-secs) nor make the gateway buffer anything.
        denied = self._denied(scope, found)
        if denied is not None:
            await self._auth_error(send, rid, denied)
            return
        try:
            body = await self._read_body(found.get(b"content-length"), receive, hold, scope)
        except _Disconnected:
            return
        except _TooLarge:
            await self._openai_error(send, rid, 413, "request_body_too_large", env.PAYLOAD_TOO_LARGE)
            return
        except DataPlaneError as exc:  # the memory budget
            await self._error(send, rid, exc)
            return
        try:
            req = dataplane_body.parse(scope["path"], body, found.get(b"content-type"))
            model = self.dataplane.resolve_model(req.model)
        except DataPlaneError as exc:
            await self._error(send, rid, exc)
            return
        try:
            policy, meta = self._version_bounds(found, req.routing)
        except InvalidVersionPolicy as exc:
            error = InvalidVersionPolicyHeader(str(exc))
            headers = [(b"x-request-id", rid), (b"x-smg-error-code", error.code.encode())]
            await self._respond(send, error.status, _json(error.body()), headers)
            return
        except metadata.InvalidRoutingMetadata as exc:
            await self._error(send, rid, InvalidRoutingMetadataHeader(str(exc)))
            return
        floor = meta.floor
        routed = Routed(meta)
        headers = list(scope["headers"])
        if b"x-request-id" not in found:
            headers.append((b"x-request-id", rid))
        key = found.get(b"x-smg-routing-key")
        routing_key = key.decode("latin-1") if key else None
        relay = _Relay(self, send, rid, hold, routed)
        args = (req, body, headers, model, routing_key, policy, floor)
        # The client's disconnect cancels this request: the engine call in flight is cancelled
        # (its connection closed, so the engine aborts), and a request still waiting for an
        # eligible engine stops waiting.
        await until_disconnect(scope, receive, self._admitted, send, rid, relay, args)

    async def _admitted(self, send: Send, rid: bytes, relay: _Relay, args) -> None:
        try:
            # The admission slot is held for the whole answer, streamed bodies included.
            async with self.dataplane.admission.slot():
                await relay.run(*args)
        except DataPlaneError as exc:  # queue full / queue timeout: nothing was sent yet
            await self._error(send, rid, exc)
        finally:
            # The request ended: leave its prompt group, give the admission hook its reservation.
            await self.dataplane.finish(relay.routed)


def _headers_of(scope: Scope, wanted: frozenset[bytes]) -> dict[bytes, bytes]:
    """The ``wanted`` headers of a request from one scan (the first occurrence of each wins, as
    for every other header: smgrl/http/fronts/scope.py)."""
    found: dict[bytes, bytes] = {}
    for key, value in scope["headers"]:
        if key in wanted and key not in found:
            found[key] = value
    return found


def _routing_headers(found: dict[bytes, bytes]):
    """``metadata.parse``'s header lookup: the routing headers among ``found``, decoded."""
    return {
        key.decode(): value.decode("latin-1") for key, value in found.items() if key in _ROUTING_HEADERS
    }.get


_ROUTING_HEADERS = frozenset(h.encode() for h in metadata.HEADERS)
# What the rollout path reads of a request's head (``DataPlaneASGI._serve_rollout``).
_ROLLOUT_HEADERS = frozenset(
    {
        *_RID_HEADERS,
        *_ROUTING_HEADERS,
        b"authorization",
        b"content-length",
        b"content-type",
        b"x-smg-version-policy",
        b"x-smg-routing-key",
    }
)


async def until_disconnect(scope: Scope, receive: Receive, fn: Callable[..., Awaitable[Any]], *args) -> Any:
    """``await fn(*args)``, cancelled when the client disconnects (then None). Shared by the
    rollout routes and the engine front (smgrl/http/fronts/rl_front.py)."""
    hook = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
    if hook is not None:
        # smgrl's hypercorn (hypercorn_patches.DisconnectHook) cancels this scope itself on a
        # disconnect: no task per request.
        with trio.CancelScope() as cancel:
            hook.cancel_on_disconnect(cancel)
            try:
                return await fn(*args)
            finally:
                hook.cancel_on_disconnect(None)
        return None
    # Any other server (the in-process test client): a task waiting in receive() cancels the
    # nursery when the disconnect arrives; the call's own end cancels that task.
    result = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_disconnect, receive, nursery.cancel_scope)
        try:
            result = await fn(*args)
        finally:
            nursery.cancel_scope.cancel()
    return result


async def watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


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


class _Relay:
    """Sends one rollout request's answer: buffered or streamed, errors before the first byte."""

    __slots__ = ("api", "hold", "rid", "routed", "send", "started")

    def __init__(self, api: DataPlaneASGI, send: Send, rid: bytes, hold, routed: Routed) -> None:
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
                await loopback_openai_stream.run(
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
                # Maybe a rollout a weight sync aborted: continue it (smgrl/dataplane/loopback.py).
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
        event = b"data: " + _json(openai_body(exc)) + b"\n\n"
        await self.send({"type": "http.response.body", "body": event, "more_body": False})


# -- /openapi.json: these routes, their models and their errors (smgrl/http/openapi/apidoc.py) ---------------


@model(
    additional=True,
    description="SGLang's /generate body, forwarded byte for byte (with --dp-aware, `data_parallel_rank` is "
    "added). Must be a JSON object; `model`, when present, a string.",
)
class GenerateRequest:
    model: str = field(optional=True)
    text: Any = field(optional=True, schema={"description": "a prompt or a list of prompts"})
    input_ids: Any = field(optional=True, schema={"description": "token ids, or a list of them"})
    sampling_params: dict = field(optional=True)
    stream: bool = field(optional=True)


@model(additional=True, description="OpenAI's completions body, forwarded byte for byte.")
class CompletionRequest:
    model: str = field(optional=True)
    prompt: Any = field(optional=True, schema={"description": "text, token ids, or a list of them"})
    stream: bool = field(optional=True)


@model(description="A served model (OpenAI's model object, as SMG 1.13.0 answers it).")
class ModelCard:
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


@model
class ModelList:
    object: Literal["list"]
    data: list[ModelCard]


def _stamp_header_param(description: str, required: bool = True, schema: dict = STRING) -> dict:
    return {"description": description, "required": required, "schema": schema}


STAMP = {
    "x-smg-weight-version": _stamp_header_param(
        "the weights that produced the answer: the version the engine reported (a stream's first event for "
        "/generate; SGLang's `metadata.weight_version`), else the gateway's table, else `default`. OpenAI "
        "answers carry it in `system_fingerprint` too."
    ),
    "x-version-tag": _stamp_header_param(
        "PSRL: the serving engine's version, `-1` when it has none; for a request with routing metadata "
        "(x-prompt-id or an instance hint) the version pinned at its first selection"
    ),
    "x-base-worker-id": _stamp_header_param(
        "PSRL: the serving instance's engine (registry id of its rank-0 record)"
    ),
    "x-target-dp-rank": _stamp_header_param("PSRL: the serving instance's DP rank (0 without DP)"),
    "x-smg-mixed-version": _stamp_header_param(
        "`true` on a buffered /generate whose weights changed mid-request (absent otherwise)",
        False,
        {"type": "string", "enum": ["true"]},
    ),
    "x-smg-routed-worker-id": _stamp_header_param(
        "the serving worker's URL (`@rank` for a DP rank), as SMG names it"
    ),
    "x-smgrl-worker-id": _stamp_header_param("the serving worker's registry id"),
}
# An engine's own non-2xx answer is relayed untouched, with the same statuses as the gateway's errors.
ENGINE_ANSWER = {
    "type": "object",
    "description": "the engine's own error answer, relayed untouched (stamped like a 200, without "
    "x-smg-error-code)",
}
_ERROR_HEADERS = {
    "x-smg-error-code": _stamp_header_param(
        "the gateway error's code (absent on a relayed engine answer)", False
    ),
    **RETRY_AFTER,
}


def dp_error(description: str, *errors: Any, alternatives: tuple = ()) -> Resp:
    """A status answered with these data-plane errors, or with an engine's own answer relayed."""
    return Resp(
        description + " An engine answering this status itself is relayed untouched (EngineAnswer).",
        as_json({"anyOf": [DataPlaneErrorModel, *alternatives, ENGINE_ANSWER]}),
        _ERROR_HEADERS,
        errors=errors,
    )


def _header_param(name: str, description: str) -> Param:
    return Param(name, "header", description)


ROLLOUT_HEADERS = (
    RlOnly(
        _header_param(
            "x-smg-version-policy",
            "`any` | `latest-only` | `min-version:<v>` | `max-staleness:<k>` (default --rl-version-policy)",
        )
    ),
    _header_param("x-smg-routing-key", "sticky routing: requests with the same key go to the same worker"),
    _header_param(
        "x-version-tag", "PSRL version floor: only engines at this version or newer (`-1`: no floor)"
    ),
    _header_param("x-prompt-id", "PSRL prompt group: its requests share an instance (staged selection)"),
    _header_param("x-is-validate", "PSRL: a validation request (bool-like; handed to the admission hook)"),
    _header_param("x-is-sticky", "PSRL: honour the instance hint (bool-like)"),
    _header_param(
        "x-base-worker-id", "PSRL instance hint: the engine (registry id or URL); with x-target-dp-rank"
    ),
    _header_param("x-target-dp-rank", "PSRL instance hint: the DP rank; with x-base-worker-id"),
    _header_param("x-force-pin-once", "PSRL: honour the hint for the first selection only (bool-like)"),
)
ROLLOUT_RESPONSES = {
    "200": Resp(
        "The engine's answer, stamped. `stream: true`: a text/event-stream relayed event by event (OpenAI "
        "events carry `system_fingerprint`; an error after the head is an SSE error event, with no `[DONE]`).",
        {"application/json": ANY, "text/event-stream": STRING},
        STAMP,
    ),
    "400": dp_error(
        "SMG's codes for a refused body (invalid_json, invalid_type, invalid_value, missing_required_parameter, "
        "unknown_parameter, integer_below_min_value, empty_array, prompt_empty, json_parse_error), "
        "invalid_routing_metadata (a malformed PSRL routing header or field), model_required (/generate only), "
        "or with --enable-rl an invalid x-smg-version-policy (invalid_version_policy, RL crate envelope).",
        *INVALID_REQUEST_CODES,
        InvalidRoutingMetadataHeader,
        ModelRequired,
        RlOnly(InvalidVersionPolicyHeader),
        alternatives=(RlOnly(rl_error(InvalidVersionPolicyHeader)),),
    ),
    "401": DP_UNAUTHORIZED,
    "404": dp_error("model_not_found: no worker serves the named model.", ModelNotFound),
    "405": METHOD_NOT_ALLOWED,
    "413": Resp(
        "Body over --max-payload-size (request_body_too_large).",
        as_json(OpenAIErrorModel),
        DP_ERROR_CODE,
        errors=("request_body_too_large",),
    ),
    "422": dp_error(
        "/generate only: a body of the wrong shape (not an object, `model` not a string): invalid_type.",
        "invalid_type",
    ),
    "429": dp_error(
        "too_many_requests (--max-concurrent-requests and its queue are full) or queue_timeout (waited "
        "--queue-timeout-secs for a slot); retryable.",
        QueueFull,
        QueueTimeout,
    ),
    "500": dp_error(
        "internal_error: a gateway bug (never bad input); the log has the traceback.", "internal_error"
    ),
    "502": dp_error(
        "upstream_unreachable: retries exhausted (connect errors, engine 5xx); retryable.",
        UpstreamUnreachable,
    ),
    "503": dp_error(
        "no_available_workers (no routable worker serves the model) or no_eligible_workers (every worker held "
        "out by state, version policy, floor or circuit breaker, after waiting; `reasons` counts them) or "
        "memory_budget_exceeded (--dataplane-memory-budget is held by other requests' bodies and buffered "
        "answers) or loopback_limit_exceeded (a rollout aborted by weight syncs more than --max-loopbacks "
        "times); retryable.",
        NoAvailableWorkers,
        NoEligibleWorkers,
        MemoryBudgetExceeded,
        LoopbackLimitExceeded,
    ),
    "408": dp_error(
        "request_body_stalled: no body bytes for --stream-body-stall-timeout-secs, or the body did not "
        "arrive within --dataplane-body-timeout-secs.",
        RequestBodyStalled,
    ),
    "504": dp_error("request_timeout: --request-timeout-secs passed.", RequestTimeout),
    "default": Resp(
        "Any other engine status, relayed as the engine sent it (body untouched).", as_json(ANY), STAMP
    ),
}


def _with_tito(responses: dict[str, Resp]) -> dict[str, Resp]:
    """/v1/chat/completions with x-smg-tito-session-id is a captured session turn, served by the
    session routes (smgrl/http/fronts/sessions.py): it answers their codes too."""
    out = dict(responses)
    for status, errors in (
        ("400", (InvalidTurn, TemplateRefused)),
        ("429", (TooManySessions,)),
        ("502", (EngineAnswerInvalid,)),
        ("503", (SessionsDisabled, TurnAborted)),
    ):
        resp = out[status]
        codes = ", ".join(e.code for e in errors)
        out[status] = evolve(
            resp,
            description=f"{resp.description} With x-smg-tito-session-id: {codes}.",
            errors=resp.errors + errors,
        )
    out["409"] = dp_error(
        "x-smg-tito-session-id: session_closing (DELETE is draining the session).", SessionClosing
    )
    out["410"] = dp_error(
        "x-smg-tito-session-id: session_gone (the id belonged to an earlier gateway process).", SessionGone
    )
    return out


def _rollout(path: str, op_id: str, summary: str, body: type, extra: tuple = ()) -> Route:
    return Route(
        "POST",
        path,
        op_id,
        "dataplane",
        summary,
        _with_tito(ROLLOUT_RESPONSES) if path == CHAT else ROLLOUT_RESPONSES,
        description="Served by the data plane (raw ASGI, same port). Routed to a worker serving `model` (or "
        "the only model served); paused/asleep workers and those outside the version policy get no requests: "
        "the request waits for an eligible one.",
        security="data",
        params=ROLLOUT_HEADERS + extra,
        body=Body(body),
    )


# One Route per operation: entries alike in shape stay apart (each is its own route's contract).
OPENAPI_ROUTES = (
    _rollout(GENERATE, "postGenerate", "SGLang native generation", GenerateRequest),
    _rollout(COMPLETIONS, "postCompletions", "OpenAI completions", CompletionRequest),
    _rollout(
        CHAT,
        "postChatCompletions",
        "OpenAI chat completions",
        ChatCompletionRequest,
        (
            _header_param(
                "x-smg-tito-session-id",
                "SMG TITO: the turn belongs to this session and is captured token-exact (answered like "
                "POST /sessions/{sid}/v1/chat/completions; created on first use)",
            ),
        ),
    ),
    Route(
        "GET",
        MODELS,
        "getModels",
        "dataplane",
        "The models the fleet serves (OpenAI list)",
        {
            "200": Resp("The models.", as_json(ModelList)),
            "401": DP_UNAUTHORIZED,
            "405": METHOD_NOT_ALLOWED,
        },
        security="data",
    ),
    Route(
        "GET",
        MODEL_CARD,
        "getModel",
        "dataplane",
        "One served model's card (the id may contain slashes)",
        {
            "200": Resp("The model.", as_json(ModelCard)),
            "401": DP_UNAUTHORIZED,
            "404": dp_error("model_not_found: no worker serves this model.", ModelNotFound),
            "405": METHOD_NOT_ALLOWED,
        },
        security="data",
        params=(path_param("model", "the model id, as in GET /v1/models"),),
    ),
)
# The routes served here and their methods (the ``allow`` of their 405): the table's.
ALLOW = allow_table(OPENAPI_ROUTES)

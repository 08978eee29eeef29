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

import logging
from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Any

import trio

from smgrl.core.auth import Denied, check_api_key
from smgrl.core.errors import (
    DataPlaneError,
    InvalidRoutingMetadataHeader,
    InvalidVersionPolicyHeader,
    ModelNotFound,
    RequestBodyStalled,
    openai_body,
    openai_headers,
)
from smgrl.core.numbers import parse_uint
from smgrl.core.wire import json_bytes
from smgrl.dataplane import DataPlane, Routed
from smgrl.http.bodies import dataplane_body
from smgrl.http.bodies import envelopes as env
from smgrl.http.fronts.asgi import (
    BodyDisconnected,
    BodyTooLarge,
    Receive,
    Scope,
    Send,
    headers_of,
    read_body,
    until_disconnect,
)
from smgrl.http.fronts.asgi import header as _header
from smgrl.http.fronts.dataplane_routes import ALLOW, MODEL_CARD, MODEL_CARD_PREFIX, MODELS
from smgrl.http.fronts.relay import Relay
from smgrl.http.fronts.sessions import SessionsASGI
from smgrl.http.server import RECEIVE_NOWAIT
from smgrl.routing import InvalidVersionPolicy, VersionPolicy, metadata

log = logging.getLogger("smgrl.dataplane")

JSON_CT = b"application/json"


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
        # loop back across a weight sync (smgrl/dataplane/loopback/).
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
            found = headers_of(scope, _RID_HEADERS)
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
            send, exc.status, json_bytes(openai_body(exc)), [(b"x-request-id", rid), *openai_headers(exc)]
        )

    async def _openai_error(
        self, send: Send, rid: bytes, status: int, code: str, message: str, extra=()
    ) -> None:
        body = {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": None}}
        headers = [(b"x-request-id", rid), (b"x-smg-error-code", code.encode()), *extra]
        await self._respond(send, status, json_bytes(body), headers)

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
        await self._respond(send, denied.status, json_bytes(body), headers)

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
        # them up to --request-timeout-secs. Cancelling receive() only stops waiting for the server's
        # next body message; the caller answers 408, an early answer: the server closes the connection.
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
        if declared_size is not None:
            if declared_size > self.max_body:
                raise BodyTooLarge
            hold.take(declared_size)  # the memory budget, before a byte is read (503 otherwise)
        return await read_body(
            receive, self.max_body, first=first, take=hold.take if declared_size is None else None
        )

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
            body = json_bytes({"object": "list", "data": data})
        else:
            found = next((c for c in data if c["id"] == card), None)
            if found is None:
                await self._error(send, rid, ModelNotFound(f"No worker available for model '{card}'"))
                return
            body = json_bytes(found)
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
        found = headers_of(scope, _ROLLOUT_HEADERS)
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
        except BodyDisconnected:
            return
        except BodyTooLarge:
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
            await self._respond(send, error.status, json_bytes(error.body()), headers)
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
        relay = Relay(self, send, rid, hold, routed)
        args = (req, body, headers, model, routing_key, policy, floor)
        # The client's disconnect cancels this request: the engine call in flight is cancelled
        # (its connection closed, so the engine aborts), and a request still waiting for an
        # eligible engine stops waiting.
        await until_disconnect(scope, receive, self._admitted, send, rid, relay, args)

    async def _admitted(self, send: Send, rid: bytes, relay: Relay, args) -> None:
        try:
            # The admission slot is held for the whole answer, streamed bodies included.
            async with self.dataplane.admission.slot():
                await relay.run(*args)
        except DataPlaneError as exc:  # queue full / queue timeout: nothing was sent yet
            await self._error(send, rid, exc)
        finally:
            # The request ended: leave its prompt group, give the admission hook its reservation.
            await self.dataplane.finish(relay.routed)


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

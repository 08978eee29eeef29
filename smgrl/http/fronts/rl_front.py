"""Discovery (``GET``/``HEAD /v1/rl/workers``) and the engine routes served as raw ASGI in front
of Quart (``DiscoveryFront``, ``EngineFront``).

Trainers poll discovery; measured (``benchmarks/profile.py discovery``, docs/benchmarks.md),
Quart's request and response machinery was about half of such a request. The answer itself is a
render cached by projection revision (``RlApi.workers_body``), so this front answers the plain
case directly: same headers (content-type, content-length, ``x-request-id`` by SMG's rules), same
audit (``Guard.allowed_read``). Anything else goes on to Quart unchanged, so every other outcome
keeps its one implementation there: a denied key (its envelope and count), a request carrying a
body (the declared-length 413), another method (405), any other path.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from smgrl.control import CallContext
from smgrl.core import (
    EnginePathError,
    SelectorError,
    parse_selector,
    passthrough_query,
    rust_trim,
    validate_engine_path,
)
from smgrl.core.auth import ENGINE, READ, Denied
from smgrl.core.errors import RlError
from smgrl.core.numbers import parse_uint
from smgrl.core.wire import json_bytes
from smgrl.http.bodies import envelopes as env
from smgrl.http.bodies.control_bodies import LARGE, body_timeout
from smgrl.http.fronts.asgi import BodyDisconnected, BodyTooLarge, header_text, read_body, until_disconnect
from smgrl.http.routes.rl_routes import PREFIX, BadUtf8, control_request, decode_params, match, query_pairs

log = logging.getLogger("smgrl.http")

PATH = "/v1/rl/workers"
RAW_PATH = PATH.encode()
JSON_CT = env.JSON.encode()


class DiscoveryFront:
    def __init__(self, inner: Callable[..., Awaitable[None]], gateway, rl_api) -> None:
        self.inner = inner
        self.gateway = gateway
        self.rl = rl_api

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != PATH
            or scope.get("raw_path", RAW_PATH) != RAW_PATH
            or scope["method"] not in ("GET", "HEAD")
            or any(key in (b"content-length", b"transfer-encoding") for key, _ in scope["headers"])
        ):
            await self.inner(scope, receive, send)
            return
        decision = self.gateway.auth.check(header_text(scope, b"authorization"), READ)
        if isinstance(decision, Denied):
            await self.inner(scope, receive, send)  # Quart answers (and counts) every refusal
            return
        caller = env.caller_request_id(lambda name: header_text(scope, name.encode()))
        request_id, _ = env.request_id_for(caller, PATH)
        body = self.rl.workers_body()
        head = [
            (b"content-type", JSON_CT),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode("latin-1")),
        ]
        self.rl.guard.allowed_read(decision, scope["method"], PATH, request_id)
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


class EngineFront:
    """Fan-outs (``/v1/rl/engine/{path}?selector=``) and per-worker calls
    (``/v1/rl/workers/{id}/engine/{path}``) served as raw ASGI in front of Quart.

    Measured (``benchmarks/profile.py fanout``, docs/benchmarks.md): Quart's request machinery is
    a fixed cost per control call on the scale of the whole 1-engine operation. This front takes
    only the plain case, decided on the request head alone before its body is read: ``GET`` or
    ``POST``, an allowed key, a body of declared length at most ``LARGE`` (and the payload limit),
    valid path parameters, and (fan-out) exactly one selector that parses. It then runs the same
    service call Quart's route runs (smgrl/http/routes/rl_routes.py) and answers the same bytes: the journal's
    guarantees are the service's (intent durable before any engine call; outcomes, finish and
    audit durable before the answer; a shielded ``cancelled`` record when the client leaves).
    Everything else goes on to Quart, which keeps every refusal's single implementation; a
    request whose body does not arrive in one piece, or whose targets vanished meanwhile, is
    handed to Quart with what was already received replayed."""

    def __init__(self, inner: Callable[..., Awaitable[None]], gateway, rl_api) -> None:
        self.inner = inner
        self.gateway = gateway
        self.rl = rl_api
        self.max_body = min(LARGE, gateway.cfg.max_payload_size)
        self.body_timeout = body_timeout(gateway.cfg)

    async def __call__(self, scope, receive, send) -> None:
        plan = self._plan(scope) if scope["type"] == "http" else None
        if plan is None:
            await self.inner(scope, receive, send)
            return
        route, decision, params, selector = plan
        # The body (declared at most max_body bytes). A client that leaves while sending it, or
        # does not finish it within Quart's body timeout, is Quart's, with what arrived replayed.
        received: list[dict] = []

        async def recording() -> dict:
            message = await receive()
            received.append(message)
            return message

        body = None
        with trio.move_on_after(self.body_timeout):
            try:
                body = await read_body(recording, self.max_body)
            except (BodyDisconnected, BodyTooLarge):
                pass  # Quart's to answer (or, the client gone, to see it gone), as below
        if body is None:
            await self.inner(scope, _replay(received, receive), send)
            return
        if route == "fanout":
            targets = self.gateway.control.targets(selector)
        else:
            worker = self.gateway.fleet.registry.get(params["id"])
            targets = [worker] if worker is not None and worker.is_visible else []
        if not targets:  # no match / unknown worker: Quart's answers
            await self.inner(scope, _replay(received, receive), send)
            return
        await self._serve(scope, receive, send, route, decision, params, selector, targets, body)

    def _plan(self, scope):
        """(route, principal, decoded params, selector) for a request this front answers, else
        None. Pure checks on the head only: nothing is read or counted here."""
        method = scope["method"]
        raw_path = scope.get("raw_path")
        if method not in ("GET", "POST") or raw_path is None or not raw_path.startswith(PREFIX):
            return None
        found = match(raw_path)
        if found is None or found[0] not in ("fanout", "proxy"):
            return None
        length = None
        for key, value in scope["headers"]:
            if key == b"transfer-encoding" or (key == b"content-length" and length is not None):
                return None
            if key == b"content-length":
                length = value
        if length is not None and ((size := parse_uint(length)) is None or size > self.max_body):
            return None  # large bodies wait for a slot (control_bodies.py); over-limit ones get 413
        decision = self.gateway.auth.check(header_text(scope, b"authorization"), ENGINE)
        if isinstance(decision, Denied):
            return None  # Quart answers (and counts) every refusal
        route, raw_params = found
        try:
            params = decode_params(raw_params)
            params["path"] = validate_engine_path(params["path"])
        except (BadUtf8, EnginePathError):
            return None
        selector = None
        if route == "fanout":
            query = scope.get("query_string", b"").decode("latin-1") or None
            selectors = [v for k, v in query_pairs(query) if k == "selector"]
            source = rust_trim(selectors[0]) if len(selectors) == 1 else ""
            if not source:
                return None
            try:
                selector = parse_selector(source)
            except SelectorError:
                return None
        return route, decision, params, selector

    async def _serve(self, scope, receive, send, route, principal, params, selector, targets, body):
        method = scope["method"]
        raw_path = scope["raw_path"]
        shown_path = raw_path.decode("latin-1")
        caller = env.caller_request_id(lambda name: header_text(scope, name.encode()))
        request_id, _ = env.request_id_for(caller, scope["path"])
        guard = self.rl.guard
        # Guard.answer's block, kept apart: no Quart request context here, the answer is raw
        # bytes, and a bug is answered here (app.py's handler is not on this path).
        check = guard.begin(principal, ENGINE, method, shown_path, request_id)
        audited = guard.audit_check(check, ENGINE)
        ctx = CallContext(
            principal=principal.label,
            request_id=request_id,
            audit=audited.audit_event if audited is not None else None,
        )
        query = scope.get("query_string", b"").decode("latin-1") or None
        req = control_request(
            method,
            params["path"],
            passthrough_query(query),
            body,
            request_id if caller is not None else None,
            lambda name: header_text(scope, name.encode()),
        )
        try:
            try:
                result = await self._call(scope, receive, route, selector, targets, req, ctx)
                if result is None:
                    return  # the client is gone: nothing to answer (audited with status 0)
                status = result.status
                payload = b"" if status == 204 or result.body is None else json_bytes(result.body)
                extra = [(b"x-smgrl-operation-id", result.op_id.encode())]
                if not result.journaled:
                    extra.append((b"x-smgrl-journal", b"unavailable"))
                check.status = status
            except RlError as exc:  # the journal cannot take the intent (503): as rl.py renders it
                status, payload, extra = exc.status, json_bytes(exc.body()), []
                check.status = status
            except Exception:
                # A bug, not bad input: answered as Quart's handler in app.py does (and, as
                # there, audited with status 0).
                log.exception("unhandled error on %s %s", method, scope["path"])
                payload, extra = json_bytes(env.INTERNAL_ERROR), []
                status = 500
        finally:
            guard.end(ENGINE, shown_path, check)
        head = [
            (b"content-type", JSON_CT),
            (b"content-length", str(len(payload)).encode()),
            *extra,
            (b"x-request-id", request_id.encode("latin-1")),
        ]
        await send({"type": "http.response.start", "status": status, "headers": head})
        await send({"type": "http.response.body", "body": payload})

    async def _call(self, scope, receive, route, selector, targets, req, ctx):
        """The service call, cancelled when the client leaves (then None), as quart-trio cancels
        its handler: the engine calls in flight stop and the service's shielded step records the
        operation ``cancelled``."""
        control = self.gateway.control
        if route == "fanout":
            return await until_disconnect(scope, receive, control.fanout, selector, targets, req, ctx)
        return await until_disconnect(scope, receive, control.call, targets[0], req, ctx)


def _replay(received, receive):
    """A ``receive`` that gives the ``received`` messages again, in order, then reads on."""
    pending = list(reversed(received))

    async def again():
        if pending:
            return pending.pop()
        return await receive()

    return again

"""The quart-trio application: routes only. Each route parses, authorizes, calls a service and
renders; no business rule lives here."""

from __future__ import annotations

import logging

from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound, RequestEntityTooLarge
from werkzeug.routing import PathConverter

from smgrl.http.bodies import envelopes as env
from smgrl.http.bodies.control_bodies import ControlBodyBound, body_timeout
from smgrl.http.fronts.dataplane import DataPlaneASGI
from smgrl.http.fronts.rl_front import DiscoveryFront, EngineFront
from smgrl.http.openapi import document as openapi
from smgrl.http.openapi import html as openapi_html
from smgrl.http.routes.engine_reads import EngineReads
from smgrl.http.routes.event_streams import EventStreams
from smgrl.http.routes.flush_cache import FlushCache
from smgrl.http.routes.journal_routes import JournalRoutes
from smgrl.http.routes.refits import RefitsApi
from smgrl.http.routes.rl_routes import RlApi
from smgrl.http.routes.rl_writes import RlWrites
from smgrl.http.routes.routing_loop import RoutingLoopRoutes
from smgrl.http.routes.stream import JournalStream
from smgrl.http.routes.workers import WorkersApi
from smgrl.registry import GATEWAY_ID_HEADER

log = logging.getLogger("smgrl.http")


class AnyPath(PathConverter):
    """werkzeug's path converter, but ``.`` also matches newlines: a control character in an
    engine path (``a%0Ab``) must reach the path validator (400 ``invalid_engine_path``, as SMG)
    instead of falling through to the 404 of an unmatched route."""

    regex = r"(?s:[^/].*?)"


ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# Paths whose 405 `allow` header SMG 1.13.0 orders differently from ALL_METHODS (observed).
ALLOW_ORDER = {"/workers": ["POST", "GET", "HEAD"]}


def create_app(gateway, journal_routes=None) -> QuartTrio:
    # No static folder: Quart would otherwise register /static/<path> (a 405 for POST /static/x
    # where SMG answers 404 unknown_url; found by tests/api/test_openapi.py).
    app = QuartTrio("smgrl", static_folder=None)
    cfg = gateway.cfg
    app.config.update(
        MAX_CONTENT_LENGTH=cfg.max_payload_size,
        BODY_TIMEOUT=body_timeout(cfg),
        RESPONSE_TIMEOUT=None,
        PROVIDE_AUTOMATIC_OPTIONS=False,
    )
    app.url_map.strict_slashes = False
    app.url_map.merge_slashes = False
    workers = WorkersApi(gateway)

    @app.before_request
    async def _request_id() -> None:
        caller = env.caller_request_id(request.headers.get)
        g.request_id_given = caller is not None
        g.request_id, _ = env.request_id_for(caller, request.path)

    @app.before_request
    async def _payload_limit() -> Response | None:
        # SMG's body-limit layer refuses a declared Content-Length over --max-payload-size before
        # routing: unknown URLs and wrong methods get the 413 too (a 405 route keeps its `allow`).
        # A chunked body is only refused when a handler reads it (see RlApi / WorkersApi).
        length = request.content_length
        if length is None or length <= cfg.max_payload_size:
            return None
        allow = _allow_for(request.method, request.scope.get("raw_path") or request.path.encode())
        return env.payload_too_large({"allow": allow} if allow else None)

    @app.after_request
    async def _stamp(response: Response) -> Response:
        response.headers["x-request-id"] = getattr(g, "request_id", None) or env.new_request_id(request.path)
        return response

    @app.route("/health", methods=["GET"])
    @app.route("/liveness", methods=["GET"])
    async def _alive() -> Response:
        # The id lets discovery recognise a worker URL that leads back here (registry/probe.py).
        return env.text_response(200, "OK", {GATEWAY_ID_HEADER: gateway.instance_id})

    @app.route("/readiness", methods=["GET"])
    async def _ready() -> Response:
        workers_ = list(gateway.fleet.registry)
        healthy = sum(1 for w in workers_ if w.status == "ready")
        status = 200 if healthy else 503
        body = {
            "status": "ready" if healthy else "not_ready",
            "healthy_workers": healthy,
            "total_workers": len(workers_),
        }
        return env.json_response(status, body)

    @app.route("/openapi.json", methods=["GET"])
    async def _openapi() -> Response:
        # No key needed: the document describes routes, never data (smgrl/http/openapi/document.py).
        return Response(openapi.rendered(cfg.rl.enabled), status=200, content_type=env.JSON)

    @app.route("/docs", methods=["GET"])
    async def _docs() -> Response:
        # The document above as a page the gateway renders itself: nothing loaded from anywhere
        # else (smgrl/http/openapi/html.py), same (absent) auth as /openapi.json.
        response = Response(openapi_html.rendered(cfg.rl.enabled), status=200, content_type=openapi_html.HTML)
        response.headers["content-security-policy"] = openapi_html.CSP
        return response

    app.add_url_rule("/workers", "workers_list", workers.list, methods=["GET"])
    app.add_url_rule("/workers", "workers_create", workers.create, methods=["POST"])
    app.add_url_rule("/get_loads", "get_loads", workers.get_loads, methods=["GET"])
    EngineReads(gateway).register(app)  # SMG's /get_server_info, /get_model_info, /health_generate
    FlushCache(gateway).register(app)  # SMG's POST /flush_cache, as a journaled fan-out
    app.add_url_rule(
        "/workers/<worker_id>", "workers_one", workers.one, methods=["GET", "PUT", "PATCH", "DELETE"]
    )

    rl = None
    if cfg.rl.enabled:
        rl = RlApi(gateway, journal_routes or JournalRoutes(gateway))
        # The explicit version/state writes (docs/data-plane.md): more specific rules than the /v1/rl
        # catch-all below, so werkzeug routes them here.
        RlWrites(gateway).register(app)
        streams = EventStreams(cfg.max_event_streams)  # one bound for both kinds of SSE stream
        RefitsApi(gateway, streams).register(app)  # refit sagas and quarantine (docs/refits.md)
        JournalStream(gateway, streams).register(app)  # GET /v1/rl/journal/stream and the /fleet page

        async def _rl(rest: str) -> Response:
            return await rl.dispatch()

        app.url_map.converters["anypath"] = AnyPath
        app.add_url_rule("/v1/rl/<anypath:rest>", "rl", _rl, methods=ALL_METHODS)

    def _rl_tree(path: str) -> bool:
        return path == "/v1/rl" or path.startswith("/v1/rl/")

    @app.errorhandler(NotFound)
    async def _not_found(exc) -> Response:
        if _rl_tree(request.path) and not cfg.rl.enabled:
            return env.empty_404()  # D1
        raw = request.scope.get("raw_path") or request.path.encode()
        return env.unknown_url(request.method, raw.decode("latin-1"))

    def _allow_for(method: str, raw_path: bytes) -> str | None:
        """The `allow` header of the 405 this request gets, or None when it is not a 405."""
        if rl is not None and _rl_tree(request.path):
            return rl.allow_for(method, raw_path)
        exc = request.routing_exception
        if not isinstance(exc, MethodNotAllowed):
            return None
        valid = set(exc.valid_methods or ())
        if "GET" in valid:
            valid.add("HEAD")
        # SMG lists the methods in the order its router registered them.
        order = ALLOW_ORDER.get(request.path, ALL_METHODS)
        return ",".join(sorted(valid, key=lambda m: order.index(m) if m in order else len(order)))

    @app.errorhandler(MethodNotAllowed)
    async def _not_allowed(exc: MethodNotAllowed) -> Response:
        if _rl_tree(request.path) and not cfg.rl.enabled:
            return env.empty_404()
        raw = request.scope.get("raw_path") or request.path.encode()
        return env.method_not_allowed(request.method, raw.decode("latin-1"), _allow_for(request.method, raw))

    @app.errorhandler(RequestEntityTooLarge)
    async def _too_large(exc) -> Response:
        return env.payload_too_large()

    @app.errorhandler(HTTPException)
    async def _http(exc: HTTPException) -> Response:
        return env.openai_error(
            exc.code or 500,
            (exc.name or "error").lower().replace(" ", "_"),
            exc.description or exc.name or "error",
        )

    @app.errorhandler(Exception)
    async def _bug(exc: Exception) -> Response:
        # A bug, not bad input: log the traceback for the operator, answer a stable code.
        log.exception("unhandled error on %s %s", request.method, request.path)
        return env.json_response(500, env.INTERNAL_ERROR)

    # The rollout routes are served by a raw ASGI handler in front of Quart, on the same port
    # (measured: Quart's per-request machinery costs more than the whole proxy hop; see
    # docs/data-plane.md). Everything else reaches Quart unchanged. The service itself is built
    # with every other one, in Gateway.build.
    dataplane = gateway.dataplane
    app.dataplane = dataplane  # type: ignore[attr-defined]  (tests and benchmarks read it)
    # PSRL's coordinator controls of the routing loop (more specific than /workers/<worker_id>).
    RoutingLoopRoutes(gateway, dataplane).register(app)
    # Large control-plane bodies (tensor refits, up to --max-payload-size) have a concurrency
    # bound of their own (smgrl/http/bodies/control_bodies.py); rollout bodies have the data plane's budget.
    control = ControlBodyBound(app.asgi_app, cfg.max_concurrent_large_bodies)
    if rl is not None:
        # Discovery polls skip Quart too (smgrl/http/fronts/rl_front.py); every other outcome stays there.
        control = DiscoveryFront(control, gateway, rl)
        # So do plain fan-outs and per-worker engine calls (same bytes, journal and cancellation).
        control = EngineFront(control, gateway, rl)
    app.sessions = gateway.sessions  # type: ignore[attr-defined]  (tests read it)
    app.asgi_app = DataPlaneASGI(control, gateway, dataplane, gateway.sessions)  # type: ignore[method-assign]
    return app

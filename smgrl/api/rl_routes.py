"""``/v1/rl/*``: discovery, the per-worker proxy and the fan-out (spec §1), routed by hand.

The routes are matched on the RAW path so that the engine catch-all is percent-decoded exactly
once, as SMG's framework does (``a%2Fb`` is two segments, ``%2e%2e`` is ``..``, ``%FF`` is a
400 "Invalid UTF-8 in `path`"), and so that routing runs before auth (unknown routes are 404 and
wrong methods 405 for everybody). Check order per route is the spec's: proxy = path -> worker ->
control endpoint -> send; fan-out = query -> selector -> path -> targets -> send.
"""

from __future__ import annotations

from urllib.parse import unquote_plus, unquote_to_bytes

from quart import Response, g, request

from smgrl.api import envelopes as env
from smgrl.api.guard import Guard
from smgrl.auth import ENGINE, READ
from smgrl.control.call import ControlRequest
from smgrl.control.service import CallContext, OpResult
from smgrl.core.path import EnginePathError, passthrough_query, validate_engine_path
from smgrl.core.selector import SelectorError, parse_selector, rust_trim
from smgrl.core.view import collapse, dp_ranks_for, facts_for, row, workers_response
from smgrl.errors import (
    InvalidEnginePath,
    InvalidSelector,
    NoWorkersMatch,
    SelectorRequired,
    WorkerNotFound,
)

PREFIX = b"/v1/rl/"
FORWARDED = (b"traceparent", b"tracestate")


class BadUtf8(Exception):
    def __init__(self, param: str) -> None:
        super().__init__(param)
        self.param = param


def _decode(raw: bytes, param: str) -> str:
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise BadUtf8(param) from None


def decode_params(params: dict[str, bytes]) -> dict[str, str]:
    """Percent-decode the path parameters in route order (``id`` before ``path``), as SMG's path
    extractor does before the handler runs: the first invalid one names itself in the 400, and it
    wins over every handler check (the duplicate-``selector`` query included)."""
    return {name: _decode(raw, name) for name, raw in params.items()}


def match(raw_path: bytes) -> tuple[str, dict[str, bytes]] | None:
    """Route a raw ``/v1/rl/...`` path to (route name, raw params), or None (no route: 404)."""
    if not raw_path.startswith(PREFIX):
        return None
    rest = raw_path[len(PREFIX) :]
    if rest == b"workers":
        return "workers", {}
    if rest.startswith(b"engine/") and len(rest) > len(b"engine/"):
        return "fanout", {"path": rest[len(b"engine/") :]}
    if rest.startswith(b"workers/"):
        parts = rest.split(b"/", 3)
        if len(parts) == 2 and parts[1]:
            return "worker", {"id": parts[1]}
        if len(parts) == 4 and parts[1] and parts[2] == b"engine" and parts[3]:
            return "proxy", {"id": parts[1], "path": parts[3]}
    if rest.startswith(b"operations/"):
        op = rest[len(b"operations/") :]
        if op and b"/" not in op:
            return "operation", {"id": op}
    if rest == b"journal":
        return "journal", {}
    return None


ALLOW = {
    "workers": "GET,HEAD",
    "worker": "GET,HEAD",
    "proxy": "GET,HEAD,POST",
    "fanout": "GET,HEAD,POST",
    "operation": "GET,HEAD",
    "journal": "GET,HEAD",
}
JOURNAL_ROUTES = ("operation", "journal")
ACTION = {
    "workers": READ,
    "worker": READ,
    "operation": READ,
    "journal": READ,
    "proxy": ENGINE,
    "fanout": ENGINE,
}


class RlApi:
    def __init__(self, gateway, journal_routes=None) -> None:
        self.gw = gateway
        self.guard = Guard(gateway)
        self.journal_routes = journal_routes
        self._rows_cache: tuple[object, bytes] | None = None

    def allow_for(self, method: str, raw_path: bytes) -> str | None:
        """The `allow` header when ``method`` is not allowed on this matched route, else None."""
        found = match(raw_path)
        if found is None or (found[0] in JOURNAL_ROUTES and self.journal_routes is None):
            return None
        allow = ALLOW[found[0]]
        return None if method in allow.split(",") else allow

    async def dispatch(self) -> Response:
        raw_path = request.scope.get("raw_path") or request.path.encode()
        method = request.method
        found = match(raw_path)
        shown_path = raw_path.decode("latin-1")
        if found is not None and found[0] in JOURNAL_ROUTES and self.journal_routes is None:
            found = None  # journal routes not wired into this app: no such route, as in SMG
        if found is None:
            return env.unknown_url(method, shown_path)
        route, params = found
        if method not in ALLOW[route].split(","):
            return env.method_not_allowed(method, shown_path, ALLOW[route])

        async def call(check) -> Response:
            try:
                return await getattr(self, "_" + route)(decode_params(params), check.principal)
            except BadUtf8 as exc:
                return env.text_response(400, f"Invalid URL: Invalid UTF-8 in `{exc.param}`")

        return await self.guard.answer(ACTION[route], shown_path, call)

    # -- discovery -----------------------------------------------------------------------------

    def workers_body(self) -> bytes:
        """The discovery answer, rendered once per projection revision (also served by the raw
        front, smgrl/api/rl_front.py)."""
        fleet = self.gw.fleet
        cached = self._rows_cache
        if cached is not None and cached[0] == fleet.revision:
            return cached[1]
        facts = fleet.facts()
        rows = [
            row(g.representative, g.ranks, facts_for(g.representative, facts))
            for g in collapse(fleet.registry)
        ]
        body = env.dumps(workers_response(rows))
        self._rows_cache = (fleet.revision, body)
        return body

    async def _workers(self, params, principal) -> Response:
        return Response(self.workers_body(), status=200, content_type=env.JSON)

    async def _worker(self, params, principal) -> Response:
        worker = self._visible(params["id"])
        fleet = self.gw.fleet
        entry = row(worker, dp_ranks_for(worker, fleet.registry), facts_for(worker, fleet.facts()))
        return env.json_response(200, entry)

    def _visible(self, worker_id: str):
        worker = self.gw.fleet.registry.get(worker_id)
        if worker is None or not worker.is_visible:
            raise WorkerNotFound(worker_id)
        return worker

    # -- engine routes -------------------------------------------------------------------------

    async def _proxy(self, params, principal) -> Response:
        # SMG's extractors run before the handler: the body is buffered (413 when a chunked
        # body is too large) before the path, the worker and the endpoint are checked.
        body = await request.get_data(cache=False)
        path = _engine_path(params["path"])
        worker = self._visible(params["id"])
        req = self._control_request(path, passthrough_query(_raw_query()), body)
        result = await self.gw.control.call(worker, req, self._context(principal))
        return _op_response(result)

    async def _fanout(self, params, principal) -> Response:
        raw_query = _raw_query()
        selectors = [v for k, v in query_pairs(raw_query) if k == "selector"]
        if len(selectors) > 1:
            return env.text_response(400, "Failed to deserialize query string: duplicate field `selector`")
        body = await request.get_data(cache=False)  # after the query, before the handler's checks
        source = rust_trim(selectors[0]) if selectors else ""
        if not source:
            raise SelectorRequired()
        try:
            selector = parse_selector(source)
        except SelectorError as exc:
            raise InvalidSelector(str(exc), offset=exc.offset) from None
        path = _engine_path(params["path"])
        req = self._control_request(path, passthrough_query(raw_query), body)
        targets = self.gw.control.targets(selector)
        ctx = self._context(principal)
        if not targets:
            result = await self.gw.control.no_match(selector, req, ctx)
            err = NoWorkersMatch(selector.source)
            return env.json_response(err.status, err.body(), _op_headers(result))
        result = await self.gw.control.fanout(selector, targets, req, ctx)
        return _op_response(result)

    def _control_request(self, path: str, query: str | None, body: bytes) -> ControlRequest:
        forwarded = g.request_id if g.request_id_given else None
        return control_request(request.method, path, query, body, forwarded, request.headers.get)

    def _context(self, principal) -> CallContext:
        check = getattr(g, "audit_check", None)
        return CallContext(
            principal=principal.label if principal else None,
            request_id=g.request_id,
            audit=check.audit_event if check is not None else None,
        )

    async def _operation(self, params, principal) -> Response:
        return await self.journal_routes.operation(params["id"])

    async def _journal(self, params, principal) -> Response:
        return await self.journal_routes.page()


def control_request(
    method: str, path: str, query: str | None, body: bytes, request_id: str | None, get
) -> ControlRequest:
    """The engine call a request asks for (also built by the raw front, smgrl/api/rl_front.py).
    ``request_id`` is the id to forward: the caller's (or the generated id that replaced an
    over-long one), None when the gateway invented it for a caller who sent none. ``get`` reads
    one request header (latin-1 text, first occurrence)."""
    ctype = get("content-type")
    if ctype is None and body:
        ctype = "application/json"
    forward = []
    if request_id is not None:
        forward.append((b"x-request-id", request_id.encode("latin-1")))
    for name in FORWARDED:
        value = get(name.decode())
        if value is not None:
            forward.append((name, value.encode("latin-1")))
    return ControlRequest(method, path, query, body, ctype, tuple(forward))


def _raw_query() -> str | None:
    raw = request.scope.get("query_string", b"")
    return raw.decode("latin-1") if raw else None


def query_pairs(raw: str | None):
    if not raw:
        return
    for piece in raw.split("&"):
        if not piece:
            continue
        key, _, value = piece.partition("=")
        yield unquote_plus(key, errors="replace"), unquote_plus(value, errors="replace")


def _engine_path(decoded: str) -> str:
    try:
        return validate_engine_path(decoded)
    except EnginePathError as exc:
        raise InvalidEnginePath(str(exc)) from None


def _op_headers(result: OpResult) -> dict[str, str]:
    headers = {"x-smgrl-operation-id": result.op_id}
    if not result.journaled:
        headers["x-smgrl-journal"] = "unavailable"
    return headers


def _op_response(result: OpResult) -> Response:
    return env.json_response(
        result.status, None if result.status == 204 else result.body, _op_headers(result)
    )

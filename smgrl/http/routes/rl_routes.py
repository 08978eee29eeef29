"""``/v1/rl/*``: discovery, the per-worker proxy and the fan-out (docs/rl-control-plane.md), routed by hand.

The routes are matched on the RAW path so that the engine catch-all is percent-decoded exactly
once, as SMG's framework does (``a%2Fb`` is two segments, ``%2e%2e`` is ``..``, ``%FF`` is a
400 "Invalid UTF-8 in `path`"), and so that routing runs before auth (unknown routes are 404 and
wrong methods 405 for everybody). Check order per route is the spec's: proxy = path -> worker ->
control endpoint -> send; fan-out = query -> selector -> path -> targets -> send.
"""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import unquote_plus, unquote_to_bytes

from quart import Response, g, request

from smgrl.control import CallContext, ControlRequest, OpResult
from smgrl.core import (
    EnginePathError,
    Selector,
    SelectorError,
    collapse,
    dp_ranks_for,
    facts_for,
    parse_selector,
    passthrough_query,
    row,
    rust_trim,
    validate_engine_path,
    workers_response,
)
from smgrl.core.auth import ENGINE, READ
from smgrl.core.errors import (
    InvalidEnginePath,
    InvalidQuery,
    InvalidSelector,
    JournalUnavailable,
    NoControlEndpoint,
    NoWorkersMatch,
    OperationNotFound,
    SelectorRequired,
    UpstreamTimeout,
    UpstreamUnreachable,
    WorkerNotFound,
)
from smgrl.core.wire import json_bytes
from smgrl.http.bodies import envelopes as env
from smgrl.http.openapi.apidoc import (
    ANY,
    INT,
    STRING,
    TEXT,
    Body,
    Param,
    Resp,
    Route,
    allow_table,
    as_json,
    evolve,
    field,
    model,
    path_param,
)
from smgrl.http.openapi.schemas import (
    FAILED_CALL,
    OP_ID,
    PAYLOAD_TOO_LARGE,
    OpenAIErrorModel,
    RlWorkerEntry,
    RlWorkersResponse,
    rl_error,
    rl_error_resp,
)
from smgrl.http.routes.guard import Guard

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
        self.gateway = gateway
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
        front, smgrl/http/fronts/rl_front.py)."""
        fleet = self.gateway.fleet
        cached = self._rows_cache
        if cached is not None and cached[0] == fleet.revision:
            return cached[1]
        facts = fleet.facts()
        rows = [
            row(g.representative, g.ranks, facts_for(g.representative, facts))
            for g in collapse(fleet.registry)
        ]
        body = json_bytes(workers_response(rows))
        self._rows_cache = (fleet.revision, body)
        return body

    async def _workers(self, params, principal) -> Response:
        return Response(self.workers_body(), status=200, content_type=env.JSON)

    async def _worker(self, params, principal) -> Response:
        worker = self._visible(params["id"])
        fleet = self.gateway.fleet
        entry = row(worker, dp_ranks_for(worker, fleet.registry), facts_for(worker, fleet.facts()))
        return env.json_response(200, entry)

    def _visible(self, worker_id: str):
        worker = self.gateway.fleet.registry.get(worker_id)
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
        req = self._control_request(path, passthrough_query(raw_query()), body)
        result = await self.gateway.control.call(worker, req, self._context(principal))
        return _op_response(result)

    async def _fanout(self, params, principal) -> Response:
        query = raw_query()
        selectors = [v for k, v in query_pairs(query) if k == "selector"]
        if len(selectors) > 1:
            return env.text_response(400, "Failed to deserialize query string: duplicate field `selector`")
        body = await request.get_data(cache=False)  # after the query, before the handler's checks
        selector = selector_param(selectors)
        path = _engine_path(params["path"])
        req = self._control_request(path, passthrough_query(query), body)
        targets = self.gateway.control.targets(selector)
        ctx = self._context(principal)
        if not targets:
            result = await self.gateway.control.no_match(selector, req, ctx)
            err = NoWorkersMatch(selector.source)
            return env.json_response(err.status, err.body(), _op_headers(result))
        result = await self.gateway.control.fanout(selector, targets, req, ctx)
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
    """The engine call a request asks for (also built by the raw front, smgrl/http/fronts/rl_front.py).
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


def raw_query() -> str | None:
    """The request's query string as sent (latin-1), or None."""
    raw = request.scope.get("query_string", b"")
    return raw.decode("latin-1") if raw else None


def selector_param(selectors: list[str]) -> Selector:
    """The one ``selector`` query value, trimmed and parsed (400 ``selector_required`` when absent
    or blank, ``invalid_selector`` with its offset); a repeated one was refused before."""
    source = rust_trim(selectors[0]) if selectors else ""
    if not source:
        raise SelectorRequired()
    try:
        return parse_selector(source)
    except SelectorError as exc:
        raise InvalidSelector(str(exc), offset=exc.offset) from None


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


# -- /openapi.json: these routes, their models and their errors (smgrl/http/openapi/apidoc.py) ---------------
# Served by RlApi.dispatch above and, for discovery and the engine calls, by the raw fronts of
# smgrl/http/fronts/rl_front.py (DiscoveryFront, EngineFront): the same routes, the same answers.


@model(additional=True, inline=True)
class _Outcome:
    """One target's recorded outcome in an Operation (null until it arrives)."""

    status: int | None = field(optional=True)
    latency_ms: int | None = field(optional=True)
    error: str | None = field(optional=True)
    message: str | None = field(optional=True)
    excerpt: str | None = field(optional=True)
    body_truncated: bool | None = field(optional=True)


@model(description="One engine answer (any status: the per-worker route mirrors it).")
class RlCallOutcome:
    worker_id: str
    url: str
    status: int = field(minimum=100, maximum=999)
    latency_ms: int = field(minimum=0)
    body: Any = field(
        schema={
            "description": "the engine's JSON when its content-type contains `json` and the bytes "
            "parse, else its text (lossy UTF-8); at most 1 MiB"
        }
    )
    body_truncated: bool = field("present only when true", optional=True, enum=[True])


@model
class RlFailedCall:
    worker_id: str
    url: str
    error: str = field(schema={"type": "string", "enum": FAILED_CALL})
    message: str
    status: int = field("the engine's status, with upstream_error only", optional=True)
    connection_mode: str = field("with no_control_endpoint only", optional=True)


@model(
    description="200 when `failed` is empty, else 207. `results` holds every engine that answered "
    "(any status); `failed` every non-2xx answer (upstream_error) and every transport failure."
)
class RlFanoutResponse:
    results: dict[str, RlCallOutcome]
    failed: list[RlFailedCall]
    total: int = field(minimum=1)
    succeeded: int = field(minimum=0)


@model(additional=True)
class OperationTarget:
    worker_id: str
    url: str
    control_url: str | None = field(optional=True)
    outcome: _Outcome | None


@model(additional=True, description="The journal's record of one per-worker call or fan-out.")
class Operation:
    operation_id: str
    kind: Literal["call", "fanout"]
    method: str
    path: str
    query: str | None
    selector: str | None
    status: Literal["open", "finished"]
    result: Literal["ok", "partial", "no_match", "failed", "cancelled", "interrupted"] | None
    http_status: int | None
    total: int = field(minimum=0)
    succeeded: int = field(minimum=0)
    latency_ms: int | None
    targets: list[OperationTarget]
    missing_targets: list[str]
    started_seq: int


@model
class JournalEvent:
    seq: int = field(minimum=1)
    ts: float
    stream: str
    type: str
    schema: int
    payload: dict = field(schema={"type": "object", "additionalProperties": True})


@model
class JournalPage:
    events: list[JournalEvent]
    next_after: int = field(minimum=0)
    last_seq: int = field(minimum=0)
    more: bool


ENGINE_PATH = path_param(
    "path",
    "The engine route: 1 to 4 segments of [A-Za-z0-9._-] (neither `.` nor `..`), "
    "percent-decoded once (send `/` between segments raw; `%2F` is decoded to `/` too).",
    schema={"type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"},
    example="flush_cache",
)
SELECTOR = Param(
    "selector",
    "query",
    "Label selector: `k=v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, comma-joined (AND). "
    "Other query parameters are passed through to the engines.",
    required=True,
    example="engine=sglang",
)
WORKER_ID = path_param("id", "the worker id (GET /v1/rl/workers)")
BAD_UTF8 = Resp("Invalid UTF-8 in a path parameter.", TEXT)


def _engine_responses(fanout: bool) -> dict[str, Resp]:
    """The per-worker route mirrors the engine's status, so each status may carry an RlCallOutcome
    beside the gateway's own errors; the fan-out answers its own statuses."""
    mirrored = "" if fanout else " (or the engine's own status, mirrored, with an RlCallOutcome)"

    def errors(description: str, *errs: Any, text: bool = False) -> Resp:
        schema = rl_error(*errs) if fanout else {"anyOf": [RlCallOutcome, rl_error(*errs)]}
        content = {**as_json(schema), **(TEXT if text else {})}
        return Resp(description + mirrored + ".", content, OP_ID, errors=errs)

    out: dict[str, Resp] = {}
    if fanout:
        out["200"] = Resp("Every target answered 2xx.", as_json(RlFanoutResponse), OP_ID)
        out["207"] = Resp(
            "At least one target failed (non-2xx, unreachable, timeout).", as_json(RlFanoutResponse), OP_ID
        )
        bad = (SelectorRequired, InvalidSelector, NoWorkersMatch, InvalidEnginePath)
        out["400"] = errors(
            "Invalid selector or engine path; text/plain for a duplicate `selector` or invalid UTF-8 in "
            "a path parameter",
            *bad,
            text=True,
        )
        out["404"] = Resp("No such route.", as_json(OpenAIErrorModel), OP_ID, errors=("unknown_url",))
    else:
        out["400"] = errors(
            "Invalid engine path; text/plain for invalid UTF-8 in a path parameter",
            InvalidEnginePath,
            text=True,
        )
        out["404"] = Resp(
            "Unknown worker, or no such route" + mirrored + ".",
            as_json({"anyOf": [RlCallOutcome, rl_error(WorkerNotFound), OpenAIErrorModel]}),
            OP_ID,
            errors=(WorkerNotFound, "unknown_url"),
        )
        out["422"] = errors("No control endpoint", NoControlEndpoint)
        out["502"] = errors("Engine unreachable", UpstreamUnreachable)
        out["504"] = errors("No answer within --rl-control-timeout-secs", UpstreamTimeout)
    out["413"] = PAYLOAD_TOO_LARGE
    out["500"] = errors("Gateway bug", "internal_error")
    out["503"] = errors("The journal cannot record the operation; no engine was called", JournalUnavailable)
    if not fanout:
        out["default"] = Resp(
            "Any other engine status, mirrored (2xx, 3xx: redirects are not followed, 4xx, 5xx).",
            as_json(RlCallOutcome),
            OP_ID,
        )
    return out


def _engine_routes(fanout: bool) -> list[Route]:
    what = "every worker the selector matches" if fanout else "one worker"
    get = Route(
        "GET",
        "/v1/rl/engine/{path}" if fanout else "/v1/rl/workers/{id}/engine/{path}",
        "getFanout" if fanout else "getProxy",
        "rl",
        f"Send an engine-native control call to {what} (admin role, D3)",
        _engine_responses(fanout),
        description="The engine gets the method, path, passthrough query, body and content-type, and "
        "x-request-id/traceparent/tracestate; the worker's own API key as bearer. Redirects are not "
        "followed. Recorded in the journal (x-smgrl-operation-id).",
        role="admin",
        params=(ENGINE_PATH, SELECTOR) if fanout else (WORKER_ID, ENGINE_PATH),
        rl_only=True,
        name="fanout" if fanout else "proxy",
    )
    post = evolve(
        get,
        method="POST",
        operation_id=get.operation_id.replace("get", "post"),
        body=Body(
            ANY,
            required=False,
            description="Forwarded verbatim (content-type defaults to application/json when a body is sent).",
        ),
    )
    return [get, post]


def _not_found(error: type) -> Resp:
    return Resp(
        "Unknown id, or no such route.",
        as_json({"anyOf": [rl_error(error), OpenAIErrorModel]}),
        errors=(error, "unknown_url"),
    )


def _journal_param(name: str, description: str, schema: dict) -> Param:
    return Param(name, "query", description, schema, allow_empty=True)


# One Route per operation: entries alike in shape stay apart (each is its own route's contract).
OPENAPI_ROUTES = (
    Route(
        "GET",
        "/v1/rl/workers",
        "getRlWorkers",
        "rl",
        "Discovery: one row per engine (DP ranks collapsed)",
        {"200": Resp("The rows.", as_json(RlWorkersResponse))},
        role="read",
        name="workers",
        rl_only=True,
    ),
    Route(
        "GET",
        "/v1/rl/workers/{id}",
        "getRlWorker",
        "rl",
        "One discovery row (that registry entry)",
        {
            "200": Resp("The row.", as_json(RlWorkerEntry)),
            "400": BAD_UTF8,
            "404": _not_found(WorkerNotFound),
        },
        role="read",
        params=(path_param("id", "the worker id"),),
        name="worker",
        rl_only=True,
    ),
    *_engine_routes(fanout=False),
    *_engine_routes(fanout=True),
    Route(
        "GET",
        "/v1/rl/operations/{id}",
        "getRlOperation",
        "rl",
        "The journal's record of one operation (smgrl addition)",
        {
            "200": Resp("The record.", as_json(Operation)),
            "400": BAD_UTF8,
            "404": _not_found(OperationNotFound),
        },
        role="read",
        params=(path_param("id", "x-smgrl-operation-id of a per-worker call or fan-out"),),
        name="operation",
        rl_only=True,
    ),
    Route(
        "GET",
        "/v1/rl/journal",
        "getRlJournal",
        "rl",
        "Journal events, paged (smgrl addition)",
        {
            "200": Resp("A page.", as_json(JournalPage)),
            "400": rl_error_resp(
                "`after`/`upto`/`limit` not an integer or too small, `since`/`until` not a time, or "
                "`type` naming no event type.",
                InvalidQuery,
            ),
        },
        role="read",
        params=(
            _journal_param("after", "events after this seq (empty: 0)", {**INT, "minimum": 0, "default": 0}),
            _journal_param(
                "limit",
                "page size (empty: 100; at most 1000 are returned)",
                {**INT, "minimum": 1, "default": 100},
            ),
            _journal_param(
                "upto", "events up to and including this seq (empty: the head)", {**INT, "minimum": 0}
            ),
            _journal_param(
                "type",
                "only these event types: comma-separated names or globs (`worker.*,control.finished`)",
                STRING,
            ),
            *(
                _journal_param(
                    name,
                    f"events committed {what} this time: ISO 8601 (`2026-11-29T11:55:33Z`), unix seconds, "
                    "or `15m`/`2h`/`1d` ago",
                    STRING,
                )
                for name, what in (("since", "at or after"), ("until", "before"))
            ),
        ),
        name="journal",
        rl_only=True,
    ),
)
# route name (``match``) -> the methods it serves (the ``allow`` of its 405): the table's.
ALLOW = allow_table(OPENAPI_ROUTES, by_name=True)

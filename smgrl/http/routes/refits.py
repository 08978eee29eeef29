"""Refit and quarantine routes (docs/refits.md): parse, authorize, call ``RefitService``, render.

POST   /v1/rl/refits                      (admin) start a refit saga -> 202 {refit_id, ...}
GET    /v1/rl/refits                      the sagas, newest first (?limit, ?state)
GET    /v1/rl/refits/{id}                 the plan and each engine's phase
GET    /v1/rl/refits/{id}/events          server-sent events: the same record on every change
POST   /v1/rl/refits/{id}/commit          (admin) the trainer's transfer is done
POST   /v1/rl/refits/{id}/fail            (admin) the trainer's transfer failed
POST   /v1/rl/refits/{id}/transfer        (admin) one broadcast chunk's engine side
POST   /v1/rl/workers/{id}/quarantine     (admin) hold an engine out of routing, by hand
DELETE /v1/rl/workers/{id}/quarantine     (admin) release it
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Literal

import trio
from quart import Response, g, request

from smgrl.cluster.forwarding import PeerGone, PeerUnreachable, hops
from smgrl.core.auth import READ, WRITE
from smgrl.core.errors import (
    InvalidBody,
    InvalidQuery,
    InvalidSelector,
    InvalidVersion,
    JournalUnavailable,
    NoWorkersMatch,
    TooManyStreams,
    WorkerNotFound,
)
from smgrl.core.wire import json_bytes
from smgrl.http.bodies import envelopes as env
from smgrl.http.openapi.apidoc import (
    OBJECT,
    STRING,
    Body,
    Param,
    Resp,
    Route,
    allow_table,
    as_json,
    field,
    model,
    path_param,
)
from smgrl.http.openapi.schemas import rl_error_resp
from smgrl.http.routes.event_streams import EventStreams
from smgrl.http.routes.guard import Guard
from smgrl.refit import (
    CheckpointMissing,
    RefitDriverUnavailable,
    RefitInProgress,
    RefitNotFound,
    RefitUnsupported,
    RefitWrongState,
    VersionLeft,
    parse_refit,
)

SSE_KEEPALIVE_SECS = 15.0
PLANS_CACHED = 64  # serialized plans kept (sagas being watched; a plan is fixed per saga)
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


HAND_OFF_MARGIN_SECS = 10.0  # a forwarded trainer hand-off waits the control timeout plus this


def _small_json(data: bytes, fields: dict[str, type]) -> dict:
    """An optional JSON object body with a few known fields (empty body = {})."""
    if not data.strip():
        return {}
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidBody("the body is not JSON") from None
    if not isinstance(body, dict):
        raise InvalidBody("the body must be a JSON object")
    for key, value in body.items():
        if key not in fields:
            raise InvalidBody(f"unknown field `{key}`")
        if value is not None and not isinstance(value, fields[key]):
            raise InvalidBody(f"`{key}` has the wrong type")
    return body


LIST_DEFAULT, LIST_MAX = 50, 256  # sagas listed by GET /v1/rl/refits (the projection keeps 256)
STATES = frozenset(
    {"running", "awaiting_transfer", "committing", "transfer_failed", "rolling_back", "recovering"}
    | {"succeeded", "quarantined", "partial", "failed", "rolled_back", "aborted"}
)


def _listing_query(args) -> tuple[int, str | None]:
    """``?limit=N`` (1..256, default 50) and ``?state=S`` (a state or a result)."""
    unknown = sorted(set(args) - {"limit", "state"})
    if unknown:
        raise InvalidQuery(f"unknown query parameter `{unknown[0]}` (limit, state)")
    raw = args.get("limit")
    limit = LIST_DEFAULT
    if raw is not None:
        if not (raw.isascii() and raw.isdigit() and len(raw) <= 4 and 1 <= int(raw) <= LIST_MAX):
            raise InvalidQuery(f"`limit` must be an integer in 1..{LIST_MAX}")
        limit = int(raw)
    state = args.get("state")
    if state is not None and state not in STATES:
        raise InvalidQuery(f"`state` must be one of {', '.join(sorted(STATES))}")
    return limit, state


class RefitsApi:
    def __init__(self, gateway, streams: EventStreams) -> None:
        self.gateway = gateway
        self.guard = Guard(gateway)
        self.streams = streams
        self._plans: OrderedDict[str, bytes] = OrderedDict()  # refit id -> its plan as JSON

    @property
    def service(self):
        return self.gateway.refits

    def register(self, app) -> None:
        # Every method is routed here so that the others answer 405 (with ``allow``), not 404.
        app.add_url_rule("/v1/rl/refits", "refit_create", self.refits, methods=METHODS)
        app.add_url_rule("/v1/rl/refits/<refit_id>", "refit_show", self.refit, methods=METHODS)
        app.add_url_rule("/v1/rl/refits/<refit_id>/events", "refit_events", self.events, methods=METHODS)
        for action in ("commit", "fail", "transfer"):
            app.add_url_rule(
                f"/v1/rl/refits/<refit_id>/{action}",
                f"refit_{action}",
                self._action_view(action),
                methods=METHODS,
            )
        app.add_url_rule(
            "/v1/rl/workers/<worker_id>/quarantine", "refit_quarantine", self.quarantine, methods=METHODS
        )

    def _action_view(self, action: str):
        async def view(refit_id: str) -> Response:
            return await self.action(refit_id, action)

        return view

    async def _guarded(self, action: str, allow: str, handler) -> Response:
        raw = request.scope.get("raw_path") or request.path.encode()
        shown = raw.decode("latin-1")
        if request.method not in allow.split(","):
            return env.method_not_allowed(request.method, shown, allow)

        async def call(check) -> Response:
            return await handler(check.principal.label if check.principal is not None else None)

        return await self.guard.answer(action, shown, call)

    async def refits(self) -> Response:
        allow = ALLOW["refit_create"]
        if request.method in ("GET", "HEAD"):

            async def listing(_principal):
                limit, state = _listing_query(request.args)
                return env.json_response(200, {"refits": self.service.listing(limit, state)})

            return await self._guarded(READ, allow, listing)

        async def start(principal):
            req = parse_refit(await request.get_data(cache=False))
            refit_id = await self.service.start(req, principal, getattr(g, "request_id", None))
            body = self.service.view(self.service.get(refit_id))
            return env.json_response(202, body, {"location": f"/v1/rl/refits/{refit_id}"})

        return await self._guarded(WRITE, allow, start)

    def _render(self, saga) -> bytes:
        """The record (``RefitService.view``) as JSON, its plan serialized once per saga: the plan
        never changes after ``refit.started`` and is most of the bytes (64 engines: about 50 of
        66 KB), and the event stream sends the record on every change."""
        body = self.service.view(saga)
        plan = self._plans.pop(saga.refit_id, None)
        if plan is None:
            plan = json_bytes(body["plan"])
        self._plans[saga.refit_id] = plan  # most recently used last
        while len(self._plans) > PLANS_CACHED:
            self._plans.popitem(last=False)
        del body["plan"]
        return json_bytes(body)[:-1] + b',"plan":' + plan + b"}"

    async def refit(self, refit_id: str) -> Response:
        async def show(_principal):
            body = self._render(self.service.get(refit_id))
            return Response(body, status=200, content_type=env.JSON)

        return await self._guarded(READ, "GET,HEAD", show)

    async def events(self, refit_id: str) -> Response:
        async def stream(_principal):
            self.service.get(refit_id)  # 404 before the stream starts
            self.streams.admit()  # 429 too_many_streams
            return Response(
                self.streams.counted(self._sse(refit_id)),
                status=200,
                content_type="text/event-stream",
                headers={"cache-control": "no-store"},
            )

        return await self._guarded(READ, "GET", stream)

    async def _sse(self, refit_id: str):
        """The refit's record on every change, until it finishes (then one last record)."""
        last = None
        while True:
            # Take the change event BEFORE reading the record: a change while this generator is
            # suspended at a yield then still wakes it.
            changed = self.service.change_event()
            saga = self.service.fleet.sagas.get(refit_id)
            if saga is None:
                return
            # Decided from the record about to be sent, not from the saga after the yield: the
            # saga object moves on while this generator waits at the yield (a large record to a
            # slow reader), and ending on its later state would never send the final record.
            finished, seq = saga.result is not None, saga.last_seq
            if seq != last:
                last = seq
                yield b"event: refit\nid: %d\ndata: " % seq + self._render(saga) + b"\n\n"
            if finished:
                return
            with trio.move_on_after(SSE_KEEPALIVE_SECS) as scope:
                await changed.wait()
            if scope.cancelled_caught:
                yield b": keepalive\n\n"

    async def action(self, refit_id: str, action: str) -> Response:
        async def run(_principal):
            data = await request.get_data(cache=False)
            forwarded = await self._forwarded(refit_id, data)
            if forwarded is not None:
                return forwarded
            if action == "commit":
                _small_json(data, {})
                await self.service.commit(refit_id)
            elif action == "fail":
                body = _small_json(data, {"reason": str})
                await self.service.fail(refit_id, body.get("reason"))
            else:
                body = _small_json(data, {"names": list, "dtypes": list, "shapes": list})
                if any(not isinstance(body.get(k), list) for k in ("names", "dtypes", "shapes")):
                    raise InvalidBody("`names`, `dtypes` and `shapes` are required lists")
                if not len(body["names"]) == len(body["dtypes"]) == len(body["shapes"]):
                    raise InvalidBody("`names`, `dtypes` and `shapes` must have the same length")
                out = await self.service.transfer_chunk(
                    refit_id, body["names"], body["dtypes"], body["shapes"]
                )
                return env.json_response(200, out)
            return env.json_response(202, self.service.view(self.service.get(refit_id)))

        return await self._guarded(WRITE, "POST", run)

    async def _forwarded(self, refit_id: str, data: bytes) -> Response | None:
        """Several processes: the trainer's hand-off goes to the process driving the saga, which
        holds it in memory (smgrl/cluster/forwarding.py); the caller's key was checked here and is checked
        again there. None: this process drives it (or it is not open): served here."""
        fwd = self.gateway.forwarder
        saga = self.service.fleet.sagas.get(refit_id)
        if fwd is None or (saga is not None and not saga.is_open) or self.service.drives(refit_id):
            return None
        peer = await fwd.saga_peer(refit_id)
        if peer is None:
            return None
        raw = request.scope.get("raw_path") or request.path.encode()
        target = raw + (b"?" + request.query_string if request.query_string else b"")
        headers = list(request.scope["headers"])
        rid = getattr(g, "request_id", None)
        if rid and not any(k == b"x-request-id" for k, _ in headers):
            headers.append((b"x-request-id", rid.encode()))  # one id in both processes' logs
        # Bounded: a driver that hangs (not dead: its presence lease still held) must not hold
        # the trainer's call for ever. Its longest answer is a chunk's engine calls (each bounded
        # by the control timeout, run at once). commit/fail are idempotent: the retry is safe.
        wait = self.gateway.cfg.rl.control_timeout_secs + HAND_OFF_MARGIN_SECS

        def state() -> str:  # the saga's state when the hand-off could not be forwarded
            return self.service.get(refit_id).to_json()["state"]

        try:
            with trio.fail_after(wait):
                status, out, body = await fwd.request(
                    peer, request.method, target.decode("latin-1"), headers, data, hops(headers)
                )
        except trio.TooSlowError:
            raise RefitDriverUnavailable(
                f"refit `{refit_id}` is driven by gateway process {peer.gateway}, which did not"
                f" answer within {wait:g}s: retry this call (docs/scale-out.md)",
                state=state(),
            ) from None
        except PeerUnreachable as exc:  # never from here (configuration): retrying cannot help
            raise RefitWrongState(
                f"refit `{refit_id}` is driven by another gateway process, which cannot take the"
                f" trainer's call from here: {exc} (docs/scale-out.md)",
                state=state(),
            ) from None
        except PeerGone as exc:
            # The driver died: the recovery lease's holder resumes the saga once the driver's
            # presence lease expired; the trainer retries this same call meanwhile.
            raise RefitDriverUnavailable(
                f"refit `{refit_id}` is driven by another gateway process: {exc}. Another process"
                " resumes the saga within seconds: retry this call (docs/scale-out.md)",
                state=state(),
            ) from None
        # The owner served it and journaled its audit event: not a second one from here (the
        # log line here remains). Only once it answered: a call that never reached it is
        # audited here, with the answer given here.
        check = getattr(g, "audit_check", None)
        if check is not None:
            check.journaled = True
        response = Response(body, status=status)
        for name, value in out:
            response.headers[name.decode("latin-1")] = value.decode("latin-1")
        return response

    async def quarantine(self, worker_id: str) -> Response:
        async def run(principal):
            data = await request.get_data(cache=False)
            body = _small_json(data, {"reason": str})
            worker = self.gateway.fleet.registry.get(worker_id)
            if worker is None or not worker.is_visible:
                raise WorkerNotFound(worker_id)
            reason = (
                body.get("reason")
                or ("quarantined by hand" if request.method == "POST" else "released by hand")
            )[:500]
            if request.method == "POST":
                await self.service.quarantine(worker, reason, principal)
            else:
                await self.service.release(worker, reason, principal)
            facts = self.gateway.fleet.engines.get(worker.base_url)
            return env.json_response(
                200,
                {
                    "worker_id": worker.id,
                    "quarantined": facts is not None and facts.quarantined is not None,
                    "reason": facts.quarantined if facts is not None else None,
                },
            )

        return await self._guarded(WRITE, "POST,DELETE", run)


# -- /openapi.json: these routes, their models and their errors (smgrl/http/openapi/apidoc.py) ---------------

_NON_BLANK = {"type": "string", "minLength": 1, "pattern": "\\S"}
# `source` is one of two shapes (smgrl/refit/request.py): a plain schema, as attrs has no oneOf.
_SOURCE = {
    "oneOf": [
        {
            "type": "object",
            "required": ["disk"],
            "additionalProperties": False,
            "properties": {
                "disk": {
                    "type": "object",
                    "required": ["model_path"],
                    "additionalProperties": False,
                    "properties": {"model_path": _NON_BLANK},
                }
            },
        },
        {
            "type": "object",
            "required": ["distributed"],
            "additionalProperties": False,
            "properties": {
                "distributed": {
                    "type": "object",
                    "required": ["master_address", "master_port"],
                    "additionalProperties": False,
                    "properties": {
                        "master_address": _NON_BLANK,
                        "master_port": {"type": "integer", "minimum": 1, "maximum": 65535},
                        "group_name": STRING,
                        "backend": {"type": "string", "enum": ["nccl", "gloo"]},
                        "checksums": {"type": "object", "additionalProperties": STRING},
                    },
                }
            },
        },
    ]
}


@model(inline=True)
class _RefitRequest:
    selector: str = field(example="engine=sglang")
    source: dict = field(schema=_SOURCE)
    weight_version: str
    pause_mode: str = field(
        "default per engine kind: sglang retract, vllm keep, tokenspeed keep", optional=True
    )
    flush: bool = field(optional=True, default=True)
    on_failure: Literal["quarantine", "rollback", "abort"] = field(optional=True, default="quarantine")
    force: bool = field(optional=True, default=False)
    transfer_timeout_secs: float = field(
        optional=True, default=600, minimum=0, exclusiveMinimum=True, maximum=86400
    )


@model(
    additional=True,
    inline=True,
    description="The saga: state, plan per engine, each engine's phase and verification (docs/refits.md).",
)
class _Refit:
    refit_id: str = field(optional=True)
    state: str = field(optional=True)
    result: str | None = field(optional=True)
    engines: list = field(optional=True, schema={"type": "array"})


@model(inline=True)
class _Reason:
    reason: str | None = field(optional=True)


@model(inline=True)
class _Chunk:
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]


@model(inline=True)
class _Empty:
    pass


REFIT_ID = path_param("id", "the refit id")
_NOT_FOUND = rl_error_resp("No such refit (refit_not_found).", RefitNotFound)
_WRONG_STATE = rl_error_resp("The refit is not awaiting a transfer (refit_state).", RefitWrongState)
_JOURNAL_DOWN = rl_error_resp("The journal cannot record it (journal_unavailable).", JournalUnavailable)
_HAND_OFF_DOWN = rl_error_resp(
    "The journal cannot record it (journal_unavailable), or the process driving the saga died and"
    " none resumed it yet (refit_driver_unavailable: retry).",
    JournalUnavailable,
    RefitDriverUnavailable,
)
_BAD_BODY = rl_error_resp("Bad body (invalid_body).", InvalidBody)
_GOES_ON = Resp("The saga goes on.", as_json(_Refit))


def _action(path: str, op_id: str, summary: str, ok: dict, body: Any, bad: Resp = _BAD_BODY) -> Route:
    return Route(
        "POST",
        path,
        op_id,
        "rl",
        summary,
        {**ok, "400": bad, "404": _NOT_FOUND, "409": _WRONG_STATE, "503": _HAND_OFF_DOWN},
        role="admin",
        params=(REFIT_ID,),
        body=Body(body, required=False),
        rl_only=True,
        name="refit_" + path.rsplit("/", 1)[1],
    )


def _quarantine(method: str) -> Route:
    return Route(
        method,
        "/v1/rl/workers/{id}/quarantine",
        f"{method.lower()}WorkerQuarantine",
        "rl",
        ("Quarantine a worker by hand" if method == "POST" else "Release a quarantined worker")
        + " (journaled; admin role)",
        {
            "200": Resp("The worker's quarantine state.", as_json(OBJECT)),
            "400": _BAD_BODY,
            "404": rl_error_resp("No such worker (worker_not_found).", WorkerNotFound),
            "503": _JOURNAL_DOWN,
        },
        role="admin",
        params=(path_param("id", "the worker id"),),
        body=Body(_Reason, required=False),
        rl_only=True,
        name="refit_quarantine",
    )


# One Route per operation: entries alike in shape stay apart (each is its own route's contract).
OPENAPI_ROUTES = (
    Route(
        "POST",
        "/v1/rl/refits",
        "postRefit",
        "rl",
        "Start a refit saga (admin role)",
        {
            "202": Resp("Accepted: the saga runs; poll or stream it.", as_json(_Refit)),
            "400": rl_error_resp(
                "Bad body (invalid_body, invalid_version, invalid_selector, no_workers_match).",
                InvalidBody,
                InvalidVersion,
                InvalidSelector,
                NoWorkersMatch,
            ),
            "409": rl_error_resp(
                "Engines that cannot take the source (refit_unsupported, with `engines`), a version the fleet "
                "already left (version_left), a refit already running (refit_in_progress), or a checkpoint "
                "path missing on this host where every engine runs (checkpoint_not_found): nothing paused.",
                RefitUnsupported,
                VersionLeft,
                RefitInProgress,
                CheckpointMissing,
            ),
            "503": _JOURNAL_DOWN,
        },
        role="admin",
        body=Body(_RefitRequest, required=False),
        rl_only=True,
        name="refit_create",
    ),
    Route(
        "GET",
        "/v1/rl/refits",
        "getRefits",
        "rl",
        "The refit sagas in memory (open ones and the last finished), newest first",
        {
            "200": Resp(
                "`{refits: [...]}`: each saga's summary (no plan; engines counted by status).",
                as_json(OBJECT),
            ),
            "400": rl_error_resp("A bad `limit` or `state` (invalid_query).", InvalidQuery),
        },
        role="read",
        params=(
            Param("limit", "query", f"at most this many, 1..{LIST_MAX} (default {LIST_DEFAULT})"),
            Param("state", "query", "only sagas in this state or with this result"),
        ),
        rl_only=True,
        name="refit_create",
    ),
    Route(
        "GET",
        "/v1/rl/refits/{id}",
        "getRefit",
        "rl",
        "A refit: plan and each engine's phase",
        {"200": Resp("The saga.", as_json(_Refit)), "404": _NOT_FOUND},
        role="read",
        params=(REFIT_ID,),
        rl_only=True,
        name="refit_show",
    ),
    Route(
        "GET",
        "/v1/rl/refits/{id}/events",
        "getRefitEvents",
        "rl",
        "Server-sent events: the refit's record on every change, until it finishes",
        {
            "200": Resp("text/event-stream", {"text/event-stream": STRING}),
            "404": _NOT_FOUND,
            "429": rl_error_resp(
                "--max-event-streams event streams are open (too_many_streams); retry later.", TooManyStreams
            ),
        },
        role="read",
        params=(REFIT_ID,),
        head=False,
        rl_only=True,
        name="refit_events",
    ),
    _action(
        "/v1/rl/refits/{id}/commit",
        "postRefitCommit",
        "The trainer's transfer is done: finish, version, verify, flush, resume",
        {"202": _GOES_ON},
        _Empty,
        rl_error_resp("Bad body (invalid_body): `{}` or nothing.", InvalidBody),
    ),
    _action(
        "/v1/rl/refits/{id}/fail",
        "postRefitFail",
        "The trainer's transfer failed: on_failure applies",
        {"202": _GOES_ON},
        _Reason,
    ),
    _action(
        "/v1/rl/refits/{id}/transfer",
        "postRefitTransfer",
        "The engines' half of one broadcast chunk (each kind's update call)",
        {"200": Resp("Per-engine results.", as_json(OBJECT))},
        _Chunk,
    ),
    _quarantine("POST"),
    _quarantine("DELETE"),
)
# The methods each endpoint serves (the rest answer 405 with this ``allow``): the table's.
ALLOW = allow_table(OPENAPI_ROUTES, by_name=True)

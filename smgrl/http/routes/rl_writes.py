"""Explicit version and state writes (docs/data-plane.md, "The version table and explicit
writes"): SMG-local, journaled, no engine call.

    POST /v1/rl/workers/{id}/version   {"weight_version": "<v>"}     -> 200 the worker's row
    POST /v1/rl/workers/{id}/state     {"control": "active|paused|asleep"} -> 200 the row
    POST /v1/rl/version?selector=...   {"weight_version": "<v>"}     -> 200 RlWorkersResponse
    POST /v1/rl/state?selector=...     {"control": ...}              -> 200 RlWorkersResponse

Check order (A.1): (duplicate ``selector`` query) -> body (a JSON rejection or a bad enum such as
``"napping"`` is 400 ``invalid_body`` with the framework's text) -> version validation
(``invalid_version``) -> worker lookup (404) / selector (``selector_required``,
``invalid_selector``, ``no_workers_match``). Then the service (smgrl/control/writes.py) appends
one ``engine.version_set`` / ``engine.state_set`` event and awaits it, so the answer's rows,
discovery and routing already reflect the write. Writes need the ``admin`` role (any
control-plane write does).
"""

from __future__ import annotations

from typing import Literal

from quart import Response, request

from smgrl.core import (
    MalformedVersion,
    collapse,
    dp_ranks_for,
    facts_for,
    row,
    validate_version,
    workers_response,
)
from smgrl.core.auth import WRITE
from smgrl.core.errors import (
    InvalidBody,
    InvalidSelector,
    InvalidVersion,
    JournalUnavailable,
    NoWorkersMatch,
    SelectorRequired,
    WorkerNotFound,
)
from smgrl.http.bodies import envelopes as env
from smgrl.http.bodies.serde_body import SerdeError, parse_struct
from smgrl.http.openapi.apidoc import Body, Resp, Route, as_json, field, model, path_param
from smgrl.http.openapi.schemas import PAYLOAD_TOO_LARGE, RlWorkerEntry, RlWorkersResponse, rl_error_resp
from smgrl.http.routes.guard import Guard, who
from smgrl.http.routes.rl_routes import SELECTOR, query_pairs, raw_query, selector_param

CONTROL_STATES = ("active", "paused", "asleep")
SCHEMAS = {
    "version": ("SetWeightVersion", {"weight_version": "str"}, ("weight_version",)),
    "state": ("SetControlState", {"control": "enum:" + ",".join(CONTROL_STATES)}, ("control",)),
}
DESERIALIZE = "Failed to deserialize the JSON body into the target type: "
SYNTAX = "Failed to parse the request body as JSON: "
ALLOW = "POST"


def parse_write(kind: str, data: bytes) -> str:
    """The validated value of a write body (the version, trimmed; or the control state)."""
    name, fields, required = SCHEMAS[kind]
    try:
        body = parse_struct(data, name, fields, required)
    except SerdeError as exc:
        raise InvalidBody((SYNTAX if exc.syntax else DESERIALIZE) + exc.message) from None
    if kind == "state":
        return body["control"]
    try:
        return validate_version(body["weight_version"])
    except MalformedVersion as exc:
        raise InvalidVersion(str(exc)) from None


class RlWrites:
    def __init__(self, gateway) -> None:
        self.gateway = gateway
        self.guard = Guard(gateway)

    def register(self, app) -> None:
        methods = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

        async def worker_version(worker_id: str) -> Response:
            return await self.handle("version", worker_id)

        async def worker_state(worker_id: str) -> Response:
            return await self.handle("state", worker_id)

        async def fleet_version() -> Response:
            return await self.handle("version", None)

        async def fleet_state() -> Response:
            return await self.handle("state", None)

        # All methods are routed here so that a GET answers 405 (allow: POST) instead of falling
        # through to the /v1/rl catch-all's 404.
        app.add_url_rule(
            "/v1/rl/workers/<worker_id>/version", "rl_worker_version", worker_version, methods=methods
        )
        app.add_url_rule("/v1/rl/workers/<worker_id>/state", "rl_worker_state", worker_state, methods=methods)
        app.add_url_rule("/v1/rl/version", "rl_fleet_version", fleet_version, methods=methods)
        app.add_url_rule("/v1/rl/state", "rl_fleet_state", fleet_state, methods=methods)

    async def handle(self, kind: str, worker_id: str | None) -> Response:
        raw = request.scope.get("raw_path") or request.path.encode()
        shown = raw.decode("latin-1")
        if request.method != "POST":
            return env.method_not_allowed(request.method, shown, ALLOW)

        async def call(check) -> Response:
            if worker_id is None:
                return await self._fleet(kind, check.principal)
            return await self._worker(kind, worker_id, check.principal)

        return await self.guard.answer(WRITE, shown, call)

    async def _worker(self, kind: str, worker_id: str, principal) -> Response:
        value = parse_write(kind, await request.get_data(cache=False))
        worker = await self.gateway.writes.set_worker(kind, value, worker_id, *who(principal))
        fleet = self.gateway.fleet
        return env.json_response(
            200, row(worker, dp_ranks_for(worker, fleet.registry), facts_for(worker, fleet.facts()))
        )

    async def _fleet(self, kind: str, principal) -> Response:
        selectors = [v for k, v in query_pairs(raw_query()) if k == "selector"]
        if len(selectors) > 1:
            return env.text_response(400, "Failed to deserialize query string: duplicate field `selector`")
        value = parse_write(kind, await request.get_data(cache=False))
        selector = selector_param(selectors)
        targets = await self.gateway.writes.set_fleet(kind, value, selector, *who(principal))
        fleet = self.gateway.fleet
        wanted = {w.id for w in targets}
        facts = fleet.facts()
        rows = [
            row(group.representative, group.ranks, facts_for(group.representative, facts))
            for group in collapse(fleet.registry)
            if group.representative.id in wanted
        ]
        return env.json_response(200, workers_response(rows))


# -- /openapi.json: these routes, their models and their errors (smgrl/http/openapi/apidoc.py) ---------------


@model(additional=True, description="Unknown fields are ignored.")
class SetWeightVersion:
    weight_version: str = field("trimmed; 1 to 128 bytes of printable ASCII (0x21-0x7E)")


@model(
    additional=True, description="Unknown fields are ignored. `paused` and `asleep` workers get no rollouts."
)
class SetControlState:
    control: Literal["active", "paused", "asleep"]


def _write_route(kind: str, fleet: bool) -> Route:
    what = "the weight version" if kind == "version" else "the control state"
    bad = (
        InvalidBody,
        InvalidVersion,
        *((SelectorRequired, InvalidSelector, NoWorkersMatch) if fleet else ()),
    )
    responses = {
        "200": Resp(
            "The targets' rows (DP ranks collapsed), already reflecting the write."
            if fleet
            else "The worker's row, already reflecting the write.",
            as_json(RlWorkersResponse if fleet else RlWorkerEntry),
        ),
        "400": rl_error_resp(
            "Bad body (invalid_body), version (invalid_version)"
            + (
                ", selector (selector_required, invalid_selector, no_workers_match); text/plain for a duplicate "
                "`selector`"
                if fleet
                else ""
            )
            + ".",
            *bad,
            text=fleet,
        ),
        "413": PAYLOAD_TOO_LARGE,
        "503": rl_error_resp(
            "The journal cannot record the write (journal_unavailable): nothing changed; retry.",
            JournalUnavailable,
        ),
    }
    if not fleet:
        responses["404"] = rl_error_resp("No such worker (worker_not_found).", WorkerNotFound)
    return Route(
        "POST",
        f"/v1/rl/{kind}" if fleet else f"/v1/rl/workers/{{id}}/{kind}",
        f"post{'Fleet' if fleet else 'Worker'}{kind.capitalize()}",
        "rl",
        f"Set {what} of {'every worker the selector matches' if fleet else 'one worker'} "
        "(SMG M2; gateway-local, no engine call; admin role)",
        responses,
        description="Journaled (`engine.version_set` / `engine.state_set`); the answer, discovery and routing "
        "already reflect it.",
        role="admin",
        params=(SELECTOR,) if fleet else (path_param("id", "the worker id"),),
        body=Body(SetWeightVersion if kind == "version" else SetControlState),
        rl_only=True,
    )


OPENAPI_ROUTES = tuple(_write_route(kind, fleet) for fleet in (False, True) for kind in ("version", "state"))

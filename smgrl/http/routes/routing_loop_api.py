"""The OpenAPI side of the PSRL coordinator routes (``smgrl/http/routes/routing_loop.py``):
their models, parameters and error answers, in the route table ``/openapi.json`` is built from
(``smgrl/http/openapi/apidoc.py``)."""

from __future__ import annotations

from typing import Any, Literal

from smgrl.core.errors import InvalidBody, InvalidQuery, JournalUnavailable, PauseWaitTimeout
from smgrl.http.openapi.apidoc import Body, Param, Resp, Route, as_json, field, model
from smgrl.http.openapi.schemas import PAYLOAD_TOO_LARGE, rl_error_resp
from smgrl.routing import FALSE, TRUE

DRAIN = "drain"  # POST /routing_loop/pause?wait=drain: until no request is at an engine


# -- /openapi.json: these routes, their models and their errors (smgrl/http/openapi/apidoc.py) ---------------


@model(additional=True, inline=True)
class _Status:
    enabled: bool
    paused: bool
    routing_epoch: int
    queue_len: int
    pending_request_num: int = field(optional=True)
    running_request_num: int
    prompt_groups: int = field(optional=True)
    routing: bool = field("dispatch is on (PSRL's fork)", optional=True)
    selecting: bool = field("always false: a selection is one synchronous step", optional=True)
    active_dispatch_handoffs: int = field("always 0, for the same reason", optional=True)
    running_tasks: int = field("requests at an engine (= running_request_num)", optional=True)
    queue_keys: list[int | str] = field(
        "the queue partitions holding requests: their version tags with the routing loop's "
        "multi-priority queue (2147483647: unversioned), else [0] or []",
        optional=True,
    )
    partition_queue_lens: dict = field('requests waiting per partition: {"<key>": n}', optional=True)


@model(inline=True)
class _EngineStats:
    running: int
    waiting: int
    kv_usage: float | None
    prompt_tokens: int
    response_tokens: int
    requests_tracked: int
    timestamp: str | None


@model(inline=True)
class _StatsRow:
    """One row of GET /workers/stats (``_stats`` above)."""

    worker_id: str
    base_worker_id: str
    dp_rank: int
    url: str
    model: str = field(optional=True)
    weight_version: str | None = field(optional=True)
    control: str = field(optional=True)
    held: str | None = field("why it is held out, or null", optional=True)
    in_flight: int
    queued: int = field(
        "requests waiting in the gateway for this instance (a sticky or forced hint, a loopback's return, "
        "a prompt-group pin); requests waiting for any instance count in `waiting` only"
    )
    dispatched: int
    tokens: int = field(
        "generated tokens its answers reported since start (meta_info.completion_tokens, a stream's last "
        "count, OpenAI usage)"
    )
    version_tag: int | str = field("the version as PSRL's fork gives it (a number; -1: none)", optional=True)
    running_requests: int = field("requests at the instance (PSRL's fork's name)", optional=True)
    engine_stats: _EngineStats | None = field(
        "the last snapshot POST /workers/update_stats pushed for the instance, or null", optional=True
    )


@model(inline=True)
class _Stats:
    workers: list[_StatsRow]
    total: int
    waiting: int = field(optional=True)


@model(inline=True)
class _VersionItem:
    worker_id: str
    # null is read as absent, as the route always has (the fork's serde Option fields take it).
    dp_rank: int | None = field(optional=True, minimum=0)
    weight_version: str | int


@model(inline=True)
class _VersionResult:
    status: Literal["updated", "rejected"]
    worker_id: str
    url: str | None
    weight_version: str
    dp_rank: int = field(optional=True)
    reason: str = field(optional=True)


@model(inline=True)
class _VersionResults:
    total: int
    updated: int
    rejected: int
    results: list[_VersionResult]


_JOURNAL_DOWN = rl_error_resp(
    "The journal cannot record the change (journal_unavailable): nothing changed; retry.", JournalUnavailable
)


def _switch(path: str, op_id: str, summary: str, wait: bool = False) -> Route:
    responses = {
        "200": Resp("The routing loop's status after the call.", as_json(_Status)),
        "503": _JOURNAL_DOWN,
    }
    params: tuple[Param, ...] = ()
    if wait:
        responses["400"] = rl_error_resp("A bad `wait` or `timeout` (invalid_query).", InvalidQuery)
        responses["504"] = rl_error_resp(
            "Paused, but requests were still in flight after `timeout` (pause_wait_timeout; "
            "`running_request_num` says how many).",
            PauseWaitTimeout,
            context={"running_request_num": {"type": "integer"}},
        )
        params = (
            Param(
                "wait",
                "query",
                "true (PSRL's fork): answer once in-progress selection drained (at once: selections are "
                "atomic); drain: once no request is at an engine (bounded by `timeout`)",
                {"type": "string", "enum": sorted(TRUE | FALSE | {DRAIN})},
            ),
            Param("timeout", "query", "seconds the wait may last, in (0, 3600]; default 30"),
        )
    return Route(
        "POST",
        path,
        op_id,
        "psrl",
        summary,
        responses,
        description="Journaled (`dataplane.dispatch_set`) when it changes the state.",
        role="admin",
        params=params,
    )


@model(inline=True)
class _HoldItem:
    worker_id: str = field("the engine's registry id or URL", optional=True)
    base_worker_id: str = field("the same, PSRL's other name for it", optional=True)
    dp_rank: Any = field(
        "a DP rank or a list of them (all of a replica's, or none)",
        optional=True,
        schema={
            "oneOf": [{"type": "integer", "minimum": 0}, {"type": "array", "items": {"type": "integer"}}]
        },
    )


@model(inline=True)
class _HoldResult:
    status: Literal["paused", "resumed", "rejected"]
    worker_id: str
    url: str | None
    dp_rank: list[int] = field(optional=True)
    reason: str = field(optional=True)


@model(inline=True)
class _HoldResults:
    action: Literal["pause", "resume"]
    total: int
    updated: int
    rejected: int
    results: list[_HoldResult]


def _hold_route(path: str, op_id: str, summary: str) -> Route:
    return Route(
        "POST",
        path,
        op_id,
        "psrl",
        summary,
        {
            "200": Resp("Per item: paused/resumed or rejected (with the reason).", as_json(_HoldResults)),
            "400": rl_error_resp("Bad body (invalid_body).", InvalidBody),
            "503": _JOURNAL_DOWN,
        },
        description="Journaled as `engine.state_set` (no engine is called). smgrl holds out whole engines: "
        "items naming some DP ranks of a replica but not all are rejected.",
        role="admin",
        body=Body(list[_HoldItem]),
    )


@model(inline=True)
class _Waiting:
    request_id: str | None
    model: str
    version_tag: str
    reason: str
    loopbacks: int
    waiting_secs: float


@model(inline=True)
class _Filter:
    version_tag: str
    requests: list[_Waiting]
    total: int


@model(inline=True)
class _FilterItem:
    request_id: int | str
    prompt_id: int | str
    version_tag: int | str
    is_validate: bool


@model(inline=True, additional=True)
class _StatsPushItem:
    # Each field may be null, read as absent (the fork's serde Option fields take null too).
    worker_id: str | None = field(
        "the engine's registry id (or URL); with dp_rank, of its rank-0 record. An item without one, "
        "or naming no instance, is answered `rejected` in the results (as PSRL's fork: one push, "
        "per-item outcomes, 200)",
        optional=True,
    )
    dp_rank: int | None = field(optional=True)
    timestamp: str | None = field("RFC 3339; an older snapshot than the one kept is ignored", optional=True)
    scheduler_stats: dict | None = field(
        "num_running_reqs, num_waiting_reqs, kv_cache_usage, req_id_to_prompt_token_num, "
        "req_id_to_response_token_num",
        optional=True,
    )


@model(inline=True)
class _StatsPushResult:
    status: Literal["updated", "stale_ignored", "rejected"]
    worker_id: str | None
    url: str
    applied: bool
    dp_rank: int = field(optional=True)
    stale_reason: str = field(optional=True)


@model(inline=True)
class _StatsPushResults:
    total: int
    updated: int
    stale_ignored: int
    rejected: int
    results: list[_StatsPushResult]


# One Route per operation: entries alike in shape stay apart (each is its own route's contract).
OPENAPI_ROUTES = (
    _switch(
        "/routing_loop/pause",
        "postRoutingLoopPause",
        "Pause rollout dispatch: new requests wait, in-flight ones finish",
        wait=True,
    ),
    _switch("/routing_loop/resume", "postRoutingLoopResume", "Resume rollout dispatch"),
    Route(
        "GET",
        "/routing_loop/status",
        "getRoutingLoopStatus",
        "psrl",
        "The routing loop's status",
        {"200": Resp("Status.", as_json(_Status))},
        role="read",
    ),
    Route(
        "GET",
        "/routing_loop/filter",
        "getRoutingLoopFilter",
        "psrl",
        "PSRL's fork: the waiting requests with routing metadata whose version tag is at most `version_tag`",
        {
            "200": Resp(
                "A list; unversioned requests (-1) are below every bound.", as_json(list[_FilterItem])
            ),
            "400": rl_error_resp("A missing or bad `version_tag` (invalid_query).", InvalidQuery),
        },
        role="read",
        params=(Param("version_tag", "query", "a version, or -1", required=True),),
    ),
    Route(
        "GET",
        "/routing_loop/waiting",
        "getRoutingLoopWaiting",
        "psrl",
        "Every request waiting in the gateway whose version tag is at most `version_tag`, and why",
        {
            "200": Resp("Unversioned requests (-1) are below every bound.", as_json(_Filter)),
            "400": rl_error_resp("A missing or bad `version_tag` (invalid_query).", InvalidQuery),
        },
        role="read",
        params=(Param("version_tag", "query", "a version, or -1", required=True),),
    ),
    Route(
        "POST",
        "/workers/update_stats",
        "postWorkersUpdateStats",
        "psrl",
        "PSRL's engine snapshots per instance (kept in memory, never journaled)",
        {
            "200": Resp("Per item: updated, stale_ignored or rejected.", as_json(_StatsPushResults)),
            "400": rl_error_resp("Bad body (invalid_body).", InvalidBody),
            "413": PAYLOAD_TOO_LARGE,
        },
        role="admin",
        body=Body(list[_StatsPushItem]),
    ),
    _hold_route("/workers/pause", "postWorkersPause", "Hold instances out of routing (PSRL)"),
    _hold_route("/workers/resume", "postWorkersResume", "Put held instances back into routing (PSRL)"),
    Route(
        "GET",
        "/workers/stats",
        "getWorkerStats",
        "psrl",
        "Per-instance routing stats: in flight, queued, dispatched, tokens, version, state",
        {"200": Resp("One row per routable instance (worker, DP rank).", as_json(_Stats))},
        role="read",
    ),
    Route(
        "POST",
        "/workers/update_weight_version",
        "postWorkersUpdateWeightVersion",
        "psrl",
        "Per-instance weight-version writes (PSRL); journaled as engine.version_set",
        {
            "200": Resp(
                "Per item: updated or rejected (a replica's DP ranks need one version, all covered).",
                as_json(_VersionResults),
            ),
            "400": rl_error_resp("Bad body (invalid_body).", InvalidBody),
            "413": PAYLOAD_TOO_LARGE,
            "503": _JOURNAL_DOWN,
        },
        role="admin",
        body=Body(list[_VersionItem]),
    ),
)

"""The rollout routes' OpenAPI table (``OPENAPI_ROUTES``, ``ALLOW``): bodies, answers, headers and
errors of ``/generate``, ``/v1/completions``, ``/v1/chat/completions`` and ``/v1/models``, as the
front in ``smgrl/http/fronts/dataplane.py`` serves them."""

from __future__ import annotations

from typing import Any, Literal

from smgrl.core.errors import (
    INVALID_REQUEST_CODES,
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
    VersionFloorUnmet,
)
from smgrl.dataplane import (
    CHAT,
    COMPLETIONS,
    GENERATE,
    PsrlCommitFailed,
    PsrlCommitRejected,
    RequestAbortedByPsManager,
)
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
from smgrl.sessions import (
    EngineAnswerInvalid,
    InvalidTurn,
    SessionClosing,
    SessionGone,
    SessionsDisabled,
    TemplateRefused,
    TokenizerUnavailable,
    TooManySessions,
    TurnAborted,
)

MODELS = "/v1/models"
MODEL_CARD = "/v1/models/{model}"
MODEL_CARD_PREFIX = MODELS + "/"


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
        "or with --enable-rl an invalid x-smg-version-policy (invalid_version_policy, RL crate envelope), "
        "or request_aborted (PSRL's PSManager reports the request aborted: it is not continued).",
        *INVALID_REQUEST_CODES,
        InvalidRoutingMetadataHeader,
        ModelRequired,
        RequestAbortedByPsManager,
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
        "out by state, version policy, floor or circuit breaker, after waiting; `reasons` counts them, `engines` "
        "names each with its reason) or version_floor_unmet (an x-version-tag floor above every engine's version "
        "with no refit or weight sync in progress: at once) or "
        "memory_budget_exceeded (--dataplane-memory-budget is held by other requests' bodies and buffered "
        "answers) or loopback_limit_exceeded (a rollout aborted by weight syncs more than --max-loopbacks "
        "times) or, with a PSManager, psrl_selection_commit_rejected / psrl_selection_commit_failed (PSManager "
        "refused or could not record the chosen instance); retryable.",
        NoAvailableWorkers,
        NoEligibleWorkers,
        VersionFloorUnmet,
        MemoryBudgetExceeded,
        LoopbackLimitExceeded,
        PsrlCommitRejected,
        PsrlCommitFailed,
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
        ("503", (SessionsDisabled, TokenizerUnavailable, TurnAborted)),
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

"""The models and responses several route families share in /openapi.json: the error envelopes,
the shared 401/403/404/405/413 answers, discovery rows and the headers every family stamps.
A model only one family answers with is declared beside that family's routes instead.
"""

from __future__ import annotations

from typing import Any, Literal

from smgrl.core.errors import (
    INVALID_REQUEST_CODES,
    DataPlaneError,
    InvalidRequest,
    InvalidSelector,
    NoControlEndpoint,
    NoWorkersMatch,
    OperationNotFound,
    UpstreamTimeout,
    UpstreamUnreachable,
    WorkerNotFound,
)
from smgrl.http.openapi.apidoc import (
    INT,
    STRING,
    TEXT,
    Resp,
    as_json,
    field,
    model,
)
from smgrl.refit import RefitInProgress, RefitNotFound, RefitUnsupported, RefitWrongState, VersionLeft

# -- error codes ------------------------------------------------------------------------------------


def _descendants(cls: type) -> list[type]:
    out: list[type] = []
    for sub in cls.__subclasses__():
        out += [sub, *_descendants(sub)]
    return out


def dataplane_codes() -> list[str]:
    """Every code of the data plane's OpenAI-style envelope, read from the error classes (the
    sessions' ones included: smgrl/sessions/errors.py), so a new class is documented at once."""
    # Their classes must be defined to be found, whatever this process imported before: the
    # data plane's face loads its PSManager selection errors, the sessions theirs.
    import smgrl.dataplane
    import smgrl.sessions.errors  # noqa: F401

    codes = {cls.code for cls in _descendants(DataPlaneError) if cls is not InvalidRequest}
    return [*INVALID_REQUEST_CODES, *sorted(codes)]


# The codes of WorkerApiError (smgrl/core/errors.py and the /workers handlers).
WORKER_CODES = [
    "BAD_REQUEST",
    "WORKER_NOT_FOUND",
    "WORKER_ALREADY_EXISTS",
    "PAYLOAD_TOO_LARGE",
    "JOURNAL_UNAVAILABLE",
]
# The framework's own errors in the OpenAI envelope (smgrl/http/bodies/envelopes.py, werkzeug's HTTP errors
# such as a body read past BODY_TIMEOUT).
OPENAI_CODES = [
    "unknown_url",
    "method_not_allowed",
    "request_body_too_large",
    "request_timeout",
    "bad_request",
]
# `upstream_error` is no exception: it labels a non-2xx engine answer in a fan-out's `failed[]`.
FAILED_CALL = ["upstream_error", UpstreamUnreachable.code, UpstreamTimeout.code, NoControlEndpoint.code]

# The context fields an RL error carries beside `error` and `message` (smgrl/core/errors.py).
RL_CONTEXT: dict[type, dict[str, Any]] = {
    InvalidSelector: {"offset": {**INT, "minimum": 0}},
    NoWorkersMatch: {"selector": STRING},
    WorkerNotFound: {"id": STRING},
    OperationNotFound: {"id": STRING},
    NoControlEndpoint: {"worker_id": STRING, "url": STRING, "connection_mode": STRING},
    UpstreamUnreachable: {"worker_id": STRING, "url": STRING},
    UpstreamTimeout: {"worker_id": STRING, "url": STRING},
    # smgrl/refit/errors.py
    RefitUnsupported: {"engines": {"type": "array", "items": {"type": "object"}}},
    VersionLeft: {"weight_version": STRING},
    RefitInProgress: {"refit_id": STRING},
    RefitNotFound: {"id": STRING},
    RefitWrongState: {"state": STRING},
}


def rl_error(*errors: Any, context: dict | None = None, description: str = "") -> dict:
    """SMG's RL envelope `{"error": code, "message", ...context}` for these error classes (or
    codes): the enum is exactly their codes."""
    codes = [e if isinstance(e, str) else e.code for e in errors]
    props: dict[str, Any] = {"error": {"type": "string", "enum": codes}, "message": dict(STRING)}
    for e in errors:
        props.update(RL_CONTEXT.get(e, {}) if isinstance(e, type) else {})
    props.update(context or {})
    out: dict[str, Any] = {
        "type": "object",
        "properties": props,
        "required": ["error", "message"],
        "additionalProperties": False,
    }
    if description:
        out["description"] = description
    return out


def rl_error_resp(
    description: str,
    *errors: Any,
    headers: dict | None = None,
    text: bool = False,
    context: dict | None = None,
) -> Resp:
    """A status answered with these RL errors (and text/plain too when ``text``)."""
    content = {**as_json(rl_error(*errors, context=context)), **(TEXT if text else {})}
    return Resp(description, content, headers or {}, errors=errors)


# -- envelopes --------------------------------------------------------------------------------------


@model(inline=True)
class _OpenAIErrorBody:
    type: Literal["invalid_request_error"]
    code: str = field(schema={"type": "string", "enum": OPENAI_CODES})
    message: str
    param: None = field(schema={"nullable": True, "enum": [None]})


@model(
    description="Unknown URL (404), wrong method (405, with `allow`), body over --max-payload-size "
    "(413), framework errors; header `x-smg-error-code` repeats the code.",
    name="OpenAIError",
)
class OpenAIErrorModel:
    error: _OpenAIErrorBody


@model(inline=True)
class _ApiKeyErrorBody:
    message: str
    type: Literal["invalid_request_error"]
    param: None = field(schema={"nullable": True, "enum": [None]})
    code: Literal["invalid_api_key"]


@model(description="401 of the `--api-key` check (no control-plane keys configured).", name="ApiKeyError")
class ApiKeyErrorModel:
    error: _ApiKeyErrorBody


@model(
    description="Errors of the SMG-compatible /workers API: the text is in `error`, the code in `code`.",
    name="WorkerApiError",
)
class WorkerApiErrorModel:
    error: str
    code: str = field(schema={"type": "string", "enum": WORKER_CODES})


@model(inline=True)
class _DataPlaneErrorBody:
    type: Literal["invalid_request_error", "service_unavailable_error"]
    code: str = field(schema={"type": "string", "enum": dataplane_codes()})
    message: str
    param: str | None = field(
        "the field SMG names for a refused body (e.g. `model`, `messages[0].role`), else null"
    )
    retryable: bool = field(
        "present (true) on 429/502/503 answers; `retry-after: 1` is sent too", optional=True, enum=[True]
    )
    reasons: dict[str, int] = field(
        "no_eligible_workers only: how many workers were held out, by reason (`unhealthy`, `paused`, "
        "`asleep`, `unknown`, `mixed`, `unconfirmed`, `stale`, `unversioned`, `circuit_open`)",
        optional=True,
        schema={"type": "object", "additionalProperties": {**INT, "minimum": 1}},
    )
    versions: list[str] = field(
        "no_eligible_workers only: the weight versions the model's workers have, any state "
        "(`unversioned` for none)",
        optional=True,
    )


@model(
    description="The data plane's own errors (OpenAI-style envelope); header `x-smg-error-code` "
    "repeats the code. 400 (422 on /generate for a body of the wrong shape) with SMG 1.13.0's "
    "codes for a refused body, `param` naming the field: invalid_json, invalid_type, invalid_value, "
    "missing_required_parameter, unknown_parameter, integer_below_min_value, empty_array, "
    "prompt_empty, json_parse_error (OpenAI routes without a JSON content type); 400 "
    "invalid_routing_metadata (a malformed PSRL routing header or body field: x-prompt-id, "
    "x-is-sticky, x-base-worker-id + x-target-dp-rank, ...); 400 "
    "model_required (several models served, none named); 404 model_not_found; 429 too_many_requests "
    "(--max-concurrent-requests and the queue are full), queue_timeout; 502 upstream_unreachable; "
    "503 no_available_workers (no routable worker serves the model), no_eligible_workers (every "
    "worker held out by state, version policy or floor; with `reasons`), loopback_limit_exceeded (a "
    "rollout aborted by weight syncs more than --max-loopbacks times); 504 request_timeout; the "
    "agent-session routes' codes (docs/sessions.md).",
    name="DataPlaneError",
)
class DataPlaneErrorModel:
    error: _DataPlaneErrorBody


# -- headers ----------------------------------------------------------------------------------------

REQUEST_ID = {
    "x-request-id": {
        "description": "the caller's x-request-id (128 characters at most), else a generated `req-...` id",
        "required": True,
        "schema": STRING,
    }
}
OP_ID = {
    "x-smgrl-operation-id": {
        "description": "the operation's journal record",
        "required": False,
        "schema": STRING,
    },
    "x-smgrl-journal": {
        "description": "`unavailable`: the engines answered but the final record could not be written",
        "required": False,
        "schema": {"type": "string", "enum": ["unavailable"]},
    },
}
WWW_AUTHENTICATE = {"www-authenticate": {"required": True, "schema": STRING}}
DP_ERROR_CODE = {"x-smg-error-code": {"description": "the error's code", "required": True, "schema": STRING}}
RETRY_AFTER = {"retry-after": {"description": "`1` on retryable errors", "required": False, "schema": STRING}}

# -- shared responses (components/responses) --------------------------------------------------------

UNAUTHORIZED = Resp(
    "No or unknown key. Control-plane keys configured: text/plain (`Missing or invalid Authorization "
    "header` or `Invalid authentication token`), realm `control-plane`. Only --api-key: JSON "
    "(ApiKeyError), realm `data-plane`.",
    {**TEXT, **as_json(ApiKeyErrorModel)},
    WWW_AUTHENTICATE,
    errors=("invalid_api_key",),
    name="Unauthorized",
)
FORBIDDEN = Resp(
    "A `user` key on an admin route: `Admin role required for this control plane operation`.",
    TEXT,
    name="Forbidden",
)
METHOD_NOT_ALLOWED = Resp(
    "Wrong method (OpenAI-style envelope, code method_not_allowed).",
    as_json(OpenAIErrorModel),
    {"allow": {"required": True, "schema": STRING}},
    errors=("method_not_allowed",),
    name="MethodNotAllowed",
)
PAYLOAD_TOO_LARGE = Resp(
    "Body over --max-payload-size: the OpenAI-style envelope (declared length), or text for a chunked "
    "body that outgrew it, or WorkerApiError PAYLOAD_TOO_LARGE on /workers.",
    {**as_json({"anyOf": [OpenAIErrorModel, WorkerApiErrorModel]}), **TEXT},
    errors=("request_body_too_large", "PAYLOAD_TOO_LARGE"),
    name="PayloadTooLarge",
)

DP_UNAUTHORIZED = Resp(
    "No or unknown data-plane key (--api-key or a tenant key), code invalid_api_key; realm `data-plane`.",
    as_json(ApiKeyErrorModel),
    WWW_AUTHENTICATE,
    errors=("invalid_api_key",),
)


@model(additional=True, description="OpenAI's chat completions body, forwarded byte for byte.")
class ChatCompletionRequest:
    model: str = field(optional=True)
    messages: list[dict] = field(optional=True)
    stream: bool = field(optional=True)


# -- discovery rows (GET /v1/rl/workers and the explicit writes' answers) ---------------------------


@model(name="Capabilities")
class CapabilitiesModel:
    source: Literal["static", "advertised"]
    pause_modes: list[str]
    update_from: list[str]
    abort: bool
    flush_cache: bool
    sleep_wake: bool
    reports_weight_version: bool


@model
class RlWorkerEntry:
    """Field order as SMG 1.13.0 serialises it (smgrl/core/view.py RL_WORKER_ENTRY_FIELDS, then
    smgrl's additions: docs/deviations.md)."""

    id: str
    url: str
    base_url: str
    engine: str
    engine_version: str | None
    model_id: str | None
    worker_type: str
    connection_mode: str
    control_url: str | None
    tp_size: int | None
    dp_size: int | None
    pp_size: int | None
    dp_ranks: int = field(minimum=1)
    role: str | None
    health: str
    weight_version: str | None
    labels: dict[str, str]
    capabilities: CapabilitiesModel
    version_source: str | None = field(optional=True)
    control: Literal["active", "paused", "asleep", "unknown"] = field(optional=True)
    version_status: Literal["consistent", "mixed", "unknown"] = field(optional=True)


@model
class RlWorkersResponse:
    protocol_version: Literal[1]
    workers: list[RlWorkerEntry]
    total: int = field(minimum=0)

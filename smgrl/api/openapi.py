"""The OpenAPI 3 document of the gateway, served at ``GET /openapi.json``.

It describes every route the gateway serves (the data-plane routes of ``smgrl/api/dataplane.py``
and the explicit ``/v1/rl`` version/state writes included), every request body and every envelope
it answers with: the data plane's OpenAI-style errors and stamping headers, the RL crate's ``{"error", "message", ...}`` errors, the OpenAI-style 404/405/413 envelope,
the control-plane 401/403 ``text/plain`` refusals and the ``--api-key`` JSON 401, the ``/workers``
``{"error", "code"}`` errors, engine-mirrored statuses and the 207 partial fan-out.

``/openapi.json`` needs no key: it describes routes, never data (no worker, key, label or journal
content is in it), and SMG clients and fuzzers need it before they hold a key. With RL disabled the
``/v1/rl`` routes are left out, as the routes themselves are (D1: a disabled control plane does
not describe itself).

``tests/api/test_openapi.py`` keeps it in sync with the Quart routes, the ``/v1/rl`` dispatcher's
``ALLOW`` table, the data plane's ``ALLOW`` table and the error codes; ``tests/e2e/test_schemathesis.py`` checks live answers against
it.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from smgrl import __version__
from smgrl.api.openapi_refits import refit_paths
from smgrl.core.view import RL_WORKER_ENTRY_FIELDS
from smgrl.dataplane.errors import INVALID_REQUEST_CODES

OPENAPI_VERSION = "3.0.3"

# -- error codes ------------------------------------------------------------------------------------

RL_BAD_REQUEST = [
    "invalid_engine_path",
    "selector_required",
    "invalid_selector",
    "no_workers_match",
    "invalid_body",
    "invalid_version",
    "invalid_query",
]
RL_NOT_FOUND = ["worker_not_found", "operation_not_found"]
FAILED_CALL = ["upstream_error", "upstream_unreachable", "upstream_timeout", "no_control_endpoint"]
OPENAI_CODES = [
    "unknown_url",
    "method_not_allowed",
    "request_body_too_large",
    # werkzeug HTTP errors the framework raises on its own (e.g. a body read past BODY_TIMEOUT)
    "request_timeout",
    "bad_request",
]
DATAPLANE_CODES = [
    *INVALID_REQUEST_CODES,
    "invalid_routing_metadata",
    "model_required",
    "model_not_found",
    "too_many_requests",
    "queue_timeout",
    "upstream_unreachable",
    "no_available_workers",
    "no_eligible_workers",
    "loopback_limit_exceeded",
    "memory_budget_exceeded",
    "request_timeout",
]
WRITE_WORKER_CODES = ["invalid_body", "invalid_version", "worker_not_found", "journal_unavailable"]
WRITE_FLEET_CODES = [
    "invalid_body",
    "invalid_version",
    "selector_required",
    "invalid_selector",
    "no_workers_match",
    "journal_unavailable",
]
WORKER_CODES = [
    "BAD_REQUEST",
    "WORKER_NOT_FOUND",
    "WORKER_ALREADY_EXISTS",
    "PAYLOAD_TOO_LARGE",
    "JOURNAL_UNAVAILABLE",
]

# -- schema helpers -----------------------------------------------------------------------------------


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict) -> dict:
    return {**schema, "nullable": True}


STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}
ANY: dict = {"description": "any JSON value"}
LABELS = {"type": "object", "additionalProperties": STR}


def _obj(props: dict, required: list[str] | None = None, *, additional: Any = False, **extra) -> dict:
    out: dict[str, Any] = {"type": "object", "properties": props}
    out["required"] = list(props) if required is None else required
    if not out["required"]:
        del out["required"]
    out["additionalProperties"] = additional
    out.update(extra)
    return out


def _rl_error(codes: list[str], context: dict | None = None, description: str = "") -> dict:
    props = {"error": {"type": "string", "enum": codes}, "message": STR, **(context or {})}
    return _obj(props, ["error", "message"], description=description)


# One target's recorded outcome in an Operation (null until it arrives). Inline, not a $ref: OpenAPI 3.0
# ignores `nullable` next to a $ref.
OUTCOME = _obj(
    {
        "status": _nullable(INT),
        "latency_ms": _nullable(INT),
        "error": _nullable(STR),
        "message": _nullable(STR),
        "excerpt": _nullable(STR),
        "body_truncated": _nullable(BOOL),
    },
    [],
    additional=True,
)

SCHEMAS: dict[str, dict] = {
    # ---- RL crate envelopes
    "RlBadRequest": _rl_error(
        RL_BAD_REQUEST,
        {"offset": {**INT, "minimum": 0}, "selector": STR},
        "400 from the RL control plane: `offset` with invalid_selector, `selector` with no_workers_match.",
    ),
    "RlNotFound": _rl_error(RL_NOT_FOUND, {"id": STR}),
    "NoControlEndpoint": _rl_error(
        ["no_control_endpoint"],
        {"worker_id": STR, "url": STR, "connection_mode": STR},
        "422: a gRPC/ZMQ worker without `rl.control_url`.",
    ),
    "UpstreamUnreachable": _rl_error(["upstream_unreachable"], {"worker_id": STR, "url": STR}),
    "UpstreamTimeout": _rl_error(["upstream_timeout"], {"worker_id": STR, "url": STR}),
    "JournalUnavailable": _rl_error(
        ["journal_unavailable"], None, "503: the journal cannot record the operation; no engine was called."
    ),
    "InternalError": _rl_error(["internal_error"], None, "500: a gateway bug (the log has the traceback)."),
    "RlCallOutcome": _obj(
        {
            "worker_id": STR,
            "url": STR,
            "status": {**INT, "minimum": 100, "maximum": 999},
            "latency_ms": {**INT, "minimum": 0},
            "body": {
                "description": "the engine's JSON when its content-type contains `json` and the bytes "
                "parse, else its text (lossy UTF-8); at most 1 MiB"
            },
            "body_truncated": {"type": "boolean", "enum": [True], "description": "present only when true"},
        },
        ["worker_id", "url", "status", "latency_ms", "body"],
        description="One engine answer (any status: the per-worker route mirrors it).",
    ),
    "RlFailedCall": _obj(
        {
            "worker_id": STR,
            "url": STR,
            "error": {"type": "string", "enum": FAILED_CALL},
            "message": STR,
            "status": {**INT, "description": "the engine's status, with upstream_error only"},
            "connection_mode": {**STR, "description": "with no_control_endpoint only"},
        },
        ["worker_id", "url", "error", "message"],
    ),
    "RlFanoutResponse": _obj(
        {
            "results": {"type": "object", "additionalProperties": _ref("RlCallOutcome")},
            "failed": {"type": "array", "items": _ref("RlFailedCall")},
            "total": {**INT, "minimum": 1},
            "succeeded": {**INT, "minimum": 0},
        },
        description="200 when `failed` is empty, else 207. `results` holds every engine that answered "
        "(any status); `failed` every non-2xx answer (upstream_error) and every transport failure.",
    ),
    "Capabilities": _obj(
        {
            "source": {"type": "string", "enum": ["static", "advertised"]},
            "pause_modes": {"type": "array", "items": STR},
            "update_from": {"type": "array", "items": STR},
            "abort": BOOL,
            "flush_cache": BOOL,
            "sleep_wake": BOOL,
            "reports_weight_version": BOOL,
        }
    ),
    "RlWorkerEntry": _obj(
        {
            "id": STR,
            "url": STR,
            "base_url": STR,
            "engine": STR,
            "engine_version": _nullable(STR),
            "model_id": _nullable(STR),
            "worker_type": STR,
            "connection_mode": STR,
            "control_url": _nullable(STR),
            "tp_size": _nullable(INT),
            "dp_size": _nullable(INT),
            "pp_size": _nullable(INT),
            "dp_ranks": {**INT, "minimum": 1},
            "role": _nullable(STR),
            "health": STR,
            "weight_version": _nullable(STR),
            "labels": LABELS,
            "capabilities": _ref("Capabilities"),
            # smgrl additions (deviations.md): present when the journal's engine projection is known
            "version_source": _nullable(STR),
            "control": {"type": "string", "enum": ["active", "paused", "asleep", "unknown"]},
            "version_status": {"type": "string", "enum": ["consistent", "mixed", "unknown"]},
        },
        list(RL_WORKER_ENTRY_FIELDS),
    ),
    "RlWorkersResponse": _obj(
        {
            "protocol_version": {"type": "integer", "enum": [1]},
            "workers": {"type": "array", "items": _ref("RlWorkerEntry")},
            "total": {**INT, "minimum": 0},
        }
    ),
    "OperationTarget": _obj(
        {"worker_id": STR, "url": STR, "control_url": _nullable(STR), "outcome": _nullable(OUTCOME)},
        ["worker_id", "url", "outcome"],
        additional=True,
    ),
    "Operation": _obj(
        {
            "operation_id": STR,
            "kind": {"type": "string", "enum": ["call", "fanout"]},
            "method": STR,
            "path": STR,
            "query": _nullable(STR),
            "selector": _nullable(STR),
            "status": {"type": "string", "enum": ["open", "finished"]},
            "result": _nullable(
                {
                    "type": "string",
                    "enum": ["ok", "partial", "no_match", "failed", "cancelled", "interrupted"],
                }
            ),
            "http_status": _nullable(INT),
            "total": {**INT, "minimum": 0},
            "succeeded": {**INT, "minimum": 0},
            "latency_ms": _nullable(INT),
            "targets": {"type": "array", "items": _ref("OperationTarget")},
            "missing_targets": {"type": "array", "items": STR},
            "started_seq": INT,
        },
        additional=True,
        description="The journal's record of one per-worker call or fan-out.",
    ),
    "JournalEvent": _obj(
        {
            "seq": {**INT, "minimum": 1},
            "ts": {"type": "number"},
            "stream": STR,
            "type": STR,
            "schema": INT,
            "payload": {"type": "object", "additionalProperties": True},
        }
    ),
    "JournalPage": _obj(
        {
            "events": {"type": "array", "items": _ref("JournalEvent")},
            "next_after": {**INT, "minimum": 0},
            "last_seq": {**INT, "minimum": 0},
            "more": BOOL,
        }
    ),
    # ---- explicit writes (Appendix A.1)
    "SetWeightVersion": _obj(
        {"weight_version": {**STR, "description": "trimmed; 1 to 128 bytes of printable ASCII (0x21-0x7E)"}},
        description="Unknown fields are ignored.",
        additional=True,
    ),
    "SetControlState": _obj(
        {"control": {"type": "string", "enum": ["active", "paused", "asleep"]}},
        description="Unknown fields are ignored. `paused` and `asleep` workers get no rollouts.",
        additional=True,
    ),
    # ---- data plane
    "DataPlaneError": _obj(
        {
            "error": _obj(
                {
                    "type": {
                        "type": "string",
                        "enum": ["invalid_request_error", "service_unavailable_error"],
                    },
                    "code": {"type": "string", "enum": DATAPLANE_CODES},
                    "message": STR,
                    "param": {
                        **_nullable(STR),
                        "description": "the field SMG names for a refused body (e.g. `model`, "
                        "`messages[0].role`), else null",
                    },
                    "retryable": {
                        "type": "boolean",
                        "enum": [True],
                        "description": "present (true) on 429/502/503 answers; `retry-after: 1` is sent too",
                    },
                    "reasons": {
                        "type": "object",
                        "additionalProperties": {**INT, "minimum": 1},
                        "description": "no_eligible_workers only: how many workers were held out, by reason "
                        "(`unhealthy`, `paused`, `asleep`, `unknown`, `mixed`, `unconfirmed`, `stale`, "
                        "`unversioned`, `circuit_open`)",
                    },
                    "versions": {
                        "type": "array",
                        "items": STR,
                        "description": "no_eligible_workers only: the weight versions the model's "
                        "workers have, any state (`unversioned` for none)",
                    },
                },
                ["type", "code", "message", "param"],
            )
        },
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
        "rollout aborted by weight syncs more than --max-loopbacks times); 504 request_timeout.",
    ),
    "InvalidVersionPolicy": _rl_error(
        ["invalid_version_policy"],
        None,
        "400: an invalid `x-smg-version-policy` header (the RL crate's envelope, as SMG's middleware answers).",
    ),
    "GenerateRequest": _obj(
        {
            "model": STR,
            "text": {"description": "a prompt or a list of prompts"},
            "input_ids": {"description": "token ids, or a list of them"},
            "sampling_params": {"type": "object"},
            "stream": BOOL,
        },
        [],
        additional=True,
        description="SGLang's /generate body, forwarded byte for byte (with --dp-aware, "
        "`data_parallel_rank` is added). Must be a JSON object; `model`, when present, a string.",
    ),
    "CompletionRequest": _obj(
        {"model": STR, "prompt": {"description": "text, token ids, or a list of them"}, "stream": BOOL},
        [],
        additional=True,
        description="OpenAI's completions body, forwarded byte for byte.",
    ),
    "ChatCompletionRequest": _obj(
        {"model": STR, "messages": {"type": "array", "items": {"type": "object"}}, "stream": BOOL},
        [],
        additional=True,
        description="OpenAI's chat completions body, forwarded byte for byte.",
    ),
    "ModelList": _obj(
        {
            "object": {"type": "string", "enum": ["list"]},
            "data": {
                "type": "array",
                "items": _obj(
                    {
                        "id": STR,
                        "object": {"type": "string", "enum": ["model"]},
                        "created": INT,
                        "owned_by": STR,
                    }
                ),
            },
        }
    ),
    # ---- gateway envelopes
    "OpenAIError": _obj(
        {
            "error": _obj(
                {
                    "type": {"type": "string", "enum": ["invalid_request_error"]},
                    "code": {"type": "string", "enum": OPENAI_CODES},
                    "message": STR,
                    "param": {"nullable": True, "enum": [None]},
                }
            )
        },
        description="Unknown URL (404), wrong method (405, with `allow`), body over --max-payload-size "
        "(413), framework errors; header `x-smg-error-code` repeats the code.",
    ),
    "ApiKeyError": _obj(
        {
            "error": _obj(
                {
                    "message": STR,
                    "type": {"type": "string", "enum": ["invalid_request_error"]},
                    "param": {"nullable": True, "enum": [None]},
                    "code": {"type": "string", "enum": ["invalid_api_key"]},
                }
            )
        },
        description="401 of the `--api-key` check (no control-plane keys configured).",
    ),
    "WorkerApiError": _obj(
        {"error": STR, "code": {"type": "string", "enum": WORKER_CODES}},
        description="Errors of the SMG-compatible /workers API: the text is in `error`, the code in `code`.",
    ),
    # ---- /workers
    "WorkerSpec": _obj(
        {
            "url": {**STR, "description": "http://, https://, grpc://, grpcs:// or ipc:// engine URL"},
            "api_key": {**_nullable(STR), "description": "sent to the engine as bearer; never shown again"},
            "worker_type": {"type": "string", "enum": ["regular", "prefill", "decode"]},
            "runtime": {
                "type": "string",
                "enum": [
                    "unspecified",
                    "sglang",
                    "vllm",
                    "trtllm",
                    "mlx",
                    "tokenspeed",
                    "generic",
                    "external",
                ],
            },
            "connection_mode": {"type": "string", "enum": ["http", "grpc", "zmq"]},
            "labels": LABELS,
            "bootstrap_port": _nullable({**INT, "minimum": 0, "maximum": 65535}),
            "priority": {**INT, "minimum": 0, "maximum": 4294967295},
            "cost": {"type": "number"},
            "dp_size": _nullable({**INT, "minimum": 0}),
            "max_connection_attempts": {**INT, "minimum": 0, "maximum": 4294967295},
        },
        ["url"],
        additional=True,
        description="SMG's WorkerSpec; unknown fields are ignored.",
    ),
    "WorkerUpdate": _obj(
        {
            "labels": _nullable(LABELS),
            "priority": _nullable({**INT, "minimum": 0, "maximum": 4294967295}),
            "cost": _nullable({"type": "number"}),
        },
        [],
        additional=True,
    ),
    "Worker": _obj(
        {
            "id": STR,
            "model_id": STR,
            "url": STR,
            "models": {"type": "array", "items": {"type": "object"}},
            "worker_type": STR,
            "connection_mode": STR,
            "runtime_type": _nullable(STR),
            "labels": LABELS,
            "priority": INT,
            "cost": {"type": "number"},
            "max_connection_attempts": INT,
            "dp_base_url": STR,
            "dp_rank": INT,
            "dp_size": _nullable(INT),
            "is_healthy": BOOL,
            "status": STR,
            "load": INT,
            "http2": BOOL,
            "bootstrap_port": INT,
        },
        ["id", "url", "worker_type", "connection_mode", "labels", "is_healthy", "status"],
        additional=True,
        description="A registry entry as SMG's /workers shows it.",
    ),
    "WorkerList": _obj(
        {
            "workers": {"type": "array", "items": _ref("Worker")},
            "total": {**INT, "minimum": 0},
            "stats": _obj({"prefill_count": INT, "decode_count": INT, "regular_count": INT}),
        }
    ),
    "WorkerAccepted": _obj(
        {
            "status": {"type": "string", "enum": ["accepted"]},
            "worker_id": STR,
            "url": STR,
            "location": STR,
            "message": STR,
        },
        ["status", "worker_id", "message"],
    ),
    "Readiness": _obj(
        {
            "status": {"type": "string", "enum": ["ready", "not_ready"]},
            "healthy_workers": {**INT, "minimum": 0},
            "total_workers": {**INT, "minimum": 0},
        }
    ),
}

# -- headers and responses ------------------------------------------------------------------------------

REQUEST_ID = {
    "x-request-id": {
        "description": "the caller's x-request-id (128 characters at most), else a generated `req-...` id",
        "required": True,
        "schema": STR,
    }
}
GATEWAY_ID = {
    "x-smgrl-gateway-id": {
        "description": "this gateway's id (its journal's id): discovery refuses a worker URL whose "
        "`/health` answers with its own id (the URL leads back to this gateway)",
        "required": True,
        "schema": STR,
    }
}
OP_ID = {
    "x-smgrl-operation-id": {
        "description": "the operation's journal record",
        "required": False,
        "schema": STR,
    },
    "x-smgrl-journal": {
        "description": "`unavailable`: the engines answered but the final record could not be written",
        "required": False,
        "schema": {"type": "string", "enum": ["unavailable"]},
    },
}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _resp(description: str, content: dict | None = None, headers: dict | None = None) -> dict:
    out: dict[str, Any] = {"description": description, "headers": {**REQUEST_ID, **(headers or {})}}
    if content:
        out["content"] = content
    return out


TEXT = {"text/plain; charset=utf-8": {"schema": STR}}

RESPONSES: dict[str, dict] = {
    "Unauthorized": _resp(
        "No or unknown key. Control-plane keys configured: text/plain (`Missing or invalid Authorization "
        "header` or `Invalid authentication token`), realm `control-plane`. Only --api-key: JSON "
        "(ApiKeyError), realm `data-plane`.",
        {**TEXT, **_json(_ref("ApiKeyError"))},
        {"www-authenticate": {"required": True, "schema": STR}},
    ),
    "Forbidden": _resp(
        "A `user` key on an admin route: `Admin role required for this control plane operation`.", TEXT
    ),
    "UnknownUrl": _resp(
        "No such route (OpenAI-style envelope, code unknown_url).", _json(_ref("OpenAIError"))
    ),
    "MethodNotAllowed": _resp(
        "Wrong method (OpenAI-style envelope, code method_not_allowed).",
        _json(_ref("OpenAIError")),
        {"allow": {"required": True, "schema": STR}},
    ),
    "PayloadTooLarge": _resp(
        "Body over --max-payload-size: the OpenAI-style envelope (declared length), or text for a chunked "
        "body that outgrew it, or WorkerApiError PAYLOAD_TOO_LARGE on /workers.",
        {**_json({"anyOf": [_ref("OpenAIError"), _ref("WorkerApiError")]}), **TEXT},
    ),
}


# A bearer key, or none when the gateway runs without keys (development mode): `{}` makes it optional.
SECURED = [{"bearer": []}, {}]


def _r(name: str) -> dict:
    return {"$ref": f"#/components/responses/{name}"}


def _auth_responses(write: bool) -> dict:
    out = {"401": _r("Unauthorized")}
    if write:
        out["403"] = _r("Forbidden")
    return out


PATH_PARAM_PATH = {
    "name": "path",
    "in": "path",
    "required": True,
    "description": "The engine route: 1 to 4 segments of [A-Za-z0-9._-] (neither `.` nor `..`), "
    "percent-decoded once (send `/` between segments raw; `%2F` is decoded to `/` too).",
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$"},
    "example": "flush_cache",
}
SELECTOR = {
    "name": "selector",
    "in": "query",
    "required": True,
    "description": "Label selector: `k=v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, comma-joined (AND). "
    "Other query parameters are passed through to the engines.",
    "schema": STR,
    "example": "engine=sglang",
}


def _id_param(name: str, description: str) -> dict:
    return {"name": name, "in": "path", "required": True, "description": description, "schema": STR}


def _engine_responses(fanout: bool) -> dict:
    """Engine routes. Per-worker: the gateway's status mirrors the engine's, so every status may carry
    an RlCallOutcome; the gateway's own errors share some statuses with it."""
    outcome = _ref("RlCallOutcome")

    def either(*errors: dict) -> dict:
        return {"anyOf": [*errors]} if fanout else {"anyOf": [outcome, *errors]}

    op = "" if fanout else " (or the engine's own status, mirrored, with an RlCallOutcome)"
    out: dict[str, dict] = {}
    if fanout:
        out["200"] = _resp("Every target answered 2xx.", _json(_ref("RlFanoutResponse")), OP_ID)
        out["207"] = _resp(
            "At least one target failed (non-2xx, unreachable, timeout).",
            _json(_ref("RlFanoutResponse")),
            OP_ID,
        )
    out["400"] = _resp(
        "Invalid path, selector or query" + op + "; text/plain for a duplicate `selector` or invalid "
        "UTF-8 in a path parameter.",
        {**_json(either(_ref("RlBadRequest"))), **TEXT},
        OP_ID,
    )
    out.update(_auth_responses(write=True))
    out["404"] = _resp(
        "Unknown worker, or no such route" + op + ".",
        _json(either(_ref("RlNotFound"), _ref("OpenAIError"))),
        OP_ID,
    )
    out["413"] = _r("PayloadTooLarge")
    if not fanout:
        out["422"] = _resp("No control endpoint" + op + ".", _json(either(_ref("NoControlEndpoint"))), OP_ID)
        out["500"] = _resp("Gateway bug" + op + ".", _json(either(_ref("InternalError"))), OP_ID)
        out["502"] = _resp("Engine unreachable" + op + ".", _json(either(_ref("UpstreamUnreachable"))), OP_ID)
    else:
        out["500"] = _resp("Gateway bug.", _json(_ref("InternalError")))
    out["503"] = _resp(
        "The journal cannot record the operation; no engine was called" + op + ".",
        _json(either(_ref("JournalUnavailable"))),
        OP_ID,
    )
    if not fanout:
        out["504"] = _resp(
            "No answer within --rl-control-timeout-secs" + op + ".",
            _json(either(_ref("UpstreamTimeout"))),
            OP_ID,
        )
        out["default"] = _resp(
            "Any other engine status, mirrored (2xx, 3xx: redirects are not followed, 4xx, 5xx).",
            _json(outcome),
            OP_ID,
        )
    return out


def _head(get: dict) -> dict:
    """HEAD: the GET's status and headers, no body."""
    op = copy.deepcopy(get)
    op["operationId"] = get["operationId"].replace("get", "head", 1)
    op["summary"] = "HEAD of " + get["summary"]
    op.pop("requestBody", None)
    for resp in op["responses"].values():
        if "content" in resp:
            resp.pop("content")
    return op


def _engine_ops(fanout: bool) -> dict:
    params = (
        [PATH_PARAM_PATH, SELECTOR]
        if fanout
        else [_id_param("id", "the worker id (GET /v1/rl/workers)"), PATH_PARAM_PATH]
    )
    what = "every worker the selector matches" if fanout else "one worker"
    summary = f"Send an engine-native control call to {what} (admin role, D3)"
    get = {
        "operationId": "get" + ("Fanout" if fanout else "Proxy"),
        "summary": summary,
        "description": "The engine gets the method, path, passthrough query, body and content-type, and "
        "x-request-id/traceparent/tracestate; the worker's own API key as bearer. Redirects are not "
        "followed. Recorded in the journal (x-smgrl-operation-id).",
        "tags": ["rl"],
        "parameters": params,
        "security": SECURED,
        "responses": _engine_responses(fanout),
    }
    post = {
        **copy.deepcopy(get),
        "operationId": "post" + ("Fanout" if fanout else "Proxy"),
        "requestBody": {
            "required": False,
            "description": "Forwarded verbatim (content-type defaults to application/json when a body is sent).",
            "content": {"application/json": {"schema": ANY}},
        },
    }
    return {"get": get, "head": _head(get), "post": post}


def _read_op(op_id: str, summary: str, responses: dict, params: list | None = None, tags=("rl",)) -> dict:
    out = {
        "operationId": op_id,
        "summary": summary,
        "tags": list(tags),
        "security": SECURED,
        "responses": {**responses, **_auth_responses(write=False)},
    }
    if params:
        out["parameters"] = params
    return out


def _get_and_head(get: dict) -> dict:
    return {"get": get, "head": _head(get)}


def _workers_write(op_id: str, summary: str, body: str | None, responses: dict, params=None) -> dict:
    out = {
        "operationId": op_id,
        "summary": summary,
        "tags": ["workers"],
        "security": SECURED,
        "responses": {
            **responses,
            **_auth_responses(write=True),
            "413": _r("PayloadTooLarge"),
            "503": _resp(
                "The journal cannot record the change (JOURNAL_UNAVAILABLE): nothing changed; retry.",
                WORKER_ERR,
            ),
        },
    }
    if params:
        out["parameters"] = params
    if body:
        out["requestBody"] = {"required": True, "content": _json(_ref(body))}
    return out


WORKER_ERR = _json(_ref("WorkerApiError"))
WORKER_ID = _id_param("worker_id", "the registry id (a UUID)")


# -- the data plane (smgrl/api/dataplane.py) --------------------------------------------------------

DP_ERROR_CODE = {"x-smg-error-code": {"description": "the error's code", "required": True, "schema": STR}}
RETRY_AFTER = {"retry-after": {"description": "`1` on retryable errors", "required": False, "schema": STR}}
STAMP = {
    "x-smg-weight-version": {
        "description": "the weights that produced the answer: the version the engine reported (a stream's "
        "first event for /generate; SGLang's `metadata.weight_version`), else the gateway's table, else "
        "`default`. OpenAI answers carry it in `system_fingerprint` too.",
        "required": True,
        "schema": STR,
    },
    "x-version-tag": {
        "description": "PSRL: the serving engine's version, `-1` when it has none; for a request with "
        "routing metadata (x-prompt-id or an instance hint) the version pinned at its first selection",
        "required": True,
        "schema": STR,
    },
    "x-base-worker-id": {
        "description": "PSRL: the serving instance's engine (registry id of its rank-0 record)",
        "required": True,
        "schema": STR,
    },
    "x-target-dp-rank": {
        "description": "PSRL: the serving instance's DP rank (0 without DP)",
        "required": True,
        "schema": STR,
    },
    "x-smg-mixed-version": {
        "description": "`true` on a buffered /generate whose weights changed mid-request (absent otherwise)",
        "required": False,
        "schema": {"type": "string", "enum": ["true"]},
    },
    "x-smg-routed-worker-id": {
        "description": "the serving worker's URL (`@rank` for a DP rank), as SMG names it",
        "required": True,
        "schema": STR,
    },
    "x-smgrl-worker-id": {"description": "the serving worker's registry id", "required": True, "schema": STR},
}
DP_SECURED = [{"dataPlaneBearer": []}, {}]


# An engine's own non-2xx answer is relayed untouched, with the same statuses as the gateway's errors.
ENGINE_ANSWER = {
    "type": "object",
    "description": "the engine's own error answer, relayed untouched (stamped like a 200, without "
    "x-smg-error-code)",
}
RELAYED_NOTE = " An engine answering this status itself is relayed untouched (EngineAnswer)."
DP_ERROR_CODE_OPTIONAL = {
    "x-smg-error-code": {
        "description": "the gateway error's code (absent on a relayed engine answer)",
        "required": False,
        "schema": STR,
    }
}


def _dp_error(description: str, *schemas: dict) -> dict:
    errors = list(schemas) or [_ref("DataPlaneError")]
    return _resp(
        description + RELAYED_NOTE,
        _json({"anyOf": [*errors, ENGINE_ANSWER]}),
        {**DP_ERROR_CODE_OPTIONAL, **RETRY_AFTER},
    )


def _dp_unauthorized() -> dict:
    return _resp(
        "No or unknown data-plane key (--api-key or a tenant key), code invalid_api_key; realm `data-plane`.",
        _json(_ref("ApiKeyError")),
        {"www-authenticate": {"required": True, "schema": STR}},
    )


def _rollout_op(op_id: str, summary: str, body: str, rl: bool) -> dict:
    params = [
        {
            "name": "x-smg-routing-key",
            "in": "header",
            "required": False,
            "schema": STR,
            "description": "sticky routing: requests with the same key go to the same worker",
        },
        {
            "name": "x-version-tag",
            "in": "header",
            "required": False,
            "schema": STR,
            "description": "PSRL version floor: only engines at this version or newer (`-1`: no floor)",
        },
        *(
            {"name": name, "in": "header", "required": False, "schema": STR, "description": text}
            for name, text in (
                ("x-prompt-id", "PSRL prompt group: its requests share an instance (staged selection)"),
                ("x-is-validate", "PSRL: a validation request (bool-like; handed to the admission hook)"),
                ("x-is-sticky", "PSRL: honour the instance hint (bool-like)"),
                (
                    "x-base-worker-id",
                    "PSRL instance hint: the engine (registry id or URL); with x-target-dp-rank",
                ),
                ("x-target-dp-rank", "PSRL instance hint: the DP rank; with x-base-worker-id"),
                ("x-force-pin-once", "PSRL: honour the hint for the first selection only (bool-like)"),
            )
        ),
    ]
    if rl:
        params.insert(
            0,
            {
                "name": "x-smg-version-policy",
                "in": "header",
                "required": False,
                "schema": STR,
                "description": "`any` | `latest-only` | `min-version:<v>` | `max-staleness:<k>` "
                "(default --rl-version-policy)",
            },
        )
    bad_request = [_ref("DataPlaneError")]
    if rl:
        bad_request.append(_ref("InvalidVersionPolicy"))
    responses = {
        "200": _resp(
            "The engine's answer, stamped. `stream: true`: a text/event-stream relayed event by event "
            "(OpenAI events carry `system_fingerprint`; an error after the head is an SSE error event, "
            "with no `[DONE]`).",
            {"application/json": {"schema": ANY}, "text/event-stream": {"schema": STR}},
            STAMP,
        ),
        "400": _dp_error(
            "SMG's codes for a refused body (invalid_json, invalid_type, invalid_value, "
            "missing_required_parameter, unknown_parameter, integer_below_min_value, empty_array, "
            "prompt_empty, json_parse_error), invalid_routing_metadata (a malformed PSRL routing "
            "header or field), model_required (/generate only)"
            + (
                ", or an invalid x-smg-version-policy (invalid_version_policy, RL crate envelope)"
                if rl
                else ""
            )
            + ".",
            *bad_request,
        ),
        "401": _dp_unauthorized(),
        "404": _dp_error("model_not_found: no worker serves the named model."),
        "422": _dp_error(
            "/generate only: a body of the wrong shape (not an object, `model` not a string): invalid_type."
        ),
        "405": _r("MethodNotAllowed"),
        "413": _resp(
            "Body over --max-payload-size (request_body_too_large).",
            _json(_ref("OpenAIError")),
            DP_ERROR_CODE,
        ),
        "429": _dp_error(
            "too_many_requests (--max-concurrent-requests and its queue are full) or "
            "queue_timeout (waited --queue-timeout-secs for a slot); retryable."
        ),
        "502": _dp_error("upstream_unreachable: retries exhausted (connect errors, engine 5xx); retryable."),
        "503": _dp_error(
            "no_available_workers (no routable worker serves the model) or no_eligible_workers "
            "(every worker held out by state, version policy, floor or circuit breaker, after "
            "waiting; `reasons` counts them) or memory_budget_exceeded (--dataplane-memory-budget is "
            "held by other requests' bodies and buffered answers); retryable."
        ),
        "504": _dp_error("request_timeout: --request-timeout-secs passed."),
        "500": _dp_error("internal_error: a gateway bug (never bad input); the log has the traceback."),
        "default": _resp(
            "Any other engine status, relayed as the engine sent it (body untouched).",
            {"application/json": {"schema": ANY}},
            STAMP,
        ),
    }
    return {
        "operationId": op_id,
        "summary": summary,
        "description": "Served by the data plane (raw ASGI, same port). Routed to a worker serving `model` "
        "(or the only model served); paused/asleep workers and those outside the version policy get no "
        "requests: the request waits for an eligible one.",
        "tags": ["dataplane"],
        "security": DP_SECURED,
        "parameters": params,
        "requestBody": {"required": True, "content": _json(_ref(body))},
        "responses": responses,
    }


def _dataplane_paths(rl: bool) -> dict:
    models = {
        "operationId": "getModels",
        "summary": "The models the fleet serves (OpenAI list)",
        "tags": ["dataplane"],
        "security": DP_SECURED,
        "responses": {
            "200": _resp("The models.", _json(_ref("ModelList"))),
            "401": _dp_unauthorized(),
            "405": _r("MethodNotAllowed"),
        },
    }
    return {
        "/generate": {"post": _rollout_op("postGenerate", "SGLang native generation", "GenerateRequest", rl)},
        "/v1/completions": {
            "post": _rollout_op("postCompletions", "OpenAI completions", "CompletionRequest", rl)
        },
        "/v1/chat/completions": {
            "post": _rollout_op("postChatCompletions", "OpenAI chat completions", "ChatCompletionRequest", rl)
        },
        "/v1/models": _get_and_head(models),
    }


# -- explicit writes (smgrl/api/rl_writes.py) --------------------------------------------------------


def _write_op(kind: str, fleet: bool) -> dict:
    body = "SetWeightVersion" if kind == "version" else "SetControlState"
    what = "the weight version" if kind == "version" else "the control state"
    codes = WRITE_FLEET_CODES if fleet else WRITE_WORKER_CODES
    bad = [c for c in codes if c in RL_BAD_REQUEST]
    responses: dict[str, dict] = {
        "200": _resp(
            "The targets' rows (DP ranks collapsed), already reflecting the write."
            if fleet
            else "The worker's row, already reflecting the write.",
            _json(_ref("RlWorkersResponse" if fleet else "RlWorkerEntry")),
        ),
        "400": _resp(
            "Bad body (invalid_body), version (invalid_version)"
            + (
                ", selector (selector_required, invalid_selector, no_workers_match); text/plain for a "
                "duplicate `selector`"
                if fleet
                else ""
            )
            + ".",
            {
                **_json(_rl_error(bad, {"offset": {**INT, "minimum": 0}, "selector": STR})),
                **(TEXT if fleet else {}),
            },
        ),
        **_auth_responses(write=True),
        "413": _r("PayloadTooLarge"),
        "503": _resp(
            "The journal cannot record the write (journal_unavailable): nothing changed; retry.",
            _json(_ref("JournalUnavailable")),
        ),
    }
    if not fleet:
        responses["404"] = _resp(
            "No such worker (worker_not_found).", _json(_rl_error(["worker_not_found"], {"id": STR}))
        )
    target = "every worker the selector matches" if fleet else "one worker"
    out = {
        "operationId": f"post{'Fleet' if fleet else 'Worker'}{kind.capitalize()}",
        "summary": f"Set {what} of {target} (SMG M2; gateway-local, no engine call; admin role)",
        "description": "Journaled (`engine.version_set` / `engine.state_set`); the answer, discovery and routing "
        "already reflect it.",
        "tags": ["rl"],
        "security": SECURED,
        "parameters": [SELECTOR] if fleet else [_id_param("id", "the worker id")],
        "requestBody": {"required": True, "content": _json(_ref(body))},
        "responses": responses,
    }
    return out


def _write_paths() -> dict:
    return {
        "/v1/rl/workers/{id}/version": {"post": _write_op("version", fleet=False)},
        "/v1/rl/workers/{id}/state": {"post": _write_op("state", fleet=False)},
        "/v1/rl/version": {"post": _write_op("version", fleet=True)},
        "/v1/rl/state": {"post": _write_op("state", fleet=True)},
    }


def _routing_loop_paths() -> dict:
    """PSRL's coordinator controls (smgrl/api/routing_loop.py)."""
    status = _obj(
        {
            "enabled": BOOL,
            "paused": BOOL,
            "routing_epoch": INT,
            "queue_len": INT,
            "pending_request_num": INT,
            "running_request_num": INT,
            "prompt_groups": INT,
        },
        ["enabled", "paused", "routing_epoch", "queue_len", "running_request_num"],
        additional=True,
    )
    journal_down = _resp(
        "The journal cannot record the change (journal_unavailable): nothing changed; retry.",
        _json(_ref("JournalUnavailable")),
    )

    def switch(op_id: str, summary: str) -> dict:
        return {
            "post": {
                "operationId": op_id,
                "summary": summary,
                "description": "Journaled (`dataplane.dispatch_set`) when it changes the state.",
                "tags": ["psrl"],
                "security": SECURED,
                "parameters": [
                    {
                        "name": "wait",
                        "in": "query",
                        "required": False,
                        "schema": STR,
                        "description": "accepted for PSRL clients; selections are atomic, nothing to wait for",
                    }
                ],
                "responses": {
                    "200": _resp("The routing loop's status after the call.", _json(status)),
                    **_auth_responses(write=True),
                    "503": journal_down,
                },
            }
        }

    item = _obj(
        {
            "worker_id": STR,
            "dp_rank": {**INT, "minimum": 0},
            "weight_version": {"type": ["string", "integer"]},
        },
        ["worker_id", "weight_version"],
    )
    result = _obj(
        {
            "status": {"type": "string", "enum": ["updated", "rejected"]},
            "worker_id": STR,
            "url": {"type": ["string", "null"]},
            "weight_version": STR,
            "dp_rank": INT,
            "reason": STR,
        },
        ["status", "worker_id", "url", "weight_version"],
    )
    return {
        "/routing_loop/pause": switch(
            "postRoutingLoopPause", "Pause rollout dispatch: new requests wait, in-flight ones finish"
        ),
        "/routing_loop/resume": switch("postRoutingLoopResume", "Resume rollout dispatch"),
        "/routing_loop/status": _get_and_head(
            _read_op(
                "getRoutingLoopStatus",
                "The routing loop's status",
                {"200": _resp("Status.", _json(status))},
                tags=("psrl",),
            )
        ),
        "/workers/stats": _get_and_head(
            _read_op(
                "getWorkerStats",
                "Per-instance routing stats: in flight, dispatched, version, state",
                {
                    "200": _resp(
                        "One row per routable instance (worker, DP rank).",
                        _json(
                            _obj(
                                {
                                    "workers": {"type": "array", "items": {"type": "object"}},
                                    "total": INT,
                                    "waiting": INT,
                                },
                                ["workers", "total"],
                            )
                        ),
                    )
                },
                tags=("psrl",),
            )
        ),
        "/workers/update_weight_version": {
            "post": {
                "operationId": "postWorkersUpdateWeightVersion",
                "summary": "Per-instance weight-version writes (PSRL); journaled as engine.version_set",
                "tags": ["psrl"],
                "security": SECURED,
                "requestBody": {"required": True, "content": _json({"type": "array", "items": item})},
                "responses": {
                    "200": _resp(
                        "Per item: updated or rejected (a replica's DP ranks need one version, all covered).",
                        _json(
                            _obj(
                                {
                                    "total": INT,
                                    "updated": INT,
                                    "rejected": INT,
                                    "results": {"type": "array", "items": result},
                                },
                                ["total", "updated", "rejected", "results"],
                            )
                        ),
                    ),
                    "400": _resp("Bad body (invalid_body).", _json(_rl_error(["invalid_body"]))),
                    **_auth_responses(write=True),
                    "503": journal_down,
                },
            }
        },
    }


def _paths(rl: bool) -> dict:
    paths: dict[str, dict] = {
        "/health": _get_and_head(
            {
                "operationId": "getHealth",
                "summary": "Liveness (always 200 `OK` while serving)",
                "tags": ["probes"],
                "security": [],
                "responses": {"200": _resp("Serving.", TEXT, GATEWAY_ID)},
            }
        ),
        "/liveness": _get_and_head(
            {
                "operationId": "getLiveness",
                "summary": "Liveness (always 200 `OK` while serving)",
                "tags": ["probes"],
                "security": [],
                "responses": {"200": _resp("Serving.", TEXT, GATEWAY_ID)},
            }
        ),
        "/readiness": _get_and_head(
            {
                "operationId": "getReadiness",
                "summary": "Ready when at least one worker is healthy",
                "tags": ["probes"],
                "security": [],
                "responses": {
                    "200": _resp("Ready.", _json(_ref("Readiness"))),
                    "503": _resp("No healthy worker.", _json(_ref("Readiness"))),
                },
            }
        ),
        "/openapi.json": _get_and_head(
            {
                "operationId": "getOpenapi",
                "summary": "This document (no key needed: it describes routes, not data)",
                "tags": ["meta"],
                "security": [],
                "responses": {"200": _resp("The OpenAPI document.", _json({"type": "object"}))},
            }
        ),
        "/docs": _get_and_head(
            {
                "operationId": "getDocs",
                "summary": "This document as an HTML page rendered by the gateway (no script, nothing "
                "loaded from elsewhere; no key needed)",
                "tags": ["meta"],
                "security": [],
                "responses": {
                    "200": _resp("The page.", {"text/html; charset=utf-8": {"schema": STR}}),
                },
            }
        ),
        "/workers": {
            **_get_and_head(
                _read_op(
                    "getWorkers",
                    "List the registry (SMG's /workers)",
                    {"200": _resp("The registry.", _json(_ref("WorkerList")))},
                    tags=("workers",),
                )
            ),
            "post": _workers_write(
                "postWorkers",
                "Register an engine (asynchronous: discovery follows)",
                "WorkerSpec",
                {
                    "202": _resp(
                        "Queued.",
                        _json(_ref("WorkerAccepted")),
                        {"location": {"required": True, "schema": STR}},
                    ),
                    "400": _resp("Bad content type, body or URL.", WORKER_ERR),
                    "409": _resp("A worker already has this URL.", WORKER_ERR),
                },
            ),
        },
        **_routing_loop_paths(),
        "/workers/{worker_id}": {
            **_get_and_head(
                _read_op(
                    "getWorker",
                    "One registry entry",
                    {
                        "200": _resp("The entry.", _json(_ref("Worker"))),
                        "400": _resp("Not a UUID.", WORKER_ERR),
                        "404": _resp("No such worker.", WORKER_ERR),
                    },
                    [WORKER_ID],
                    tags=("workers",),
                )
            ),
            "put": _workers_write(
                "putWorker",
                "Replace a worker's labels",
                "WorkerSpec",
                {
                    "202": _resp("Queued.", _json(_ref("WorkerAccepted"))),
                    "400": _resp("Bad id, content type or body; DP rank.", WORKER_ERR),
                    "404": _resp("No such worker.", WORKER_ERR),
                },
                [WORKER_ID],
            ),
            "patch": _workers_write(
                "patchWorker",
                "Merge labels into a worker's",
                "WorkerUpdate",
                {
                    "202": _resp("Queued.", _json(_ref("WorkerAccepted"))),
                    "400": _resp("Bad id, content type or body.", WORKER_ERR),
                    "404": _resp("No such worker.", WORKER_ERR),
                },
                [WORKER_ID],
            ),
            "delete": _workers_write(
                "deleteWorker",
                "Remove a worker (every DP rank of its engine)",
                None,
                {
                    "202": _resp("Queued.", _json(_ref("WorkerAccepted"))),
                    "400": _resp("Not a UUID.", WORKER_ERR),
                    "404": _resp("No such worker.", WORKER_ERR),
                },
                [WORKER_ID],
            ),
        },
    }
    paths.update(_dataplane_paths(rl))
    if not rl:
        return paths
    paths.update(_write_paths())
    paths.update(refit_paths())  # smgrl/api/openapi_refits.py
    rl_404 = _resp(
        "Unknown id, or no such route.", _json({"anyOf": [_ref("RlNotFound"), _ref("OpenAIError")]})
    )
    utf8 = _resp("Invalid UTF-8 in a path parameter.", TEXT)
    paths.update(
        {
            "/v1/rl/workers": _get_and_head(
                _read_op(
                    "getRlWorkers",
                    "Discovery: one row per engine (DP ranks collapsed)",
                    {"200": _resp("The rows.", _json(_ref("RlWorkersResponse")))},
                )
            ),
            "/v1/rl/workers/{id}": _get_and_head(
                _read_op(
                    "getRlWorker",
                    "One discovery row (that registry entry)",
                    {"200": _resp("The row.", _json(_ref("RlWorkerEntry"))), "400": utf8, "404": rl_404},
                    [_id_param("id", "the worker id")],
                )
            ),
            "/v1/rl/workers/{id}/engine/{path}": _engine_ops(fanout=False),
            "/v1/rl/engine/{path}": _engine_ops(fanout=True),
            "/v1/rl/operations/{id}": _get_and_head(
                _read_op(
                    "getRlOperation",
                    "The journal's record of one operation (smgrl addition)",
                    {"200": _resp("The record.", _json(_ref("Operation"))), "400": utf8, "404": rl_404},
                    [_id_param("id", "x-smgrl-operation-id of a per-worker call or fan-out")],
                )
            ),
            "/v1/rl/journal": _get_and_head(
                _read_op(
                    "getRlJournal",
                    "Journal events, paged (smgrl addition)",
                    {
                        "200": _resp("A page.", _json(_ref("JournalPage"))),
                        "400": _resp(
                            "`after`/`upto`/`limit` not an integer or too small, or `since`/`until` not a time.",
                            _json(_ref("RlBadRequest")),
                        ),
                    },
                    [
                        {
                            "name": "after",
                            "in": "query",
                            "required": False,
                            "allowEmptyValue": True,
                            "description": "events after this seq (empty: 0)",
                            "schema": {**INT, "minimum": 0, "default": 0},
                        },
                        {
                            "name": "limit",
                            "in": "query",
                            "required": False,
                            "allowEmptyValue": True,
                            "description": "page size (empty: 100; at most 1000 are returned)",
                            "schema": {**INT, "minimum": 1, "default": 100},
                        },
                        {
                            "name": "upto",
                            "in": "query",
                            "required": False,
                            "allowEmptyValue": True,
                            "description": "events up to and including this seq (empty: the head)",
                            "schema": {**INT, "minimum": 0},
                        },
                        {
                            "name": "type",
                            "in": "query",
                            "required": False,
                            "allowEmptyValue": True,
                            "description": "only these event types: comma-separated names or globs "
                            "(`worker.*,control.finished`)",
                            "schema": {"type": "string"},
                        },
                        *(
                            {
                                "name": name,
                                "in": "query",
                                "required": False,
                                "allowEmptyValue": True,
                                "description": f"events committed {what} this time: ISO 8601 "
                                "(`2026-11-29T11:55:33Z`), unix seconds, or `15m`/`2h`/`1d` ago",
                                "schema": {"type": "string"},
                            }
                            for name, what in (("since", "at or after"), ("until", "before"))
                        ),
                    ],
                )
            ),
        }
    )
    return paths


def document(rl_enabled: bool = True) -> dict:
    """The OpenAPI document (a fresh copy)."""
    doc = {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "smgrl",
            "version": __version__,
            "description": "RL control plane for fleets of LLM inference engines, wire-compatible with SMG "
            "1.13.0's /v1/rl (differences: docs/deviations.md). Every response carries x-request-id. "
            "Auth (--control-plane-api-keys): `admin` reaches every route; `user` reads discovery, the "
            "journal routes and GET /workers. Unknown routes are 404 and wrong methods 405 before auth.",
        },
        "tags": [
            {"name": "rl", "description": "The RL control plane (--enable-rl)"},
            {"name": "workers", "description": "SMG's worker registry API"},
            {"name": "dataplane", "description": "Rollout traffic (--api-key / tenant keys)"},
            {"name": "probes"},
            {"name": "meta"},
        ],
        "paths": _paths(rl_enabled),
        "components": {
            "schemas": copy.deepcopy(SCHEMAS),
            "responses": copy.deepcopy(RESPONSES),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A --control-plane-api-keys key (or the --api-key when no control-plane "
                    "key is configured). With no key configured at all, every route is open.",
                },
                "dataPlaneBearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The --api-key or a tenant key (the data-plane routes). With neither "
                    "configured, the data plane is open.",
                },
            },
        },
    }
    return doc


_RENDERED: dict[bool, bytes] = {}


def rendered(rl_enabled: bool) -> bytes:
    """The document as compact JSON bytes, built once per process."""
    body = _RENDERED.get(rl_enabled)
    if body is None:
        body = json.dumps(document(rl_enabled), separators=(",", ":")).encode()
        _RENDERED[rl_enabled] = body
    return body

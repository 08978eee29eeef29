"""OpenAPI paths of the refit and quarantine routes (smgrl/api/refits.py; docs/refits.md)."""

from __future__ import annotations

from typing import Any

OBJ: dict[str, Any] = {"type": "object"}
STR: dict[str, Any] = {"type": "string"}
ERR = {
    "type": "object",
    "required": ["error", "message"],
    "properties": {"error": STR, "message": STR},
    "additionalProperties": True,
}
SECURED = [{"bearer": []}, {}]


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


REQUEST_ID = {
    "x-request-id": {
        "description": "the caller's x-request-id (128 characters at most), else a generated `req-...` id",
        "required": True,
        "schema": STR,
    }
}


def _resp(description: str, content: dict | None = None) -> dict:
    out: dict[str, Any] = {"description": description, "headers": dict(REQUEST_ID)}
    if content:
        out["content"] = content
    return out


def _err(description: str) -> dict:
    return _resp(description, _json(ERR))


def _id(name: str, what: str) -> dict:
    return {"name": name, "in": "path", "required": True, "description": what, "schema": STR}


def _op(
    op_id: str, summary: str, responses: dict, *, write: bool, params=None, body: dict | None = None
) -> dict:
    auth = {"401": {"$ref": "#/components/responses/Unauthorized"}}
    if write:
        auth["403"] = {"$ref": "#/components/responses/Forbidden"}
        responses = {**responses, "503": _err("The journal cannot record it (journal_unavailable).")}
    out: dict[str, Any] = {
        "operationId": op_id,
        "summary": summary,
        "tags": ["rl"],
        "security": SECURED,
        "responses": {**responses, **auth},
    }
    if params:
        out["parameters"] = params
    if body is not None:
        out["requestBody"] = {"required": False, "content": _json(body)}
    return out


REFIT_REQUEST = {
    "type": "object",
    "required": ["selector", "source", "weight_version"],
    "properties": {
        "selector": {**STR, "example": "engine=sglang"},
        "source": {
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
                            "properties": {"model_path": {**STR, "minLength": 1, "pattern": "\\S"}},
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
                                "master_address": {**STR, "minLength": 1, "pattern": "\\S"},
                                "master_port": {"type": "integer", "minimum": 1, "maximum": 65535},
                                "group_name": STR,
                                "backend": {"type": "string", "enum": ["nccl", "gloo"]},
                                "checksums": {"type": "object", "additionalProperties": STR},
                            },
                        }
                    },
                },
            ]
        },
        "weight_version": STR,
        "pause_mode": {
            **STR,
            "description": "default per engine kind: sglang retract, vllm keep, tokenspeed keep",
        },
        "flush": {"type": "boolean", "default": True},
        "on_failure": {
            "type": "string",
            "enum": ["quarantine", "rollback", "abort"],
            "default": "quarantine",
        },
        "force": {"type": "boolean", "default": False},
        "transfer_timeout_secs": {
            "type": "number",
            "default": 600,
            "minimum": 0,
            "exclusiveMinimum": True,
            "maximum": 86400,
        },
    },
    "additionalProperties": False,
}
REFIT = {
    "type": "object",
    "description": "The saga: state, plan per engine, each engine's phase and verification (docs/refits.md).",
    "properties": {
        "refit_id": STR,
        "state": STR,
        "result": {**STR, "nullable": True},
        "engines": {"type": "array"},
    },
    "additionalProperties": True,
}
ID = _id("id", "the refit id")
REASON = {
    "type": "object",
    "properties": {"reason": {**STR, "nullable": True}},
    "additionalProperties": False,
}


def refit_paths() -> dict[str, dict]:
    not_found = _err("No such refit (refit_not_found).")
    wrong_state = _err("The refit is not awaiting a transfer (refit_state).")
    return {
        "/v1/rl/refits": {
            "post": _op(
                "postRefit",
                "Start a refit saga (admin role)",
                {
                    "202": _resp("Accepted: the saga runs; poll or stream it.", _json(REFIT)),
                    "400": _err(
                        "Bad body (invalid_body, invalid_version, invalid_selector, no_workers_match)."
                    ),
                    "409": _err(
                        "Engines that cannot take the source (refit_unsupported, with `engines`), a version the "
                        "fleet already left (version_left), or a refit already running (refit_in_progress)."
                    ),
                },
                write=True,
                body=REFIT_REQUEST,
            )
        },
        "/v1/rl/refits/{id}": {
            "get": _op(
                "getRefit",
                "A refit: plan and each engine's phase",
                {"200": _resp("The saga.", _json(REFIT)), "404": not_found},
                write=False,
                params=[ID],
            ),
            "head": _op(
                "headRefit",
                "A refit (head only)",
                {"200": _resp("Exists."), "404": _resp("No such refit.")},
                write=False,
                params=[ID],
            ),
        },
        "/v1/rl/refits/{id}/events": {
            "get": _op(
                "getRefitEvents",
                "Server-sent events: the refit's record on every change, until it finishes",
                {"200": _resp("text/event-stream", {"text/event-stream": {"schema": STR}}), "404": not_found},
                write=False,
                params=[ID],
            )
        },
        "/v1/rl/refits/{id}/commit": {
            "post": _op(
                "postRefitCommit",
                "The trainer's transfer is done: finish, version, verify, flush, resume",
                {
                    "202": _resp("The saga goes on.", _json(REFIT)),
                    "400": _err("Bad body (invalid_body): `{}` or nothing."),
                    "404": not_found,
                    "409": wrong_state,
                },
                write=True,
                params=[ID],
                body={"type": "object", "properties": {}, "additionalProperties": False},
            )
        },
        "/v1/rl/refits/{id}/fail": {
            "post": _op(
                "postRefitFail",
                "The trainer's transfer failed: on_failure applies",
                {
                    "202": _resp("The saga goes on.", _json(REFIT)),
                    "400": _err("Bad body (invalid_body)."),
                    "404": not_found,
                    "409": wrong_state,
                },
                write=True,
                params=[ID],
                body=REASON,
            )
        },
        "/v1/rl/refits/{id}/transfer": {
            "post": _op(
                "postRefitTransfer",
                "The engines' half of one broadcast chunk (each kind's update call)",
                {
                    "200": _resp("Per-engine results.", _json(OBJ)),
                    "400": _err("Bad body (invalid_body)."),
                    "404": not_found,
                    "409": wrong_state,
                },
                write=True,
                params=[ID],
                body={
                    "type": "object",
                    "required": ["names", "dtypes", "shapes"],
                    "properties": {
                        "names": {"type": "array", "items": STR},
                        "dtypes": {"type": "array", "items": STR},
                        "shapes": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
                    },
                    "additionalProperties": False,
                },
            )
        },
        "/v1/rl/journal/stream": {
            "get": _op(
                "getJournalStream",
                "Server-sent events of journal records as they commit (`?after=SEQ` or `?tail=N` replays first)",
                {
                    "200": _resp(
                        "text/event-stream: `event: journal`, `id: <seq>`",
                        {"text/event-stream": {"schema": STR}},
                    ),
                    "400": _err("`after` is not a non-negative integer (invalid_query)."),
                },
                write=False,
                params=[
                    {
                        "name": "after",
                        "in": "query",
                        "required": False,
                        "description": "replay the records after this seq, then follow",
                        "schema": {"type": "integer", "minimum": 0},
                    },
                    {
                        "name": "tail",
                        "in": "query",
                        "required": False,
                        "description": "without `after`: replay the last N records (at most 10,000), then follow",
                        "schema": {"type": "integer", "minimum": 0},
                    },
                ],
            )
        },
        "/fleet": {
            method: {
                "operationId": f"{method}FleetPage",
                "summary": "The live fleet page (HTML; it asks for a key and reads the API with it)",
                "tags": ["meta"],
                "security": [],
                "responses": {"200": _resp("The page.", {"text/html; charset=utf-8": {"schema": STR}})},
            }
            for method in ("get", "head")
        },
        "/v1/rl/workers/{id}/quarantine": {
            method: _op(
                f"{method}WorkerQuarantine",
                ("Quarantine a worker by hand" if method == "post" else "Release a quarantined worker")
                + " (journaled; admin role)",
                {
                    "200": _resp("The worker's quarantine state.", _json(OBJ)),
                    "400": _err("Bad body (invalid_body)."),
                    "404": _err("No such worker (worker_not_found)."),
                },
                write=True,
                params=[_id("id", "the worker id")],
                body=REASON,
            )
            for method in ("post", "delete")
        },
    }

"""Validation of ``/workers`` requests, with SMG 1.13.0's error texts (pure).

SMG answers ``400 {"error": "<text>", "code": "BAD_REQUEST"}``. Body texts come from axum's JSON
extractor over serde (``smgrl.http.bodies.serde_body`` reproduces them, positions included):
``Invalid JSON data: Failed to deserialize the JSON body into the target type: <path>: <problem>
at line L column C`` or ``JSON syntax error: Failed to parse the request body as JSON: ...``.
Worker ids are checked with the uuid crate's rules and texts (observed black-box).
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from smgrl.core import WORKER_TYPES, worker_id_problem, worker_url_problem
from smgrl.core.errors import WorkerApiError, bad_request
from smgrl.http.bodies.serde_body import SerdeError, parse_struct
from smgrl.http.bodies.serde_kinds import kind_schema
from smgrl.http.openapi.apidoc import field, model

DESERIALIZE = "Invalid JSON data: Failed to deserialize the JSON body into the target type: "
SYNTAX = "JSON syntax error: Failed to parse the request body as JSON: "
RUNTIMES = ("unspecified", "sglang", "vllm", "trtllm", "mlx", "tokenspeed", "generic", "external")


@attrs.frozen
class BodyField:
    """One field of a /workers body, written once. ``kind``: its serde type (``serde_kinds``),
    what the body reader checks with SMG's texts; /openapi.json's schema of it is derived from
    that (``body_model``), with ``description``, under ``shown_as`` when not its own name, and
    left out of the document when not ``documented``."""

    name: str
    kind: str
    description: str = ""
    shown_as: str = ""
    documented: bool = True


# The fields of SMG's WorkerSpec (29 in all) whose types smgrl knows; the others are ignored, as
# unknown fields are. ``runtime`` is an alias of ``runtime_type`` (the document has always named
# it so). ``model_id`` is NOT a field: SMG ignores it (the model id comes from the engine).
# ``models`` and ``health`` are SMG's nested structs, of which smgrl knows only a part (a
# ModelCard's ``id``): read and checked, not described.
WORKER_SPEC_BODY = (
    BodyField("url", "str", "http://, https://, grpc://, grpcs:// or ipc:// engine URL"),
    BodyField("api_key", "opt_str", "sent to the engine as bearer; never shown again"),
    BodyField("worker_type", "enum:" + ",".join(WORKER_TYPES)),
    BodyField("runtime_type", "enum:" + ",".join(RUNTIMES), shown_as="runtime"),
    BodyField("connection_mode", "enum:http,grpc,zmq"),
    BodyField("labels", "map_str"),
    BodyField("bootstrap_port", "opt_u16"),
    BodyField("priority", "u32"),
    BodyField("cost", "f32"),
    BodyField("dp_size", "opt_usize"),
    BodyField("max_connection_attempts", "u32"),
    BodyField("models", "seq:struct:ModelCard", documented=False),
    BodyField("health", "struct:HealthCheckUpdate", documented=False),
)
WORKER_SPEC_REQUIRED = ("url",)
WORKER_SPEC = {f.name: f.kind for f in WORKER_SPEC_BODY}
WORKER_SPEC_FIELDS = 29
WORKER_SPEC_ALIASES = {"runtime": "runtime_type"}
# SMG's WorkerUpdateRequest (5 fields).
WORKER_UPDATE_BODY = (
    BodyField("labels", "opt_map_str"),
    BodyField("priority", "opt_u32"),
    BodyField("cost", "opt_f32"),
)
WORKER_UPDATE = {f.name: f.kind for f in WORKER_UPDATE_BODY}
WORKER_UPDATE_FIELDS = 5


def body_model(
    name: str, fields: tuple[BodyField, ...], required: tuple[str, ...], description: str = ""
) -> type:
    """The /openapi.json model of a body (unknown fields allowed, as the reader ignores them):
    each documented field's schema derived from its serde kind."""
    attributes = {
        f.shown_as or f.name: field(
            f.description, optional=f.name not in required, schema=kind_schema(f.kind)
        )
        for f in fields
        if f.documented
    }
    cls: type = model(type(name, (), attributes), description=description, additional=True)
    return cls


PAYLOAD_TOO_LARGE = WorkerApiError(
    413, "PAYLOAD_TOO_LARGE", "Request body exceeded the payload limit (max_payload_size)"
)
# A /workers body is a worker spec or a label update: a few hundred bytes, a few KiB with many
# labels. SMG takes up to --max-payload-size (512 MiB); smgrl refuses anything over this before
# parsing it (docs/deviations.md): serde's exact reading costs about 0.5 us per byte on the event
# loop, so a 2 MB invalid body held it for a second, on a route open when no keys are configured.
WORKERS_BODY_LIMIT = 64 * 1024
WORKERS_BODY_TOO_LARGE = WorkerApiError(
    413,
    "PAYLOAD_TOO_LARGE",
    f"a /workers body is at most {WORKERS_BODY_LIMIT // 1024} KiB (a worker spec is a few hundred bytes)",
)


def is_json_content_type(content_type: str | None) -> bool:
    """axum's rule: ``application/json`` or ``application/<anything>+json``, parameters allowed,
    case-insensitive."""
    if not content_type:
        return False
    mime = content_type.split(";", 1)[0].strip().lower()
    kind, _, subtype = mime.partition("/")
    return kind == "application" and (subtype == "json" or subtype.endswith("+json"))


def check_content_type(content_type: str | None) -> None:
    if not is_json_content_type(content_type):
        raise bad_request("Missing Content-Type: application/json header")


def _parse(
    data: bytes,
    name: str,
    schema: dict[str, str],
    required: tuple[str, ...],
    count: int,
    aliases: dict[str, str] | None = None,
) -> dict:
    try:
        return parse_struct(data, name, schema, required, count, aliases)
    except SerdeError as exc:
        raise bad_request((SYNTAX if exc.syntax else DESERIALIZE) + exc.message) from None


def parse_worker_spec(data: bytes) -> dict[str, Any]:
    """A worker spec as POST/PUT take it (the content type was checked)."""
    body = _parse(
        data, "WorkerSpec", WORKER_SPEC, WORKER_SPEC_REQUIRED, WORKER_SPEC_FIELDS, WORKER_SPEC_ALIASES
    )
    url = body["url"]
    problem = worker_url_problem(url)
    if problem is not None:
        raise bad_request(problem)
    runtime = body.get("runtime_type")
    models = body.get("models") or []
    return {
        "url": url,
        "api_key": body.get("api_key"),
        "runtime": None if runtime in (None, "unspecified") else runtime,
        "worker_type": body.get("worker_type", "regular"),
        "bootstrap_port": body.get("bootstrap_port"),
        "labels": dict(body.get("labels") or {}),
        # PSRL's registration (docs/psrl.md): the first model card names the worker's model.
        "model_id": models[0]["id"] if models and models[0].get("id") else None,
        "worker_id": chosen_worker_id(data),
    }


def chosen_worker_id(data: bytes) -> str | None:
    """The ``id`` a registration chose (PSRL: the replica index), or None. SMG 1.13.0 ignores
    the field; smgrl makes it the worker id (a string, or an integer taken as its digits)."""
    try:
        value = json.loads(data).get("id")
    except (ValueError, AttributeError):
        return None
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    problem = worker_id_problem(value)
    if problem is not None:
        raise bad_request(f"Invalid worker id: `id` {problem}")
    return value


def parse_worker_update(data: bytes) -> dict[str, Any]:
    return _parse(data, "WorkerUpdateRequest", WORKER_UPDATE, (), WORKER_UPDATE_FIELDS)


_GROUP_LENGTHS = (8, 4, 4, 4, 12)


def uuid_error(text: str) -> str | None:
    """None for a UUID the uuid crate parses (simple, hyphenated, braced, urn), else its error
    text as SMG 1.13.0 prints it (indices are 0-based character offsets)."""
    offset, body, simple = 0, text, True
    if len(text) >= 2 and text[0] == "{" and text[-1] == "}":
        offset, body, simple = 1, text[1:-1], False
    elif text.startswith("urn:uuid:"):
        offset, body, simple = 9, text[9:], False
    hyphens = []
    for index, ch in enumerate(body):
        if ch == "-":
            hyphens.append(index)
        elif ch not in "0123456789abcdefABCDEF":
            return f"invalid character: found `{ch}` at {index + offset}"
    if not hyphens and simple:
        return None if len(text) == 32 else f"invalid length: found {len(text)}"
    if not hyphens:
        return None if len(body) == 32 else f"invalid length: found {len(body)}"
    if len(hyphens) != 4:
        return f"invalid group count: expected 5, found {len(hyphens) + 1}"
    starts = (0, 9, 14, 19, 24)
    for group in range(4):
        if hyphens[group] != starts[group + 1] - 1:
            return (
                f"invalid group length in group {group}: expected {_GROUP_LENGTHS[group]}, "
                f"found {hyphens[group] - starts[group]}"
            )
    if len(body) != 36:
        return f"invalid group length in group 4: expected 12, found {len(body) - starts[4]}"
    return None

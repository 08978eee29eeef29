"""The SMG-compatible worker API: ``/workers`` and ``/workers/{id}``.

Writes answer 202 at once and take effect through registry events, as SMG's job queue does;
errors are ``{"error": "<text>", "code": "BAD_REQUEST" | "WORKER_NOT_FOUND" |
"WORKER_ALREADY_EXISTS"}``. All routes sit behind control-plane auth (GET is a read, the rest
are writes).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from quart import Response, request

from journal import JournalWriteError
from smgrl import __version__
from smgrl.core import parse_size, reaches_listener, self_registration
from smgrl.core.auth import READ, WRITE
from smgrl.core.errors import WorkerApiError, bad_request
from smgrl.http.bodies import envelopes as env
from smgrl.http.bodies.workers_body import (
    PAYLOAD_TOO_LARGE,
    WORKER_SPEC_BODY,
    WORKER_SPEC_REQUIRED,
    WORKER_UPDATE_BODY,
    WORKERS_BODY_LIMIT,
    WORKERS_BODY_TOO_LARGE,
    body_model,
    check_content_type,
    parse_worker_spec,
    parse_worker_update,
    uuid_error,
)
from smgrl.http.openapi.apidoc import STRING, Body, Resp, Route, as_json, field, model, path_param
from smgrl.http.openapi.schemas import PAYLOAD_TOO_LARGE as PAYLOAD_TOO_LARGE_RESP
from smgrl.http.openapi.schemas import WorkerApiErrorModel
from smgrl.http.routes.guard import Envelope, Guard
from smgrl.registry import Registration

VERSION = f"smgrl-{__version__}"  # /get_loads's `version` (SMG: `smg-1.13.0`)


def worker_json(w, engine_load: dict | None = None) -> dict:
    out = {
        "id": w.id,
        "model_id": w.effective_model_id,
        "url": w.url,
        "worker_type": w.worker_type,
        "connection_mode": w.connection_mode,
        "runtime_type": w.runtime,
        "labels": w.labels,
        "priority": 50,
        "cost": 1.0,
    }
    models = model_cards(w)
    if models:
        out = {**dict(list(out.items())[:3]), "models": models, **dict(list(out.items())[3:])}
    if w.dp_aware and w.dp_rank is not None:
        out.update(dp_base_url=w.base_url, dp_rank=w.dp_rank, dp_size=w.dp_size)
    out["max_connection_attempts"] = 20
    out.update(is_healthy=w.status == "ready", status=w.status, load=0, http2=False)
    if w.bootstrap_port is not None:
        out["bootstrap_port"] = w.bootstrap_port
    if engine_load is not None:
        out["engine_load"] = engine_load  # the load monitor's last sample (smgrl/registry/loads.py)
    return out


def model_cards(w) -> list[dict]:
    """SMG's ``models`` list of a discovered worker: one card built from its labels (field
    order as SMG serialises it; absent facts are omitted)."""
    if w.status == "pending":
        return []
    labels = w.labels
    card: dict = {"id": w.effective_model_id, "model_type": ["chat", "completions", "responses", "tools"]}
    if "model_type" in labels:
        card["hf_model_type"] = labels["model_type"]
    if "architectures" in labels:
        try:
            card["architectures"] = json.loads(labels["architectures"])
        except (ValueError, RecursionError):  # a label is any string an admin or an engine gave
            pass
    length = labels.get("max_model_len") or labels.get("context_length")
    if length is not None and length.isdigit() and parse_size(length) is not None:
        card["context_length"] = parse_size(length)  # "²".isdigit() too: parse_size refuses it
    if "tokenizer_path" in labels:
        card["tokenizer_path"] = labels["tokenizer_path"]
    return [card]


def worker_error(exc: BaseException) -> Response:
    """A /workers error in SMG's ``{"error": text, "code": CODE}`` envelope."""
    if isinstance(exc, JournalWriteError):
        # The registry changes only through a durable event: no event, no change, and the caller
        # is told so (retryable), never a 500.
        exc = WorkerApiError(503, "JOURNAL_UNAVAILABLE", f"the journal cannot record this change: {exc}")
    return env.json_response(exc.status, exc.body())


WORKERS_ENVELOPE = Envelope(
    errors=(WorkerApiError, JournalWriteError),
    render=worker_error,
    too_large=lambda: worker_error(PAYLOAD_TOO_LARGE),
)


async def _bounded_body() -> bytes:
    """The request body, refused (413) past WORKERS_BODY_LIMIT: declared or as it arrives."""
    length = request.content_length
    if length is not None and length > WORKERS_BODY_LIMIT:
        raise WORKERS_BODY_TOO_LARGE
    chunks, size = [], 0
    async for chunk in request.body:
        size += len(chunk)
        if size > WORKERS_BODY_LIMIT:
            raise WORKERS_BODY_TOO_LARGE
        chunks.append(chunk)
    return b"".join(chunks)


class WorkersApi:
    def __init__(self, gateway) -> None:
        self.gateway = gateway
        self.guard = Guard(gateway)

    async def _guarded(self, action: str, handler, *args) -> Response:
        return await self.guard.answer(action, request.path, lambda check: handler(*args), WORKERS_ENVELOPE)

    async def list(self) -> Response:
        return await self._guarded(READ, self._list)

    async def get_loads(self) -> Response:
        return await self._guarded(READ, self._get_loads)

    async def create(self) -> Response:
        return await self._guarded(WRITE, self._create)

    async def one(self, worker_id: str) -> Response:
        action = READ if request.method in ("GET", "HEAD") else WRITE
        handler = {
            "GET": self._get,
            "HEAD": self._get,
            "PATCH": self._patch,
            "PUT": self._put,
            "DELETE": self._delete,
        }[request.method]
        return await self._guarded(action, handler, worker_id)

    def _load(self, worker) -> dict | None:
        return self.gateway.loads.sample(worker.id)

    # -- handlers ------------------------------------------------------------------------------

    async def _list(self) -> Response:
        workers = [worker_json(w, self._load(w)) for w in self.gateway.fleet.registry]
        stats = {
            f"{t}_count": sum(1 for w in self.gateway.fleet.registry if w.worker_type == t)
            for t in ("prefill", "decode", "regular")
        }
        return env.json_response(200, {"workers": workers, "total": len(workers), "stats": stats})

    async def _get_loads(self) -> Response:
        return env.json_response(200, self.gateway.loads.summary(VERSION, time.time_ns()))

    async def _body(self, parse):
        # SMG's JSON extractor runs before the handler: content type, then the body, then the
        # handler's own checks (the worker id included).
        check_content_type(request.headers.get("content-type"))
        return parse(await _bounded_body())

    async def _create(self) -> Response:
        spec = await self._body(parse_worker_spec)
        # A URL naming the very listener this request came in on (its port, a loopback name)
        # would route rollouts back here; other names for it are caught by discovery, which sees
        # this gateway's id on GET /health.
        host, port = request.scope.get("server") or (None, None)
        if reaches_listener(spec["url"], host, port):
            raise bad_request(self_registration(spec["url"]))
        worker = await self.gateway.registry.register(Registration(**spec), source="api")
        location = f"/workers/{worker.id}"
        return env.json_response(
            202,
            {
                "status": "accepted",
                "worker_id": worker.id,
                "url": worker.url,
                "location": location,
                "message": "Worker addition queued for background processing",
            },
            {"location": location},
        )

    def _lookup(self, worker_id: str):
        # A registered id is served whatever its form (PSRL's replicas choose "0", "1"...);
        # any other id gets SMG's answers (400 for a non-UUID, 404 for an unknown UUID).
        known = self.gateway.fleet.registry.get(worker_id)
        if known is not None:
            return known
        problem = uuid_error(worker_id)
        if problem is not None:
            raise bad_request(f"Invalid worker_id '{worker_id}' (expected UUID). Error: {problem}")
        worker = self.gateway.fleet.registry.get(worker_id)
        if worker is None:
            raise WorkerApiError(404, "WORKER_NOT_FOUND", f"Worker {worker_id} not found")
        return worker

    async def _get(self, worker_id: str) -> Response:
        worker = self._lookup(worker_id)
        return env.json_response(200, worker_json(worker, self._load(worker)))

    async def _patch(self, worker_id: str) -> Response:
        body = await self._body(parse_worker_update)
        worker = self._lookup(worker_id)
        if body.get("labels") is not None:
            await self.gateway.registry.set_labels(worker.id, body["labels"], "merge")
        return _accepted(worker.id, "Worker update queued for background processing")

    async def _put(self, worker_id: str) -> Response:
        spec = await self._body(parse_worker_spec)
        worker = self._lookup(worker_id)
        if worker.dp_aware and worker.dp_rank is not None:
            raise bad_request(
                f"Worker '{worker.url}' belongs to a data-parallel group. PUT is not supported for "
                "data-parallel workers. Use DELETE + POST instead."
            )
        await self.gateway.registry.set_labels(worker.id, spec["labels"], "replace")
        return _accepted(worker.id, "Worker update queued for background processing")

    async def _delete(self, worker_id: str) -> Response:
        worker = self._lookup(worker_id)
        await self.gateway.registry.remove(worker.id, "removed through DELETE /workers")
        return _accepted(worker.id, "Worker removal queued for background processing")


def _accepted(worker_id: str, message: str) -> Response:
    return env.json_response(202, {"status": "accepted", "worker_id": worker_id, "message": message})


# -- /openapi.json: these routes, their models and their errors (smgrl/http/openapi/apidoc.py) ---------------

U32 = {"type": "integer", "minimum": 0, "maximum": 4294967295}


# The request bodies' models are derived from the schemas the body reader checks (workers_body).
WorkerSpec = body_model(
    "WorkerSpec", WORKER_SPEC_BODY, WORKER_SPEC_REQUIRED, "SMG's WorkerSpec; unknown fields are ignored."
)
WorkerUpdate = body_model("WorkerUpdate", WORKER_UPDATE_BODY, ())


@model(
    additional=True,
    description="A registry entry as SMG's /workers shows it.",
    name="Worker",
)
class WorkerEntry:
    id: str
    model_id: str = field(optional=True)
    url: str
    models: list[dict] = field(optional=True)
    worker_type: str
    connection_mode: str
    runtime_type: str | None = field(optional=True)
    labels: dict[str, str]
    priority: int = field(optional=True)
    cost: float = field(optional=True)
    max_connection_attempts: int = field(optional=True)
    dp_base_url: str = field(optional=True)
    dp_rank: int = field(optional=True)
    dp_size: int | None = field(optional=True)
    is_healthy: bool
    status: str
    load: int = field(optional=True)
    http2: bool = field(optional=True)
    bootstrap_port: int = field(optional=True)
    engine_load: dict = field(
        "The load monitor's last GET /v1/loads sample (SMG's WorkerLoadResponse; absent before "
        "the first sample, after a failed read, and on a worker that is not ready).",
        optional=True,
    )


@model(additional=True, description="SMG's /get_loads answer.")
class LoadsSummary:
    timestamp: str = field("When the answer was made (RFC 3339).")
    version: str = field("The gateway's name and version (SMG: `smg-1.13.0`).")
    dp_rank_count: int = field("How many rank rows follow.", minimum=0)
    loads: list[dict] = field(
        "One row per DP rank of every sampled engine: `worker`, `worker_type`, then its sample."
    )
    aggregate: dict = field(
        "Totals and means over the rows (absent without rows): total_running_reqs, total_waiting_reqs, "
        "total_reqs, avg_token_usage, avg_throughput, avg_utilization.",
        optional=True,
    )


@model(inline=True)
class _TypeCounts:
    prefill_count: int
    decode_count: int
    regular_count: int


@model
class WorkerList:
    workers: list[WorkerEntry]
    total: int = field(minimum=0)
    stats: _TypeCounts


@model
class WorkerAccepted:
    status: Literal["accepted"]
    worker_id: str
    url: str = field(optional=True)
    location: str = field(optional=True)
    message: str


def _error(description: str, *codes: str) -> Resp:
    return Resp(description, as_json(WorkerApiErrorModel), errors=codes)


WORKER_ID = path_param("worker_id", "the registry id (a UUID)")
QUEUED = Resp("Queued.", as_json(WorkerAccepted))
_NO_SUCH = _error("No such worker.", "WORKER_NOT_FOUND")
# Every write: its body may be too large, and the journal must take the change.
_WRITE = {
    "413": PAYLOAD_TOO_LARGE_RESP,
    "503": _error(
        "The journal cannot record the change (JOURNAL_UNAVAILABLE): nothing changed; retry.",
        "JOURNAL_UNAVAILABLE",
    ),
}


def _write(method: str, path: str, op_id: str, summary: str, body: Any, responses: dict, **kw: Any) -> Route:
    return Route(
        method,
        path,
        op_id,
        "workers",
        summary,
        {**responses, **_WRITE},
        role="admin",
        body=Body(body) if body is not None else None,
        **kw,
    )


# One Route per operation: entries alike in shape stay apart (each is its own route's contract).
OPENAPI_ROUTES = (
    Route(
        "GET",
        "/workers",
        "getWorkers",
        "workers",
        "List the registry (SMG's /workers)",
        {"200": Resp("The registry.", as_json(WorkerList))},
        role="read",
    ),
    Route(
        "GET",
        "/get_loads",
        "getLoads",
        "workers",
        "Every engine's last load sample, per DP rank, with totals (SMG's /get_loads)",
        {"200": Resp("The load monitor's samples (no engine is called).", as_json(LoadsSummary))},
        role="read",
    ),
    _write(
        "POST",
        "/workers",
        "postWorkers",
        "Register an engine (asynchronous: discovery follows)",
        WorkerSpec,
        {
            "202": Resp(
                "Queued.", as_json(WorkerAccepted), {"location": {"required": True, "schema": STRING}}
            ),
            "400": _error("Bad content type, body or URL.", "BAD_REQUEST"),
            "409": _error("A worker already has this URL.", "WORKER_ALREADY_EXISTS"),
        },
    ),
    Route(
        "GET",
        "/workers/{worker_id}",
        "getWorker",
        "workers",
        "One registry entry",
        {
            "200": Resp("The entry.", as_json(WorkerEntry)),
            "400": _error("Not a UUID.", "BAD_REQUEST"),
            "404": _NO_SUCH,
        },
        role="read",
        params=(WORKER_ID,),
    ),
    _write(
        "PUT",
        "/workers/{worker_id}",
        "putWorker",
        "Replace a worker's labels",
        WorkerSpec,
        {
            "202": QUEUED,
            "400": _error("Bad id, content type or body; DP rank.", "BAD_REQUEST"),
            "404": _NO_SUCH,
        },
        params=(WORKER_ID,),
    ),
    _write(
        "PATCH",
        "/workers/{worker_id}",
        "patchWorker",
        "Merge labels into a worker's",
        WorkerUpdate,
        {"202": QUEUED, "400": _error("Bad id, content type or body.", "BAD_REQUEST"), "404": _NO_SUCH},
        params=(WORKER_ID,),
    ),
    _write(
        "DELETE",
        "/workers/{worker_id}",
        "deleteWorker",
        "Remove a worker (every DP rank of its engine)",
        None,
        {"202": QUEUED, "400": _error("Not a UUID.", "BAD_REQUEST"), "404": _NO_SUCH},
        params=(WORKER_ID,),
    ),
)

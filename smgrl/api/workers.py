"""The SMG-compatible worker API: ``/workers`` and ``/workers/{id}``.

Writes answer 202 at once and take effect through registry events, as SMG's job queue does;
errors are ``{"error": "<text>", "code": "BAD_REQUEST" | "WORKER_NOT_FOUND" |
"WORKER_ALREADY_EXISTS"}``. All routes sit behind control-plane auth (GET is a read, the rest
are writes).
"""

from __future__ import annotations

import json

from quart import Response, request
from werkzeug.exceptions import RequestEntityTooLarge

from journal import JournalWriteError
from smgrl.api import envelopes as env
from smgrl.api.guard import Guard
from smgrl.api.workers_body import (
    PAYLOAD_TOO_LARGE,
    check_content_type,
    parse_worker_spec,
    parse_worker_update,
    uuid_error,
)
from smgrl.auth import READ, WRITE
from smgrl.core.worker import parse_size, reaches_listener, self_registration
from smgrl.errors import WorkerApiError, bad_request
from smgrl.registry.service import Registration


def worker_json(w) -> dict:
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


async def read_body() -> bytes:
    try:
        return await request.get_data(cache=False)
    except RequestEntityTooLarge:
        # A chunked body outgrew --max-payload-size (a declared length was refused earlier).
        raise PAYLOAD_TOO_LARGE from None


class WorkersApi:
    def __init__(self, gateway) -> None:
        self.gw = gateway
        self.guard = Guard(gateway)

    async def _guarded(self, action: str, handler, *args) -> Response:
        async with self.guard.check(action, request.path) as check:
            if check.denied is not None:
                return check.denied
            try:
                response = await handler(*args)
            except WorkerApiError as exc:
                response = env.json_response(exc.status, exc.body())
            except JournalWriteError as exc:
                # The registry changes only through a durable event: no event, no change, and
                # the caller is told so (retryable), never a 500.
                err = WorkerApiError(
                    503, "JOURNAL_UNAVAILABLE", f"the journal cannot record this change: {exc}"
                )
                response = env.json_response(err.status, err.body())
            check.status = response.status_code
            return response

    async def list(self) -> Response:
        return await self._guarded(READ, self._list)

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

    # -- handlers ------------------------------------------------------------------------------

    async def _list(self) -> Response:
        workers = [worker_json(w) for w in self.gw.fleet.registry]
        stats = {
            f"{t}_count": sum(1 for w in self.gw.fleet.registry if w.worker_type == t)
            for t in ("prefill", "decode", "regular")
        }
        return env.json_response(200, {"workers": workers, "total": len(workers), "stats": stats})

    async def _body(self, parse):
        # SMG's JSON extractor runs before the handler: content type, then the body, then the
        # handler's own checks (the worker id included).
        check_content_type(request.headers.get("content-type"))
        return parse(await read_body())

    async def _create(self) -> Response:
        spec = await self._body(parse_worker_spec)
        # A URL naming the very listener this request came in on (its port, a loopback name)
        # would route rollouts back here; other names for it are caught by discovery, which sees
        # this gateway's id on GET /health.
        host, port = request.scope.get("server") or (None, None)
        if reaches_listener(spec["url"], host, port):
            raise bad_request(self_registration(spec["url"]))
        worker = await self.gw.registry.register(Registration(**spec), source="api")
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
        problem = uuid_error(worker_id)
        if problem is not None:
            raise bad_request(f"Invalid worker_id '{worker_id}' (expected UUID). Error: {problem}")
        worker = self.gw.fleet.registry.get(worker_id)
        if worker is None:
            raise WorkerApiError(404, "WORKER_NOT_FOUND", f"Worker {worker_id} not found")
        return worker

    async def _get(self, worker_id: str) -> Response:
        return env.json_response(200, worker_json(self._lookup(worker_id)))

    async def _patch(self, worker_id: str) -> Response:
        body = await self._body(parse_worker_update)
        worker = self._lookup(worker_id)
        if body.get("labels") is not None:
            await self.gw.registry.set_labels(worker.id, body["labels"], "merge")
        return _accepted(worker.id, "Worker update queued for background processing")

    async def _put(self, worker_id: str) -> Response:
        spec = await self._body(parse_worker_spec)
        worker = self._lookup(worker_id)
        if worker.dp_aware and worker.dp_rank is not None:
            raise bad_request(
                f"Worker '{worker.url}' belongs to a data-parallel group. PUT is not supported for "
                "data-parallel workers. Use DELETE + POST instead."
            )
        await self.gw.registry.set_labels(worker.id, spec["labels"], "replace")
        return _accepted(worker.id, "Worker update queued for background processing")

    async def _delete(self, worker_id: str) -> Response:
        worker = self._lookup(worker_id)
        await self.gw.registry.remove(worker.id, "removed through DELETE /workers")
        return _accepted(worker.id, "Worker removal queued for background processing")


def _accepted(worker_id: str, message: str) -> Response:
    return env.json_response(202, {"status": "accepted", "worker_id": worker_id, "message": message})

"""The SMG-compatible worker API: ``/workers`` and ``/workers/{id}``.

Writes answer 202 at once and take effect through registry events, as SMG's job queue does;
errors are ``{"error": "<text>", "code": "BAD_REQUEST" | "WORKER_NOT_FOUND" |
"WORKER_ALREADY_EXISTS"}``. All routes sit behind control-plane auth (GET is a read, the rest
are writes).
"""

from __future__ import annotations

from quart import Response, request

from smgrl.api import envelopes as env
from smgrl.api.guard import Guard
from smgrl.api.workers_body import check_labels, check_worker_spec, parse_json_body
from smgrl.auth import READ, WRITE
from smgrl.core.worker import is_uuid
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
    if w.dp_aware and w.dp_rank is not None:
        out.update(dp_base_url=w.base_url, dp_rank=w.dp_rank, dp_size=w.dp_size)
    out.update(is_healthy=w.status == "ready", status=w.status, load=0, http2=False)
    if w.bootstrap_port is not None:
        out["bootstrap_port"] = w.bootstrap_port
    return out


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

    async def _create(self) -> Response:
        body = parse_json_body(await request.get_data(cache=False), request.headers.get("content-type"))
        spec = check_worker_spec(body)
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
        if not is_uuid(worker_id):
            raise bad_request(f"Invalid worker_id '{worker_id}' (expected UUID)")
        worker = self.gw.fleet.registry.get(worker_id)
        if worker is None:
            raise WorkerApiError(404, "WORKER_NOT_FOUND", f"Worker {worker_id} not found")
        return worker

    async def _get(self, worker_id: str) -> Response:
        return env.json_response(200, worker_json(self._lookup(worker_id)))

    async def _patch(self, worker_id: str) -> Response:
        worker = self._lookup(worker_id)
        body = parse_json_body(await request.get_data(cache=False), request.headers.get("content-type"))
        if not isinstance(body, dict):
            raise bad_request("Invalid JSON data: expected a JSON object")
        if body.get("labels") is not None:
            await self.gw.registry.set_labels(worker.id, check_labels(body["labels"]), "merge")
        return _accepted(worker.id, "Worker update queued for background processing")

    async def _put(self, worker_id: str) -> Response:
        worker = self._lookup(worker_id)
        body = parse_json_body(await request.get_data(cache=False), request.headers.get("content-type"))
        spec = check_worker_spec(body)
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

"""SMG's gateway-level ``POST /flush_cache``: every engine's cache flushed, answered with SMG
1.13.0's summary (``WorkerManager::flush_cache_all``).

In smgrl it is a journaled fan-out like ``POST /v1/rl/engine/flush_cache`` (D5: every control
call is in the journal, with its outcome per engine; the answer carries ``x-smgrl-operation-id``):
``POST /flush_cache`` with no body to every discovered HTTP and gRPC worker (ZMQ workers have no
cache-flush call and are counted as skipped, as SMG does). An admin write on the control plane
(SMG's role and 403 text). 200 when every engine flushed, else 206 with ``successful`` (URLs) and
``failed`` (``{"worker", "error"}``; the error is smgrl's fan-out text, e.g. ``HTTP 400``).
"""

from __future__ import annotations

from typing import Literal

from quart import Response, g

from smgrl.control import CallContext, ControlRequest
from smgrl.core import collapse
from smgrl.core.auth import WRITE
from smgrl.core.selector import Selector
from smgrl.http.bodies import envelopes as env
from smgrl.http.openapi.apidoc import Resp, Route, as_json, field, model
from smgrl.http.openapi.schemas import METHOD_NOT_ALLOWED
from smgrl.http.routes.guard import Guard

EVERY_WORKER = Selector(source="", terms=())  # the journal's record: no selector, every worker
_FLUSH = ControlRequest(method="POST", path="flush_cache", query=None, body=b"", content_type=None)


class FlushCache:
    def __init__(self, gateway) -> None:
        self.gateway = gateway
        self.guard = Guard(gateway)

    def register(self, app) -> None:
        app.add_url_rule("/flush_cache", "flush_cache", self.flush, methods=["POST"])

    async def flush(self) -> Response:
        return await self.guard.answer(WRITE, "/flush_cache", self._flush)

    async def _flush(self, check) -> Response:
        gw = self.gateway
        rows = [w for w in gw.fleet.registry if w.is_visible]
        http = sum(1 for w in rows if w.connection_mode == "http")
        zmq = sum(1 for w in rows if w.connection_mode == "zmq")
        summary = {"total_workers": len(rows), "http": http, "grpc": len(rows) - http - zmq, "zmq": zmq}
        targets = [
            group.representative
            for group in collapse(gw.fleet.registry)
            if group.representative.is_visible and group.representative.connection_mode != "zmq"
        ]
        if not targets:
            message = "No workers available for cache flush"
            if zmq:
                message = f"No cache-flush-capable workers available ({zmq} ZMQ workers skipped: no cache-flush RPC)"
            return env.json_response(200, _answer([], [], message, **summary))
        audit = getattr(g, "audit_check", None)
        ctx = CallContext(
            principal=check.principal.label if check.principal else None,
            request_id=getattr(g, "request_id", None),
            audit=audit.audit_event if audit is not None else None,
        )
        result = await gw.control.fanout(EVERY_WORKER, targets, _FLUSH, ctx)
        failed_ids = {f["worker_id"]: f for f in result.body["failed"]}
        successful = [w.url for w in targets if w.id not in failed_ids]
        failed = [(f["url"], f["message"]) for f in result.body["failed"]]
        if failed:
            message = f"Cache flush: {len(successful)} succeeded, {len(failed)} failed"
        else:
            message = f"Successfully flushed cache on all {len(successful)} workers"
        if zmq:
            message += f" ({zmq} ZMQ workers skipped: no cache-flush RPC)"
        headers = {"x-smgrl-operation-id": result.op_id}
        if not result.journaled:
            headers["x-smgrl-journal"] = "unavailable"
        return env.json_response(
            206 if failed else 200, _answer(successful, failed, message, **summary), headers
        )


def _answer(successful: list[str], failed: list, message: str, *, total_workers, http, grpc, zmq) -> dict:
    body = {
        "status": "partial_success" if failed else "success",
        "message": message,
        "workers_flushed": len(successful),
        "total_http_workers": http,
        "total_grpc_workers": grpc,
        "total_zmq_workers_skipped": zmq,
        "total_workers": total_workers,
    }
    if failed:
        body["successful"] = successful
        body["failed"] = [{"worker": url, "error": error} for url, error in failed]
    return body


@model(additional=True, description="SMG's /flush_cache answer.")
class FlushCacheSummary:
    status: Literal["success", "partial_success"]
    message: str
    workers_flushed: int = field(minimum=0)
    total_http_workers: int = field(minimum=0)
    total_grpc_workers: int = field(minimum=0)
    total_zmq_workers_skipped: int = field(minimum=0)
    total_workers: int = field(minimum=0)
    successful: list[str] = field("With failures: the URLs that flushed.", optional=True)
    failed: list[dict] = field("With failures: `{worker, error}` per engine.", optional=True)


OPENAPI_ROUTES = (
    Route(
        "POST",
        "/flush_cache",
        "postFlushCache",
        "workers",
        "Flush every engine's cache (SMG's gateway route; a journaled fan-out, admin role)",
        {
            "200": Resp("Every engine flushed (or none to flush).", as_json(FlushCacheSummary)),
            "206": Resp("Some engines failed.", as_json(FlushCacheSummary)),
            "405": METHOD_NOT_ALLOWED,
        },
        role="admin",
    ),
)

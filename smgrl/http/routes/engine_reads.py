"""SMG's gateway-level engine reads: ``GET /get_server_info``, ``GET /get_model_info`` and
``GET /health_generate``, forwarded to one engine and its answer relayed (status, body and
content type), as SMG 1.13.0 does.

Which engine: the first ready HTTP worker in registration order (SMG asks the first worker its
registry lists, in no stable order, also when that engine lacks the route: its 404 is relayed). No key is needed, as in SMG (like
``/health``); the engine gets the worker's key. No ready worker: 503 ``no_workers`` with SMG's
envelope and text. An engine that does not answer: 502 ``upstream_unreachable``. Unlike SMG, the
engine's secrets are masked in the relayed answer (``smgrl/core/redact.py``, docs/deviations.md).

To ask a given engine, the control plane's ``GET /v1/rl/workers/{id}/engine/server_info`` names
it (and is journaled).
"""

from __future__ import annotations

from quart import Response, request

from smgrl.core import redact_answer
from smgrl.core.errors import UpstreamUnreachable, openai_body
from smgrl.http.bodies import envelopes as env
from smgrl.http.openapi.apidoc import ANY, Resp, Route, as_json
from smgrl.http.openapi.schemas import DataPlaneErrorModel
from smgrl.registry import ProbeFailed, ReachesSelf, fetch

PATHS = ("/get_server_info", "/get_model_info", "/health_generate")
# SMG's answer without a worker (its type is `server_error`, not the data plane's 503 type).
NO_WORKERS = {
    "error": {
        "type": "server_error",
        "code": "no_workers",
        "message": "No workers are available",
        "param": None,
    }
}


class EngineReads:
    def __init__(self, gateway) -> None:
        self.gateway = gateway

    def register(self, app) -> None:
        for path in PATHS:
            app.add_url_rule(path, path.strip("/"), self.forward, methods=["GET"])

    async def forward(self) -> Response:
        g = self.gateway
        worker = next(
            (w for w in g.fleet.registry if w.status == "ready" and w.connection_mode == "http"), None
        )
        if worker is None:
            return env.json_response(503, NO_WORKERS, {"x-smg-error-code": "no_workers"})
        key = g.keys.get(worker.group)
        try:
            answer, data = await fetch(
                g.pools, worker.base_url, request.path, key, g.cfg.request_timeout_secs
            )
        except (ProbeFailed, ReachesSelf) as exc:
            error = UpstreamUnreachable(f"worker {worker.id} did not answer: {exc}", worker_id=worker.id)
            return env.json_response(502, openai_body(error), {"x-smg-error-code": error.code})
        # No key is needed here (as SMG), but an engine's answer may hold its keys (SGLang's
        # server_info is its launch arguments): they are masked, and so is the key it was sent.
        response = Response(redact_answer(data, (key,)), status=answer.status)
        ctype = answer.header(b"content-type")
        if ctype is None:
            del response.headers["content-type"]  # relayed as the engine sent it: none
        else:
            response.headers["content-type"] = ctype.decode("latin-1")
        return response


_NO_WORKERS_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "type": {"type": "string", "enum": ["server_error"]},
                "code": {"type": "string", "enum": ["no_workers"]},
                "message": {"type": "string"},
                "param": {"nullable": True, "enum": [None]},
            },
        }
    },
}
OPENAPI_ROUTES = tuple(
    Route(
        "GET",
        path,
        "getGateway" + path.strip("/").replace("_", " ").title().replace(" ", ""),
        "dataplane",
        f"The first ready engine's `{path}`, relayed (SMG's gateway route; no key needed)",
        {
            "200": Resp("The engine's answer, relayed with its status and content type.", as_json(ANY)),
            "502": Resp(
                "The engine did not answer (upstream_unreachable).",
                as_json(DataPlaneErrorModel),
                errors=(UpstreamUnreachable,),
            ),
            "503": Resp("No ready worker (no_workers).", as_json(_NO_WORKERS_SCHEMA), errors=("no_workers",)),
        },
        security="open",
    )
    for path in PATHS
)

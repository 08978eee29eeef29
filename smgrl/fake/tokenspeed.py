"""Fake TokenSpeed 0.1.1: the in-engine RL control app (docs/engines.md, TokenSpeed) on its own port,
plus the sidecar routes a gateway needs for discovery merged into the same app.

Control app rules: errors are ``{"success": false, "message": ...}``; the default pause mode
is ``wait`` (``retract``/``in_place`` are 400); disk/tensor refits are 501 before the body is
read; ``flush_cache`` always claims success; a distributed update does not flush by default;
an optional bearer key guards every control route (401 ``unauthorized``).

Sidecar routes (open even with the key): ``/get_server_info`` (flattened server args with the
``rl.*`` advertisement and ``attn_tp_size``), ``/get_model_info``, ``/health``,
``/health_check``, ``/generate`` (SGLang-compatible shim), ``/v1/models``. There is no
``/server_info``: a gateway falls back to ``/get_server_info``. The engine's data URL would be
grpc://...; the fake serves only this HTTP surface.
"""

from __future__ import annotations

import json
import time
from typing import Any

from smgrl.fake import generate
from smgrl.fake.base import BaseEngine, Reply, Routes, bearer, routes
from smgrl.fake.checkpoint import derived_digest
from smgrl.fake.http import Request, Response, empty_response, json_response
from smgrl.fake.tokenspeed_info import model_info_full, models_list, server_info

PAUSE_MODES = ("wait", "abort", "keep")
MEMORY_TAGS = ("weights", "kv_cache")
SIDECAR_PATHS = frozenset(
    {"/get_server_info", "/get_model_info", "/health", "/health_check", "/generate", "/v1/models"}
)
_NOT_IMPLEMENTED = "{op} is not implemented by this build's scheduler; supported sources: distributed"


def fail(status: int, message: str) -> Reply:
    return Reply(json_response({"success": False, "message": message}, status))


class TokenSpeedEngine(BaseEngine):
    kind = "tokenspeed"
    version = "0.1.1"
    data_paths = frozenset({"/generate"})
    probe_paths = frozenset({"/health", "/health_check", "/health_generate", "/get_server_info",
                             "/get_model_info", "/model_info", "/v1/models", "/v1/loads"})  # fmt: skip

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.start_time = time.time()
        self._release_paused = False

    # -- envelopes -----------------------------------------------------------------------------
    def authorize(self, req: Request) -> Response | None:
        key = self.config.api_key
        if key is None or req.path in SIDECAR_PATHS:
            return None
        if bearer(req) != key:
            return json_response({"success": False, "message": "unauthorized"}, 401)
        return None

    def body(self, req: Request, *, required: bool) -> dict[str, Any]:
        if not req.body:
            if required:
                raise fail(400, "Invalid request: a JSON object body is required")
            return {}
        try:
            obj = json.loads(req.body)
        except ValueError as exc:
            raise fail(400, f"Invalid request: {exc}") from None
        if not isinstance(obj, dict):
            raise fail(400, "Invalid request: the body must be a JSON object")
        return obj

    @staticmethod
    def need(obj: dict[str, Any], *names: str) -> list[Any]:
        missing = [n for n in names if n not in obj]
        if missing:
            raise fail(400, f"Invalid request: {missing[0]!r}")  # KeyError text, as observed
        return [obj[n] for n in names]

    # -- routes --------------------------------------------------------------------------------
    def build_routes(self) -> Routes:
        return routes(
            ("/pause_generation", "POST", self.pause_generation),
            ("/continue_generation", "POST", self.continue_generation),
            # A route table shaped like the other fakes': each engine's own routes and methods.
            ("/update_weights_from_disk", "POST", self.not_implemented),
            ("/update_weights_from_tensor", "POST", self.not_implemented),
            ("/update_weights_from_mooncake", "POST", self.not_implemented),
            ("/init_weights_update_group", "POST", self.init_weights_update_group),
            ("/update_weights_from_distributed", "POST", self.update_weights_from_distributed),
            ("/destroy_weights_update_group", "POST", self.destroy_weights_update_group),
            ("/flush_cache", "GET,POST", self.flush_cache),
            ("/abort_request", "POST", self.abort_request),
            ("/release_memory_occupation", "POST", self.release_memory_occupation),
            ("/resume_memory_occupation", "POST", self.resume_memory_occupation),
            ("/get_weight_version", "GET", self.get_weight_version),
            ("/update_weight_version", "POST", self.update_weight_version),
            ("/model_info", "GET", self.model_info),
            ("/health_generate", "GET", self.health_generate),
            ("/v1/loads", "GET", self.loads),
            # sidecar
            ("/get_server_info", "GET", self.get_server_info),
            ("/get_model_info", "GET", self.get_model_info),
            ("/health", "GET", self.health),
            ("/health_check", "GET", self.health_generate),
            ("/generate", "POST", self.generate),
            ("/v1/models", "GET", self.models),
        )

    async def pause_generation(self, req: Request) -> Response:
        mode = self.body(req, required=False).get("mode", "wait")
        if mode not in PAUSE_MODES:
            raise fail(400, f"invalid pause mode: {mode!r} (supported: wait, abort, keep)")
        await self.pause_scheduler(mode)
        return json_response({"success": True, "message": "Paused generation.", "mode": mode})

    async def continue_generation(self, req: Request) -> Response:
        self.resume_scheduler()
        return json_response({"success": True, "message": "Continued generation."})

    async def not_implemented(self, req: Request) -> Response:
        # Refused before the body is even read.
        op = req.path.lstrip("/")
        return json_response({"success": False, "message": _NOT_IMPLEMENTED.format(op=op)}, 501)

    async def init_weights_update_group(self, req: Request) -> Response:
        obj = self.body(req, required=True)
        address, port, offset, world = self.need(
            obj, "master_address", "master_port", "rank_offset", "world_size"
        )
        info = {"master_address": address, "master_port": port, "rank_offset": offset, "world_size": world,
                "backend": obj.get("backend", "nccl")}  # fmt: skip
        group = obj.get("group_name", "weight_update_group")
        try:
            await self.transfers.init_group(group, info)
        except Exception as exc:  # noqa: BLE001 - engine exceptions are 500s in the control app
            raise fail(500, f"Failed to initialize custom process group: {exc}") from None
        return json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def update_weights_from_distributed(self, req: Request) -> Response:
        obj = self.body(req, required=True)
        names, dtypes, shapes = self.need(obj, "names", "dtypes", "shapes")
        if not all(isinstance(v, list) for v in (names, dtypes, shapes)):
            raise fail(400, "Invalid request: names, dtypes and shapes must be lists")
        if not len(names) == len(dtypes) == len(shapes):
            raise fail(400, "Invalid request: names, dtypes and shapes must have the same length")
        group = obj.get("group_name", "weight_update_group")
        version = obj.get("weight_version")
        if group not in self.transfers.groups:
            raise fail(
                400, f"Failed to update parameter online: weight update group {group!r} is not initialized"
            )
        sums = await self.transfers.receive(
            group, names, dtypes, shapes, corrupt=self.knobs.corrupt_transfers, weight_version=version
        )
        self.install_weights(derived_digest(self.weights_digest, names, dtypes, shapes, sums))
        if obj.get("flush_cache", False) and not self.scheduler.jobs:
            self.scheduler.flush_cache()
        message = "Succeeded to update parameter online."
        if version is not None:
            self.weight_version = str(version)
            message += f" Weight version updated to {version}."
        self.changed.notify()
        return json_response({"success": True, "message": message})

    async def destroy_weights_update_group(self, req: Request) -> Response:
        group = self.body(req, required=False).get("group_name", "weight_update_group")
        await self.transfers.destroy_group(group)
        return json_response({"success": True, "message": "Succeeded to destroy custom process group."})

    async def flush_cache(self, req: Request) -> Response:
        # The scheduler may refuse (requests running) but the route reports success anyway.
        if not self.scheduler.running():
            self.scheduler.flush_cache()
        return json_response({"success": True, "message": "Cache flushed."})

    async def abort_request(self, req: Request) -> Response:
        obj = self.body(req, required=True)
        if obj.get("abort_all"):
            # Implemented as pause(abort) + resume: it also un-pauses a paused engine.
            await self.pause_scheduler("abort")
            self.resume_scheduler()
        elif "rid" in obj:
            self.scheduler.abort([j for j in self.scheduler.jobs.values() if j.rid == obj["rid"]])
        return json_response({"success": True})

    def _tags(self, req: Request) -> list[str]:
        tags = self.body(req, required=False).get("tags") or list(MEMORY_TAGS)
        if not isinstance(tags, list) or any(t not in MEMORY_TAGS for t in tags):
            raise fail(400, f"Invalid request: tags must be a subset of {list(MEMORY_TAGS)}")
        return tags

    async def release_memory_occupation(self, req: Request) -> Response:
        tags = self._tags(req)
        if any(t in self.released_tags for t in tags):
            raise fail(400, f"Memory for {tags} is already released")
        if self.paused is None:
            # Release drains through a pause first; resume_memory_occupation lifts it.
            await self.pause_scheduler("wait")
            self._release_paused = True
        self.release_memory(tags, "released")
        return json_response({"success": True, "message": f"Released memory occupation: {tags}"})

    async def resume_memory_occupation(self, req: Request) -> Response:
        tags = self._tags(req)
        if any(t not in self.released_tags for t in tags):
            raise fail(400, f"Memory for {[t for t in tags if t not in self.released_tags]} is not released")
        self.resume_memory(tags, restore=False)
        if not self.released_tags and self._release_paused:
            self._release_paused = False
            self.resume_scheduler()
        self.changed.notify()
        return json_response({"success": True, "message": f"Resumed memory occupation: {tags}"})

    async def get_weight_version(self, req: Request) -> Response:
        return json_response({"weight_version": self.weight_version})

    async def update_weight_version(self, req: Request) -> Response:
        (version,) = self.need(self.body(req, required=True), "new_version")
        version = str(version)
        self.weight_version = version
        self.changed.notify()
        return json_response(
            {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        )

    async def model_info(self, req: Request) -> Response:
        return json_response({"model_path": self.model_path, "weight_version": self.weight_version})

    async def health_generate(self, req: Request) -> Response:
        return json_response({"status": "ok"})  # constant: not a real probe

    async def loads(self, req: Request) -> Response:
        dp = self.config.dp_size
        jobs = list(self.scheduler.jobs.values())
        rows = []
        for rank in range(dp):
            mine = jobs[rank::dp]
            tokens = sum(len(j.prompt_ids) + len(j.output_ids) for j in mine)
            rows.append({"dp_rank": rank, "num_reqs": len(mine),
                         "num_waiting_reqs": sum(1 for j in mine if not j.started), "num_pages": -(-tokens // 16)})  # fmt: skip
        return json_response({"loads": rows})

    async def get_server_info(self, req: Request) -> Response:
        return json_response(server_info(self))

    async def get_model_info(self, req: Request) -> Response:
        return json_response(model_info_full(self))

    async def health(self, req: Request) -> Response:
        return empty_response(200)

    async def generate(self, req: Request) -> Response:
        return await generate.sglang_generate(self, req)

    async def models(self, req: Request) -> Response:
        return json_response(models_list(self))

    def extra_state(self) -> dict[str, Any]:
        return {"control_url": self.url}

"""Fake vLLM 0.33.0 OpenAI server in dev mode (docs/engines.md, vLLM).

* ``/pause`` takes **query** params; abort/wait pauses make new inference requests fail 503,
  ``keep`` freezes in-flight requests and queues new ones.
* Sleep/wake per tag; ``/is_sleeping`` is true when merely paused.
* The weight-transfer session (init -> start -> update* -> finish) answers 500 on misuse.
* A disk refit is ``/collective_rpc {"method": "reload_weights", "kwargs": {"weights_path"}}``.
* ``/v1/models`` always shows the startup model; ``/server_info`` is 404 unless enabled
  (``vllm_server_info``), so a gateway takes its vLLM discovery path.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from smgrl.core.numbers import parse_uint
from smgrl.fake import body as b
from smgrl.fake import openai
from smgrl.fake.base import BaseEngine, Reply, Routes, bearer, routes
from smgrl.fake.checkpoint import CheckpointNotFound, derived_digest
from smgrl.fake.http import Request, Response, empty_response, json_response
from smgrl.fake.vllm_info import inference_generate, models_list, server_info, weight_checker

PAUSE_MODES = ("abort", "wait", "keep")
SLEEP_TAGS = ("weights", "kv_cache")
_GROUP = "vllm-weight-transfer"
_AUTH_PREFIXES = ("/v1", "/v2", "/inference", "/cohere")


def _truthy(value: str | None, default: bool) -> bool | None:
    if value is None:
        return default
    low = value.lower()
    if low in ("true", "1", "yes", "on"):
        return True
    if low in ("false", "0", "no", "off"):
        return False
    return None


class VLLMEngine(BaseEngine):
    kind = "vllm"
    version = "0.33.0"
    data_paths = frozenset({"/v1/completions", "/v1/chat/completions", "/inference/v1/generate"})
    probe_paths = frozenset({"/health", "/v1/models", "/version", "/load", "/server_info", "/metrics"})

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.sleep_level: int | None = None
        self.transfer_ready = False
        self.update_active = False
        self._last_meta: tuple[list, list, list] = ([], [], [])
        self._weights_discarded = False

    # -- envelopes -----------------------------------------------------------------------------
    def authorize(self, req: Request) -> Response | None:
        key = self.config.api_key
        if key is not None and req.path.startswith(_AUTH_PREFIXES) and bearer(req) != key:
            return json_response({"error": "Unauthorized"}, 401)
        return None

    def error(self, status: int, message: str, type: str) -> Reply:
        return Reply(self.openai_error(status, message, type))

    def validation(self, errors: list[dict[str, Any]]) -> Reply:
        return self.error(400, b.pydantic_text(errors), "Bad Request")

    def json_object(self, req: Request, spec: b.Spec) -> dict[str, Any]:
        obj, error = b.decode_object(req.body, req.header("content-type"))
        if error:
            raise self.validation([error])
        values, errors = b.check(obj, spec)
        if errors:
            raise self.validation(errors)
        return values

    def serves_model(self, name: str) -> bool:
        return name in (self.startup_served_model_name, self.startup_model_path)

    # -- admission -----------------------------------------------------------------------------
    def precheck_admission(self) -> None:
        if self.paused in ("abort", "wait"):
            message = "The engine is paused; retry the request after it resumes."
            raise self.error(503, message, "ServiceUnavailableError")

    @contextlib.asynccontextmanager
    async def admission(self) -> AsyncIterator[None]:
        # keep-paused: the request is accepted and queued until /resume.
        await self.wait_until(lambda: self.paused is None)
        yield

    # -- routes --------------------------------------------------------------------------------
    def build_routes(self) -> Routes:
        # Route tables (here and in the other fakes) share a shape, not content: each engine's own routes.
        always = [
            ("/health", "GET", self.health),
            ("/load", "GET", self.load),
            ("/version", "GET", self.version_route),
            ("/v1/models", "GET", self.models),
            ("/ping", "GET,POST", self.health),
            ("/v1/completions", "POST", self.completions),
            ("/v1/chat/completions", "POST", self.chat),
            ("/inference/v1/generate", "POST", self.inference_generate),
            ("/inference/v1/abort_requests", "POST", self.inference_abort),
        ]
        dev = [
            ("/pause", "POST", self.pause),
            ("/resume", "POST", self.resume),
            ("/is_paused", "GET", self.is_paused),
            ("/abort_requests", "POST", self.abort_requests),
            ("/sleep", "POST", self.sleep),
            ("/wake_up", "POST", self.wake_up),
            ("/is_sleeping", "GET", self.is_sleeping),
            ("/release_kv_cache_memory", "POST", self.release_kv_cache_memory),
            ("/reset_prefix_cache", "POST", self.reset_prefix_cache),
            ("/reset_mm_cache", "POST", self.empty_ok),
            ("/reset_encoder_cache", "POST", self.empty_ok),
            ("/collective_rpc", "POST", self.collective_rpc),
            ("/init_weight_transfer_engine", "POST", self.init_weight_transfer_engine),
            ("/start_weight_update", "POST", self.start_weight_update),
            ("/start_draft_weight_update", "POST", self.start_weight_update),
            ("/update_weights", "POST", self.update_weights),
            ("/finish_weight_update", "POST", self.finish_weight_update),
            ("/shutdown_weight_transfer_engine", "POST", self.shutdown_weight_transfer_engine),
            ("/update_weight_version", "POST", self.update_weight_version),
            ("/weight_info", "GET", self.weight_info),
            ("/weight_checker", "POST", self.weight_checker),
            ("/get_world_size", "GET", self.get_world_size),
        ]
        if self.config.vllm_server_info:
            dev.append(("/server_info", "GET", self.server_info))
        return routes(*always, *(dev if self.config.dev_mode else []))

    async def empty_ok(self, req: Request) -> Response:
        return empty_response(200)

    async def health(self, req: Request) -> Response:
        return empty_response(200)

    async def load(self, req: Request) -> Response:
        return json_response({"server_load": self.inflight})

    async def version_route(self, req: Request) -> Response:
        return json_response({"version": self.version})

    async def models(self, req: Request) -> Response:
        return json_response(models_list(self))

    async def server_info(self, req: Request) -> Response:
        return json_response(server_info(self, req.arg("config_format", "text")))

    async def completions(self, req: Request) -> Response:
        return await openai.completions(self, req)

    async def chat(self, req: Request) -> Response:
        return await openai.chat_completions(self, req)

    async def inference_generate(self, req: Request) -> Response:
        return await inference_generate(self, req)

    async def inference_abort(self, req: Request) -> Response:
        ids = self.json_object(req, {"request_ids": (b.LIST, b.REQUIRED)})["request_ids"]
        self._abort_ids(ids)
        return empty_response(200)

    def _abort_ids(self, ids: list[Any] | None) -> int:
        jobs = list(self.scheduler.jobs.values())
        if ids is not None:
            wanted = {str(i) for i in ids}
            jobs = [j for j in jobs if j.rid in wanted or j.rid.rsplit("-", 1)[0] in wanted]
        return self.scheduler.abort(jobs)

    async def _pause(self, mode: str, clear_cache: bool) -> None:
        await self.pause_scheduler(mode)
        if clear_cache and mode in ("abort", "wait"):  # drained: nothing uses the cache now
            self.scheduler.flush_cache()

    async def pause(self, req: Request) -> Response:
        mode = req.arg("mode", "abort")
        clear = _truthy(req.arg("clear_cache"), True)
        if mode not in PAUSE_MODES:
            error = b.literal_error("mode", mode, PAUSE_MODES)
            raise self.validation([{**error, "loc": ["query", "mode"]}])
        if clear is None:
            error = {"type": "bool_parsing", "loc": ["query", "clear_cache"],
                     "msg": "Input should be a valid boolean", "input": req.arg("clear_cache")}  # fmt: skip
            raise self.validation([error])
        await self._pause(mode, clear)
        return json_response({"status": "paused"})

    async def resume(self, req: Request) -> Response:
        self.resume_scheduler()
        return json_response({"status": "resumed"})

    async def is_paused(self, req: Request) -> Response:
        return json_response({"is_paused": self.paused is not None})

    async def abort_requests(self, req: Request) -> Response:
        obj, error = b.decode_object(req.body, None)
        if error:
            return json_response({"error": "Invalid JSON format"}, 400)
        ids = obj.get("request_ids")
        if ids is not None and not isinstance(ids, list):
            return json_response({"error": "request_ids must be a list"}, 400)
        return json_response({"status": "aborted", "aborted": self._abort_ids(ids)})

    async def sleep(self, req: Request) -> Response:
        raw = req.arg("level", "1")
        mode = req.arg("mode", "abort")
        if (level := parse_uint(raw)) is None or level > 2:
            error = {"type": "less_than_equal", "loc": ["query", "level"],
                     "msg": "Input should be a valid integer between 0 and 2", "input": raw}  # fmt: skip
            raise self.validation([error])
        if mode not in PAUSE_MODES:
            raise self.validation([{**b.literal_error("mode", mode, PAUSE_MODES), "loc": ["query", "mode"]}])
        if self.sleep_level is None:  # a repeated sleep is a logged no-op
            await self._pause(mode, True)
            self.sleep_level = level
            if level >= 1:
                self._weights_discarded = level == 2
                self.release_memory(SLEEP_TAGS, "offloaded")
        return json_response({"status": "sleeping", "level": self.sleep_level})

    async def wake_up(self, req: Request) -> Response:
        tags = req.args("tags")
        # Level 2 discarded the weights: they come back uninitialised until a refit.
        self.resume_memory(tags or SLEEP_TAGS, restore=not self._weights_discarded)
        awake = not self.released_tags
        if awake and self.sleep_level is not None:
            # Fully resident again: scheduling resumes by itself.
            self.sleep_level = None
            self.resume_scheduler()
        self.changed.notify()
        return json_response({"status": "awake" if awake else "sleeping", "tags": tags or None})

    async def is_sleeping(self, req: Request) -> Response:
        return json_response({"is_sleeping": self.paused is not None or self.sleep_level is not None})

    async def release_kv_cache_memory(self, req: Request) -> Response:
        if self.paused is None or self.scheduler.jobs or self.released_tags:
            raise self.error(500, "release_kv_cache_memory needs a completed pause and resident memory.",
                             "InternalServerError")  # fmt: skip
        self.released_tags.add("kv_cache")
        self.scheduler.flush_cache()
        return json_response({"status": "kv_cache_released"})

    async def reset_prefix_cache(self, req: Request) -> Response:
        reset_running = _truthy(req.arg("reset_running_requests"), False)
        holders = self.scheduler.running()
        if holders and reset_running:
            self.scheduler.retract_all()  # preempted: recomputed when they run again
            holders = []
        if holders:
            return json_response({"success": False})
        self.scheduler.flush_cache()
        return json_response({"success": True})

    async def collective_rpc(self, req: Request) -> Response:
        args = self.json_object(req, {
            "method": (b.STR, b.REQUIRED), "args": (b.LIST, []), "kwargs": (b.DICT, {}), "timeout": (b.OPT_FLOAT, None),
        })  # fmt: skip
        workers = self.config.tp_size * self.config.pp_size
        if args["method"] != "reload_weights":
            raise self.error(
                500, f"'Worker' object has no attribute '{args['method']}'", "InternalServerError"
            )
        path = args["kwargs"].get("weights_path") or self.model_path
        try:
            checkpoint = await self.read_checkpoint(path)
        except CheckpointNotFound as exc:
            raise self.error(500, str(exc), "InternalServerError") from None
        self.install_weights(checkpoint.digest, checkpoint)
        self._weights_discarded = False
        self.scheduler.flush_cache()
        return json_response({"results": [None] * workers})

    def _session_error(self, message: str) -> Reply:
        return self.error(500, message, "InternalServerError")

    async def init_weight_transfer_engine(self, req: Request) -> Response:
        info = self.json_object(req, {"init_info": (b.DICT, b.REQUIRED)})["init_info"]
        if self.config.weight_transfer_backend is None:
            raise self._session_error("Weight transfer not configured")
        missing = [k for k in ("rank_offset", "world_size") if k not in info]
        if missing:
            raise self._session_error(f"init_info is missing {missing[0]!r}")
        try:
            await self.transfers.init_group(_GROUP, {**info, "backend": self.config.weight_transfer_backend})
        except Exception as exc:  # noqa: BLE001 - a worker RuntimeError is vLLM's 500
            raise self._session_error(str(exc)) from None
        self.transfer_ready = True
        return json_response({"message": "Weight transfer initialized"})

    async def start_weight_update(self, req: Request) -> Response:
        if not self.transfer_ready:
            raise self._session_error("Weight transfer engine is not initialized")
        if self.update_active:
            raise self._session_error("A weight update is already in progress")
        self.update_active = True
        draft = req.path == "/start_draft_weight_update"
        return json_response({"message": "Draft weight update started" if draft else "Weight update started"})

    async def update_weights(self, req: Request) -> Response:
        info = self.json_object(req, {"update_info": ((dict, list), b.REQUIRED)})["update_info"]
        if not self.update_active:
            raise self._session_error("No weight update in progress; call /start_weight_update first")
        if isinstance(info, list):
            info = info[0] if info else {}
        names, dtypes, shapes = (
            (info.get("names") or []),
            (info.get("dtype_names") or []),
            (info.get("shapes") or []),
        )
        if not (names or dtypes or shapes):
            names, dtypes, shapes = self._last_meta  # empty = reuse the previous round's metadata
        if not len(names) == len(dtypes) == len(shapes):
            self.update_active = False  # an error resets the session
            raise self._session_error("names, dtype_names and shapes must have the same length")
        self._last_meta = (names, dtypes, shapes)
        sums = await self.transfers.receive(
            _GROUP, names, dtypes, shapes, corrupt=self.knobs.corrupt_transfers
        )
        self.install_weights(derived_digest(self.weights_digest, names, dtypes, shapes, sums))
        self._weights_discarded = False
        return json_response({"message": "Weights updated"})

    async def finish_weight_update(self, req: Request) -> Response:
        version = None
        if req.body:
            version = self.json_object(req, {"weight_version": (b.OPT_STR, None)})["weight_version"]
        if not self.update_active:
            raise self._session_error("No weight update in progress; call /start_weight_update first")
        self.update_active = False
        if version is not None:
            self.weight_version = version
        self.changed.notify()
        return json_response({"message": "Weight update finished"})

    async def shutdown_weight_transfer_engine(self, req: Request) -> Response:
        if self.update_active:
            raise self._session_error("Cannot shut down the weight transfer engine during an active update")
        await self.transfers.destroy_group(_GROUP)
        self.transfer_ready = False
        return json_response({"message": "Weight transfer shut down"})

    async def update_weight_version(self, req: Request) -> Response:
        version = self.json_object(req, {"new_version": (b.STR, b.REQUIRED)})["new_version"]
        self.weight_version = version
        self.changed.notify()
        return json_response({"success": True, "new_version": version})

    async def weight_info(self, req: Request) -> Response:
        return json_response({"weight_version": self.weight_version})

    async def weight_checker(self, req: Request) -> Response:
        args = self.json_object(req, {"action": (b.STR, b.REQUIRED), "baseline": (b.OPT_DICT, None)})
        return weight_checker(self, args)

    async def get_world_size(self, req: Request) -> Response:
        c = self.config
        include_dp = _truthy(req.arg("include_dp"), True)
        return json_response({"world_size": c.tp_size * c.pp_size * (c.dp_size if include_dp else 1)})

    def extra_state(self) -> dict[str, Any]:
        return {
            "sleep_level": self.sleep_level,
            "transfer_ready": self.transfer_ready,
            "update_active": self.update_active,
        }

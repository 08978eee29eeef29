"""Fake SGLang 0.5.23 HTTP server (engines.md §1): control plane, discovery and inference.

Models the tokenizer-manager rules that matter to a gateway:

* ``is_pause``: while paused (any mode) new generations block before admission.
* ``model_update_lock``: each generation holds a reader lock; a refit takes the writer lock
  unless the engine is paused, so an un-paused refit waits for in-flight generations.
* pause modes: ``abort`` aborts until no generation holds the lock; ``retract`` freezes the
  scheduler and moves running requests to the waiting queue; ``in_place`` freezes everything.
* ``flush_cache`` is refused while requests run (waiting ones are ignored while paused), and a
  refit with ``flush_cache=true`` can answer 400 after it already replaced the weights.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

from smgrl.fake import body as b
from smgrl.fake import generate, openai
from smgrl.fake.base import BaseEngine, Reply, Routes, bearer, routes
from smgrl.fake.checkpoint import CheckpointNotFound, derived_digest
from smgrl.fake.http import Request, Response, empty_response, json_response, text_response
from smgrl.fake.sglang_info import loads, model_info, models_list, server_info
from smgrl.fake.sync import RWLock

PAUSE_MODES = ("abort", "retract", "in_place")
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
FLUSH_REFUSED_AFTER_LOAD = (
    "Weights were updated, but the cache was not flushed because requests are running or "
    "waiting. Pause generation (mode 'retract' or 'abort') first, or pass flush_cache=false "
    "and then call /flush_cache."
)
SESSION_REQUIRED = "{op} must run between begin_weight_update() and end_weight_update()."


class SGLangEngine(BaseEngine):
    kind = "sglang"
    version = "0.5.23"
    data_paths = frozenset({"/generate", "/v1/completions", "/v1/chat/completions"})
    probe_paths = frozenset(
        {
            "/health",
            "/health_generate",
            "/ready",
            "/v1/models",
            "/server_info",
            "/get_server_info",
            "/model_info",
            "/get_model_info",
            "/v1/loads",
            "/metrics",
        }
    )

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lock = RWLock(changed=self.changed)
        self.weight_session = False
        self._flush_pending = False
        self._saved_digest: str | None = None
        self.load_format = "auto"
        self.created = int(time.time())

    # -- envelopes -----------------------------------------------------------------------------
    def authorize(self, req: Request) -> Response | None:
        key = self.config.api_key
        if key is None or req.path.startswith(("/health", "/metrics")):
            return None
        if bearer(req) != key:
            return json_response({"error": "Unauthorized"}, 401)
        return None

    def not_found(self, req: Request) -> Response:
        if req.path.startswith("/v1/models/") and req.method in ("GET", "HEAD"):
            return models_list(self, card=req.path.removeprefix("/v1/models/"))
        return json_response({"detail": "Not Found"}, 404)

    def method_not_allowed(self, allowed: list[str]) -> Response:
        return json_response({"detail": "Method Not Allowed"}, 405, [("allow", ", ".join(allowed))])

    def struct(self, req: Request, spec: b.Spec) -> dict[str, Any]:
        """Parse a msgspec-Struct body: required, JSON object, typed; else the 400 envelope."""
        obj, error = b.decode_object(req.body, req.header("content-type"))
        errors = [error] if error else []
        values: dict[str, Any] = {}
        if obj is not None:
            values, errors = b.check(obj, spec)
        if errors:
            raise Reply(self.validation_error(errors))
        return values

    def validation_error(self, errors: list[dict[str, Any]]) -> Response:
        message = b.pydantic_text(errors)
        return json_response(
            {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}, 400
        )

    def _dp(self, message: str) -> str:
        # With dp_size > 1 every DP rank answers and the messages are joined.
        return " | ".join([message] * self.config.dp_size)

    def _assert_dp1(self) -> None:
        # `assert dp_size == 1` in the tokenizer manager, not caught by the handler: a 500.
        if self.config.dp_size != 1:
            raise Reply(text_response("Internal Server Error", 500))

    def openai_error(
        self, status: int, message: str, type: str = "BadRequestError", param: str | None = None
    ) -> Response:
        error = {"object": "error", "message": message, "type": type, "param": param, "code": status}
        return json_response(error, status)

    def openai_choice(self, choice: dict[str, Any], job: Any) -> dict[str, Any]:
        matched = job.finish.get("matched") if job.finish else None
        return {**choice, "matched_stop": matched}

    def openai_extras(self, payload: dict[str, Any], jobs: list[Any]) -> dict[str, Any]:
        # SGLang's meta extension: the version that produced the (last) tokens.
        version = next((j.weight_version for j in reversed(jobs) if j.weight_version), self.weight_version)
        return {**payload, "metadata": {"weight_version": version}}

    # -- generation admission ------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def admission(self) -> AsyncIterator[None]:
        # is_pause: new requests wait (they are not rejected) until continue_generation.
        await self.wait_until(lambda: self.paused is None)
        await self.lock.acquire_read()
        try:
            yield
        finally:
            self.lock.release_read()

    def can_flush(self) -> bool:
        if self.paused is not None:
            # While paused the idle check ignores the waiting queue (retracted requests).
            return not self.scheduler.running()
        return not self.scheduler.jobs

    async def _weights_op(self, abort_all: bool, op):
        if abort_all:
            self.scheduler.abort_all()
        if self.paused is not None:
            # Paused: the tokenizer manager skips the writer lock (in-place requests keep theirs).
            return await op()
        await self.lock.acquire_write()
        try:
            return await op()
        finally:
            self.lock.release_write()

    def _after_load(self, flush: bool) -> tuple[bool, str | None]:
        if not flush:
            return True, None
        if not self.can_flush():
            return False, FLUSH_REFUSED_AFTER_LOAD
        self.scheduler.flush_cache()
        return True, None

    def _require_session(self, op: str) -> None:
        if self.config.require_weight_session and not self.weight_session:
            raise Reply(json_response({"success": False, "message": SESSION_REQUIRED.format(op=op)}, 400))

    # -- routes --------------------------------------------------------------------------------
    def build_routes(self) -> Routes:
        return routes(
            ("/health", "GET", self.health),
            ("/health_generate", "GET", self.health),
            ("/ready", "GET", self.ready),
            ("/server_info", "GET", self.server_info),
            ("/get_server_info", "GET", self.server_info),
            ("/model_info", "GET", self.model_info),
            ("/get_model_info", "GET", self.model_info),
            ("/v1/models", "GET", self.models),
            ("/v1/loads", "GET", self.loads),
            ("/generate", "POST,PUT", self.generate),
            ("/v1/completions", "POST", self.completions),
            ("/v1/chat/completions", "POST", self.chat),
            ("/pause_generation", "POST", self.pause_generation),
            ("/continue_generation", "POST", self.continue_generation),
            ("/update_weights_from_disk", "POST", self.update_weights_from_disk),
            ("/update_weights_from_tensor", "POST", self.update_weights_from_tensor),
            ("/update_weights_from_distributed", "POST", self.update_weights_from_distributed),
            ("/init_weights_update_group", "POST", self.init_weights_update_group),
            ("/destroy_weights_update_group", "POST", self.destroy_weights_update_group),
            ("/begin_weight_update", "POST", self.begin_weight_update),
            ("/end_weight_update", "POST", self.end_weight_update),
            ("/update_weight_version", "POST", self.update_weight_version),
            ("/flush_cache", "GET,POST", self.flush_cache),
            ("/abort_request", "POST", self.abort_request),
            ("/release_memory_occupation", "GET,POST", self.release_memory_occupation),
            ("/resume_memory_occupation", "GET,POST", self.resume_memory_occupation),
        )

    async def health(self, req: Request) -> Response:
        # Health runs a 1-token generation that blocks on the pause gate (20 s timeout).
        if self.paused is not None:
            ok = await self.wait_until(lambda: self.paused is None, self.config.health_check_timeout_s)
            if not ok:
                self.healthy = False
                return empty_response(503)
        self.healthy = True
        return empty_response(200)

    async def ready(self, req: Request) -> Response:
        return empty_response(200 if self.paused is None and self.healthy else 503)

    async def server_info(self, req: Request) -> Response:
        return json_response(server_info(self))

    async def model_info(self, req: Request) -> Response:
        return json_response(model_info(self))

    async def models(self, req: Request) -> Response:
        return models_list(self)

    async def loads(self, req: Request) -> Response:
        return loads(self, req)

    async def generate(self, req: Request) -> Response:
        return await generate.sglang_generate(self, req)

    async def completions(self, req: Request) -> Response:
        return await openai.completions(self, req)

    async def chat(self, req: Request) -> Response:
        return await openai.chat_completions(self, req)

    async def pause_generation(self, req: Request) -> Response:
        mode = self.struct(req, {"mode": (b.STR, "abort")})["mode"]
        if mode not in PAUSE_MODES:
            raise Reply(self.validation_error([b.literal_error("mode", mode, PAUSE_MODES)]))
        self.paused = mode
        self.changed.notify()
        if mode == "abort":
            # Abort everything until no generation holds the reader lock; the scheduler itself
            # keeps running. Waiting on state changes replaces SGLang's 1 s polling.
            while self.lock.readers:
                self.scheduler.abort_all()
                await self.changed.wait()
        else:
            self.scheduler.set_frozen(True)
            if mode == "retract":
                self.scheduler.retract_all()
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, req: Request) -> Response:
        self.struct(req, {"torch_empty_cache": (b.BOOL, True)})
        self.paused = None
        self.scheduler.set_frozen(False)
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weights_from_disk(self, req: Request) -> Response:
        args = self.struct(req, {
            "model_path": (b.STR, b.REQUIRED), "load_format": (b.OPT_STR, None),
            "abort_all_requests": (b.BOOL, False), "weight_version": (b.OPT_STR, None),
            "flush_cache": (b.BOOL, True), "torch_empty_cache": (b.BOOL, False),
            "recapture_cuda_graph": (b.BOOL, False),
        })  # fmt: skip
        path = args["model_path"]

        async def load() -> tuple[bool, str]:
            try:
                checkpoint = await self.read_checkpoint(path)
            except CheckpointNotFound as exc:
                return False, f"Failed to get weights iterator: {exc}."
            self.install_weights(checkpoint.digest, checkpoint)
            flushed, refusal = self._after_load(args["flush_cache"])
            if not flushed:
                return False, refusal
            return True, "Succeeded to update model weights."

        ok, message = await self._weights_op(args["abort_all_requests"], load)
        if ok:
            # Only a successful load renames the model (and so the /v1/models id).
            self.model_path = path
            self.served_model_name = path
            if args["load_format"] is not None:
                self.load_format = args["load_format"]
        return self._weights_answer(ok, message, args["weight_version"], disk=True)

    def _weights_answer(self, ok: bool, message: str, version: str | None, disk: bool = False) -> Response:
        if ok and version is not None:
            # Recorded only when given AND the update succeeded.
            self.weight_version = version
            message += f" Weight version updated to {version}."
        payload: dict[str, Any] = {"success": ok, "message": self._dp(message)}
        if disk:
            paused = len(self.scheduler.waiting())
            payload["num_paused_requests"] = (
                [paused] * self.config.dp_size if self.config.dp_size > 1 else paused
            )
        self.changed.notify()
        return json_response(payload, 200 if ok else 400)

    async def update_weights_from_tensor(self, req: Request) -> Response:
        args = self.struct(req, {
            "serialized_named_tensors": (b.LIST, b.REQUIRED), "load_format": (b.OPT_STR, None),
            "flush_cache": (b.BOOL, True), "abort_all_requests": (b.BOOL, False),
            "weight_version": (b.OPT_STR, None), "selector": (b.STR, "all"),
        })  # fmt: skip
        self._assert_dp1()
        self._require_session("update_weights_from_tensor")

        async def load() -> tuple[bool, str]:
            self.install_weights(derived_digest(self.weights_digest, args["serialized_named_tensors"]))
            flushed, refusal = self._after_load(args["flush_cache"])
            return (True, "Success") if flushed else (False, refusal)

        ok, message = await self._weights_op(args["abort_all_requests"], load)
        return self._weights_answer(ok, message, args["weight_version"])

    async def update_weights_from_distributed(self, req: Request) -> Response:
        args = self.struct(req, {
            "names": (b.LIST, b.REQUIRED), "dtypes": (b.LIST, b.REQUIRED), "shapes": (b.LIST, b.REQUIRED),
            "group_name": (b.STR, "weight_update_group"), "flush_cache": (b.BOOL, True),
            "abort_all_requests": (b.BOOL, False), "weight_version": (b.OPT_STR, None),
            "load_format": (b.OPT_STR, None), "selector": (b.STR, "all"),
        })  # fmt: skip
        self._assert_dp1()
        self._require_session("update_weights_from_distributed")
        names, dtypes, shapes, group = args["names"], args["dtypes"], args["shapes"], args["group_name"]

        async def load() -> tuple[bool, str]:
            if not len(names) == len(dtypes) == len(shapes):
                return False, "names, dtypes and shapes must have the same length."
            if group not in self.transfers.groups:
                return False, (
                    f"Failed to update parameter online: '{group}'. The full weights of the "
                    "ModelRunner are partially updated. Please discard the whole weights."
                )
            sums = await self.transfers.receive(
                group, names, dtypes, shapes, weight_version=args["weight_version"]
            )
            self.install_weights(derived_digest(self.weights_digest, names, dtypes, shapes, sums))
            flushed, refusal = self._after_load(args["flush_cache"])
            return (True, "Succeeded to update parameter online.") if flushed else (False, refusal)

        ok, message = await self._weights_op(args["abort_all_requests"], load)
        return self._weights_answer(ok, message, args["weight_version"])

    async def init_weights_update_group(self, req: Request) -> Response:
        args = self.struct(req, {
            "master_address": (b.STR, b.REQUIRED), "master_port": (b.INT, b.REQUIRED),
            "rank_offset": (b.INT, b.REQUIRED), "world_size": (b.INT, b.REQUIRED),
            "group_name": (b.STR, "weight_update_group"), "backend": (b.STR, "nccl"),
        })  # fmt: skip
        self._assert_dp1()
        try:
            await self.transfers.init_group(args["group_name"], args)
        except Exception as exc:
            message = f"Failed to initialize custom process group: {exc}."
            return json_response({"success": False, "message": message}, 400)
        return json_response({"success": True, "message": "Succeeded to initialize custom process group."})

    async def destroy_weights_update_group(self, req: Request) -> Response:
        args = self.struct(req, {"group_name": (b.STR, "weight_update_group")})
        self._assert_dp1()
        if not await self.transfers.destroy_group(args["group_name"]):
            return json_response(
                {"success": False, "message": "The group to be destroyed does not exist."}, 400
            )
        return json_response({"success": True, "message": "Succeeded to destroy custom process group."})

    async def begin_weight_update(self, req: Request) -> Response:
        self.struct(req, {"selector": (b.STR, "all")})
        if self.weight_session:
            message = "A weight update session is already in progress; call end_weight_update() first."
            return json_response({"success": False, "message": message}, 400)
        self.weight_session = True
        return json_response({"success": True, "message": "Success"})

    async def end_weight_update(self, req: Request) -> Response:
        self.struct(req, {})
        if not self.weight_session:
            message = "No weight update session in progress; call begin_weight_update() first."
            return json_response({"success": False, "message": message}, 400)
        self.weight_session = False
        return json_response({"success": True, "message": "Success"})

    async def update_weight_version(self, req: Request) -> Response:
        args = self.struct(req, {"new_version": (b.STR, b.REQUIRED), "abort_all_requests": (b.BOOL, True)})
        if args["abort_all_requests"]:
            self.scheduler.abort_all()
        version = args["new_version"]
        self.weight_version = version
        self.changed.notify()
        return json_response(
            {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        )

    async def flush_cache(self, req: Request) -> Response:
        raw = req.arg("timeout", "0")
        try:
            timeout = float(raw)
        except ValueError:
            timeout = -1.0
        if not timeout >= 0:
            error = {"type": "greater_than_equal", "loc": ["query", "timeout"],
                     "msg": "Input should be greater than or equal to 0", "input": raw}  # fmt: skip
            return self.validation_error([error])
        if self._flush_pending:
            return text_response("Another flush_cache is already in progress.", 400)
        if self.can_flush():
            self.scheduler.flush_cache()
            return text_response(FLUSH_OK)
        if timeout <= 0:
            return text_response("Flush cache failed.\n", 400)
        # Deferred: one pending flush at a time, retried until idle or the deadline.
        self._flush_pending = True
        try:
            idle = await self.wait_until(self.can_flush, timeout)
        finally:
            self._flush_pending = False
        if not idle:
            return text_response("Timed out waiting for idle state.", 400)
        self.scheduler.flush_cache()
        return text_response(FLUSH_OK)

    async def abort_request(self, req: Request) -> Response:
        args = self.struct(req, {
            "rid": (b.STR, ""), "abort_all": (b.BOOL, False),
            "finished_reason": (b.OPT_DICT, None), "abort_message": (b.OPT_STR, None),
        })  # fmt: skip
        jobs = list(self.scheduler.jobs.values())
        if not args["abort_all"]:
            prefix = args["rid"]
            jobs = [j for j in jobs if prefix and j.rid.startswith(prefix)]
        self.scheduler.abort(jobs, args["abort_message"], args["finished_reason"])
        return empty_response(200)

    def _tags(self, req: Request) -> list[str]:
        tags = self.struct(req, {"tags": (b.OPT_LIST, None)})["tags"]
        return list(tags) if tags else list(MEMORY_TAGS)

    async def release_memory_occupation(self, req: Request) -> Response:
        tags = self._tags(req)
        busy = self.paused is None and bool(self.scheduler.jobs)
        if busy or any(t not in MEMORY_TAGS or t in self.released_tags for t in tags):
            # An assert inside the scheduler process: a real engine most likely dies here.
            raise Reply(text_response("Internal Server Error", 500))
        self.released_tags.update(tags)
        if "weights" in tags:
            self._saved_digest = self.weights_digest
            self.scheduler.load(derived_digest(self.weights_digest, "released"))
        if "kv_cache" in tags:
            self.scheduler.flush_cache()
        self.changed.notify()
        return json_response(None)

    async def resume_memory_occupation(self, req: Request) -> Response:
        tags = self._tags(req)
        if any(t not in self.released_tags for t in tags):
            # set.remove -> KeyError in the scheduler: same caveat as above.
            raise Reply(text_response("Internal Server Error", 500))
        self.released_tags.difference_update(tags)
        if "weights" in tags and self._saved_digest is not None:
            saved, self._saved_digest = self._saved_digest, None
            # Without a CPU backup the weight memory comes back uninitialised: refit next.
            backup = self.config.enable_weights_cpu_backup
            self.scheduler.load(saved if backup else derived_digest(saved, "uninitialized"))
        self.changed.notify()
        return json_response(None)

    def extra_state(self) -> dict[str, Any]:
        return {"weight_session": self.weight_session, "readers": self.lock.readers}

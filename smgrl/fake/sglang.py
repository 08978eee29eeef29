"""Fake SGLang 0.5.23 HTTP server (docs/engines.md): control plane, discovery and inference.

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
from smgrl.fake.http import Request, Response, empty_response, json_response, text_response
from smgrl.fake.sglang_info import loads, model_info, models_list, server_info
from smgrl.fake.sglang_weights import SGLangWeights
from smgrl.fake.sync import RWLock

PAUSE_MODES = ("abort", "retract", "in_place")
FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


class SGLangEngine(SGLangWeights, BaseEngine):
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
        self.load_format = "auto"
        # /server_info's startup_time: set once per process start, so a restart changes it (the
        # recovered-engine rule reads it; smgrl.core.identity).
        self.created = time.time()

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
        return super().not_found(req)

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
            # A route table shaped like the other fakes': each engine's own routes and methods.
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
            ("/weights_checker", "GET,POST", self.weights_checker),
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

    def extra_state(self) -> dict[str, Any]:
        return {"weight_session": self.weight_session, "readers": self.lock.readers}

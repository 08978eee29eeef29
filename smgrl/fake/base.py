"""What every fake engine flavour shares: config, state, the call log, knobs and dispatch.

A flavour (SGLang, vLLM, TokenSpeed) subclasses :class:`BaseEngine`, fills ``routes`` and
decides its envelopes (404/405/auth). Request path through :meth:`BaseEngine.handle`:
``/_fake/*`` -> fake surface; otherwise record the call, apply the knobs (hang, latency,
redirect, forced status, huge body), authorize, route, and turn a :class:`Reply` raised
anywhere below into its response.
"""

from __future__ import annotations

import collections
import contextlib
import math
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ClassVar

import attrs
import trio

from smgrl.fake import knobs as knobs_mod
from smgrl.fake.checkpoint import (
    DEFAULT_MODEL_NAME,
    Checkpoint,
    CheckpointNotFound,
    default_checkpoint,
    derived_digest,
    load_checkpoint,
    startup_checkpoint,
)
from smgrl.fake.http import HANG, HttpServer, Request, Response, json_response, text_response
from smgrl.fake.knobs import Knobs, RecordedCall
from smgrl.fake.scheduler import Job, Scheduler
from smgrl.fake.sync import Gauge
from smgrl.fake.transfer import WeightTransfers

Route = Callable[[Request], Awaitable[Response]]
Routes = dict[str, dict[str, Route]]


@attrs.define
class EngineConfig:
    """Startup flags of one fake engine (the CLI's options map onto these)."""

    host: str = "127.0.0.1"
    port: int = 0
    model_path: str | None = None  # None: a fresh fake checkpoint in a temp dir
    served_model_name: str | None = None  # None: DEFAULT_MODEL_NAME, or model_path when given
    weight_version: str = "default"
    tp_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    ep_size: int = 1
    api_key: str | None = None  # SGLang --api-key / TokenSpeed --rl-control-api-key
    latency_ms: float = 0.0
    token_latency_ms: float = 0.0
    require_weight_session: bool = True  # SGLang 0.5.23: begin/end around distributed/tensor
    real_distributed: bool = False  # join a torch gloo group (needs torch)
    health_check_timeout_s: float = 20.0  # SGLANG_HEALTH_CHECK_TIMEOUT
    context_length: int | None = None
    stream_interval: int = 1
    # SGLang --incremental-streaming-output (TokenSpeed's shim shares it): each /generate stream
    # event carries only the tokens (ids, text, log-probs) new since the previous one.
    incremental_streaming_output: bool = False
    head_as_get: bool = True  # HEAD on a GET route answers like GET (see docs: FastAPI says 405)
    call_log_limit: int = 10_000
    enable_weights_cpu_backup: bool = False  # SGLang: weights survive release/resume
    # vLLM
    dev_mode: bool = True  # VLLM_SERVER_DEV_MODE=1
    vllm_server_info: bool = False  # serve the dev /server_info (off: 404, the gateway's vLLM path)
    weight_transfer_backend: str | None = "nccl"  # --weight-transfer-config backend
    # TokenSpeed
    advertised_host: str | None = None  # bind host shown in rl.control_url (wildcard: omitted)


class Reply(Exception):
    """Raised anywhere in a handler to answer with ``response`` at once."""

    def __init__(self, response: Response):
        super().__init__(response.status)
        self.response = response


class BaseEngine:
    kind: ClassVar[str] = "base"
    version: ClassVar[str] = "0"
    # Paths that are not control calls: not counted in the concurrency gauges, never given a
    # one-shot huge body.
    data_paths: ClassVar[frozenset[str]] = frozenset()
    probe_paths: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, config: EngineConfig | None = None, *, gauge_parent: Gauge | None = None):
        self.config = config = config or EngineConfig()
        path = config.model_path or str(default_checkpoint(self))
        self.checkpoint: Checkpoint = startup_checkpoint(path)
        self.model_path = path
        default_name = DEFAULT_MODEL_NAME if config.model_path is None else path
        self.served_model_name = config.served_model_name or default_name
        self.startup_model_path = path
        self.startup_served_model_name = self.served_model_name
        self.weight_version = config.weight_version
        self.knobs = Knobs(latency_ms=config.latency_ms, token_latency_ms=config.token_latency_ms)
        self.calls: collections.deque[RecordedCall] = collections.deque(maxlen=config.call_log_limit)
        self.gauge = Gauge(parent=gauge_parent)
        self.scheduler = Scheduler(
            self.checkpoint.digest,
            weight_version=lambda: self.weight_version,
            token_latency_s=lambda: self.knobs.token_latency_ms / 1000.0,
        )
        self.changed = self.scheduler.changed
        self.transfers = WeightTransfers(real=config.real_distributed)
        self.paused: str | None = None  # the pause mode, None when running
        self.released_tags: set[str] = set()
        self._saved_digest: str | None = None  # the weights' digest while they are released
        self.healthy = True
        self.grpc_front = None  # the gRPC face serving this engine (smgrl.fake.grpc_front), if any
        self.server = HttpServer(self.handle, config.port, config.host)
        self.routes: Routes = self.build_routes()

    # -- lifecycle -----------------------------------------------------------------------------
    async def serve(self, *, task_status: trio.TaskStatus[BaseEngine] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``nursery.start(engine.serve)`` returns once it listens."""
        try:
            # The server runs inside this task (a nursery of one) so that ``started`` can hand
            # the listening engine back while the caller's nursery keeps owning it.
            async with trio.open_nursery() as nursery:
                await nursery.start(self.server.run)
                task_status.started(self)
        finally:
            # Shielded: closing a joined process group blocks on a worker thread and must end
            # even though our serving scope is being cancelled.
            with trio.CancelScope(shield=True):
                await self.transfers.close()

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    def go_down(self, seconds: float | None) -> None:
        self.server.go_down(seconds)

    def come_up(self) -> None:
        self.server.come_up()

    # -- in-process test API -------------------------------------------------------------------
    def set_knobs(self, **values: Any) -> None:
        for key, value in values.items():
            if not hasattr(self.knobs, key):
                raise TypeError(f"unknown knob {key!r}")
            setattr(self.knobs, key, value)
        self.changed.notify()

    def clear_calls(self) -> None:
        self.calls.clear()
        self.gauge.reset()
        if self.gauge.parent is not None:
            self.gauge.parent.reset()

    def calls_to(self, path: str, method: str | None = None) -> list[RecordedCall]:
        return [c for c in self.calls if c.path == path and (method is None or c.method == method)]

    @property
    def peak_concurrency(self) -> int:
        return self.gauge.peak

    @property
    def inflight(self) -> int:
        return len(self.scheduler.jobs)

    @property
    def weights_digest(self) -> str:
        return self.scheduler.digest

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = math.inf) -> bool:
        """Wait (without polling) until ``predicate()`` holds; False after ``timeout`` seconds."""
        return await self.changed.wait_until(predicate, timeout)

    def state(self) -> dict[str, Any]:
        parent = self.gauge.parent
        return {
            "kind": self.kind,
            "url": self.url,
            "model_path": self.model_path,
            "served_model_name": self.served_model_name,
            "weight_version": self.weight_version,
            "weights_digest": self.weights_digest,
            "paused": self.paused,
            "memory": {"released": sorted(self.released_tags)},
            "healthy": self.healthy,
            "inflight": self.inflight,
            "running": len(self.scheduler.running()),
            # Tokens each running job has decoded so far (a test can sync mid-generation).
            "decoded": [len(j.output_ids) for j in self.scheduler.running()],
            "waiting": len(self.scheduler.waiting()),
            "concurrency": self.gauge.current,
            "peak_concurrency": self.gauge.peak,
            "process_peak_concurrency": parent.peak if parent is not None else self.gauge.peak,
            "calls": len(self.calls),
            "connections": {"accepted": self.server.accepted, "open": self.server.open_connections},
            "groups": sorted(self.transfers.groups),
            "knobs": self.knobs.to_json(),
            # Over gRPC: what the Generate and Abort RPCs were given (a test reads the pins).
            **({"grpc": self.grpc_front.record()} if self.grpc_front is not None else {}),
            **self.extra_state(),
        }

    def extra_state(self) -> dict[str, Any]:
        return {}

    def weight_transfers(self) -> dict[str, Any]:
        return self.transfers.to_json()

    # -- weights -------------------------------------------------------------------------------
    async def read_checkpoint(self, path: str) -> Checkpoint:
        """Hash a checkpoint directory off the event loop (raises CheckpointNotFound).
        The ``load_delay_ms`` and ``fail_loads`` knobs act here."""
        if self.knobs.load_delay_ms:
            await trio.sleep(self.knobs.load_delay_ms / 1000)
        if self.knobs.fail_loads > 0:
            self.knobs.fail_loads -= 1
            raise CheckpointNotFound(f"{path}: load failed (fake knob fail_loads)")
        return await trio.to_thread.run_sync(load_checkpoint, path)

    def install_weights(self, digest: str, checkpoint: Checkpoint | None = None) -> None:
        if checkpoint is not None:
            self.checkpoint = checkpoint
        self.scheduler.load(digest)

    # -- pause / resume ----------------------------------------------------------------------------
    # TokenSpeed's pause_generation and vLLM's /pause and /sleep (SGLang pauses its own way).
    async def pause_scheduler(self, mode: str) -> None:
        """``abort`` aborts what runs, ``wait`` lets it finish, ``keep`` freezes it in place; new
        requests wait at admission from now on. Returns once ``abort``/``wait`` drained."""
        self.paused = mode
        self.scheduler.set_frozen(mode == "keep")
        if mode == "abort":
            self.scheduler.abort_all()
        if mode in ("abort", "wait"):
            await self.wait_until(lambda: not self.scheduler.jobs)

    def resume_scheduler(self) -> None:
        self.paused = None
        self.scheduler.set_frozen(False)

    # -- memory release / resume -----------------------------------------------------------------
    # The state change behind SGLang's and TokenSpeed's release/resume_memory_occupation and
    # vLLM's sleep/wake_up. Each flavour's route keeps its own validation, pausing and answer.
    def release_memory(self, tags: list[str] | tuple[str, ...], marker: str) -> None:
        """Free ``tags``: the weights' digest is saved and replaced by one derived with ``marker``
        (a generate before resume shows that the weights are gone); the KV cache is flushed."""
        self.released_tags.update(tags)
        if "weights" in tags:
            self._saved_digest = self.weights_digest
            self.scheduler.load(derived_digest(self.weights_digest, marker))
        if "kv_cache" in tags:
            self.scheduler.flush_cache()
        self.changed.notify()

    def resume_memory(self, tags: list[str] | tuple[str, ...], *, restore: bool) -> None:
        """Bring ``tags`` back. Released weights come back as saved if ``restore`` (a CPU backup
        kept them), else uninitialised until the next refit."""
        if "weights" in tags and "weights" in self.released_tags and self._saved_digest is not None:
            saved, self._saved_digest = self._saved_digest, None
            self.scheduler.load(saved if restore else derived_digest(saved, "uninitialized"))
        self.released_tags.difference_update(tags)
        self.changed.notify()

    # -- inference hooks (overridden per flavour) ------------------------------------------------
    def precheck_admission(self) -> None:
        """Raise :class:`Reply` to reject a new inference request before it starts."""

    @contextlib.asynccontextmanager
    async def admission(self) -> AsyncIterator[None]:
        """Held for a request's whole generation; waits while the engine is paused."""
        await self.wait_until(lambda: self.paused is None)
        yield

    def serves_model(self, name: str) -> bool:
        return True

    def openai_error(
        self, status: int, message: str, type: str = "BadRequestError", param: str | None = None
    ) -> Response:
        error = {"message": message, "type": type, "param": param, "code": status}
        return json_response({"error": error}, status)

    def openai_choice(self, choice: dict[str, Any], job: Job) -> dict[str, Any]:
        return choice

    def openai_extras(self, payload: dict[str, Any], jobs: list[Job]) -> dict[str, Any]:
        return payload

    # -- dispatch ------------------------------------------------------------------------------
    def build_routes(self) -> Routes:
        raise NotImplementedError

    def authorize(self, req: Request) -> Response | None:
        return None

    # Every faked engine serves HTTP through FastAPI: its 404 and 405 answers.
    def not_found(self, req: Request) -> Response:
        return json_response({"detail": "Not Found"}, 404)

    def method_not_allowed(self, allowed: list[str]) -> Response:
        return json_response({"detail": "Method Not Allowed"}, 405, [("allow", ", ".join(allowed))])

    async def handle(self, req: Request) -> Response:
        if req.path.startswith("/_fake/"):
            return await knobs_mod.fake_route(self, req)
        self.calls.append(knobs_mod.record(req))
        knobs = self.knobs
        if knobs.hang:
            self.changed.notify()
            return HANG
        control = req.path not in self.data_paths
        if control:
            self.gauge.enter()
        # Wake in-process waiters ("the engine received X", "N calls in flight").
        self.changed.notify()
        try:
            if knobs.latency_ms > 0:
                await trio.sleep(knobs.latency_ms / 1000.0)
            if knobs.redirect_to:
                return knobs_mod.redirect_response(knobs, req)
            if knobs.force_status is not None:
                return knobs_mod.forced_response(knobs)
            if knobs.huge_body_bytes is not None and control and req.path not in self.probe_paths:
                size, knobs.huge_body_bytes = knobs.huge_body_bytes, None
                return knobs_mod.huge_response(size)
            return await self.dispatch(req)
        finally:
            if control:
                self.gauge.exit()

    async def dispatch(self, req: Request) -> Response:
        try:
            denied = self.authorize(req)
            if denied is not None:
                return denied
            methods = self.routes.get(req.path)
            if methods is None:
                return self.not_found(req)
            handler = methods.get(req.method)
            if handler is None and req.method == "HEAD" and self.config.head_as_get:
                handler = methods.get("GET")
            if handler is None:
                return self.method_not_allowed(list(methods))
            return await handler(req)
        except Reply as reply:
            return reply.response
        except Exception:  # noqa: BLE001 - any bug in a handler is the engine's 500
            # What Starlette's ServerErrorMiddleware answers for an uncaught exception.
            traceback.print_exc(file=sys.stderr)
            return text_response("Internal Server Error", 500)


def routes(*entries: tuple[str, str, Route]) -> Routes:
    """Build a route table from (path, "GET,POST", handler) entries."""
    table: Routes = {}
    for path, methods, handler in entries:
        for method in methods.split(","):
            table.setdefault(path, {})[method] = handler
    return table


def bearer(req: Request) -> str | None:
    value = req.header("authorization")
    if value is None:
        return None
    scheme, _, token = value.partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None

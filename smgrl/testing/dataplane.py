"""Test helpers for the data plane (shipped, as ``smgrl.testing`` is).

- ``gateway_on_loopback(cfg)``: the real ``smgrl.runtime.server.serve`` (smgrl's HTTP server, the raw front,
  the journal writer) on a loopback port with an in-memory journal, for what an in-process
  ASGI transport cannot show: streams arriving chunk by chunk, client disconnects.
- ``ScriptedEngine``: a minimal SGLang-looking engine whose rollout answers the test scripts
  step by step (send a chunk, wait for the test, send the next), and which records what it got.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import attrs
import httpx
import trio

from journal import MemoryStore
from smgrl.core.config import Config
from smgrl.fake.scripted import read_requests

PROBE_MODEL = "scripted/model"


@attrs.define
class Loopback:
    running: Any  # smgrl.runtime.server.Running
    base: str
    client: httpx.AsyncClient

    @property
    def gateway(self):
        return self.running.gateway

    @property
    def dataplane(self):
        """The app's DataPlane (``serve`` builds the app itself: found through the fleet
        listener it subscribed)."""
        from smgrl.dataplane import DataPlane

        for listener in self.gateway.fleet._listeners:
            owner = getattr(listener, "__self__", None)
            if isinstance(owner, DataPlane):
                return owner
        raise LookupError("no DataPlane is subscribed to this gateway's fleet")

    async def wait_routable(self, count: int, timeout: float = 10.0) -> None:
        with trio.fail_after(timeout):
            while sum(1 for w in self.gateway.fleet.registry if w.status == "ready") < count:
                await trio.sleep(0.005)


@contextlib.asynccontextmanager
async def gateway_on_loopback(cfg: Config) -> AsyncIterator[Loopback]:
    from smgrl.runtime.server import serve

    cfg = attrs.evolve(cfg, host="127.0.0.1", port=0, prometheus_port=0, shutdown_grace_period_secs=1.0)
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        running = await nursery.start(
            lambda task_status: serve(cfg, shutdown=shutdown, store=MemoryStore(), task_status=task_status)
        )
        base = running.urls[0].replace("0.0.0.0", "127.0.0.1")
        async with httpx.AsyncClient(base_url=base, timeout=math.inf) as client:
            try:
                yield Loopback(running, base, client)
            finally:
                shutdown.set()
                # The grace period bounds how long in-flight requests may hold the shutdown.


@attrs.define
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class ScriptedEngine:
    """An HTTP/1.1 engine on loopback. Registration probes get a minimal SGLang identity; every
    other request is recorded in ``seen`` and answered by ``script(request, writer)``."""

    PROBE: ClassVar[dict[str, bytes]] = {
        "/health": b"",
        "/v1/models": json.dumps(
            {"object": "list", "data": [{"id": PROBE_MODEL, "owned_by": "sglang"}]}
        ).encode(),
        "/server_info": json.dumps(
            {
                "model_path": PROBE_MODEL,
                "served_model_name": PROBE_MODEL,
                "tp_size": 1,
                "dp_size": 1,
                "version": "0.5.23",
            }
        ).encode(),
        "/model_info": json.dumps({"model_path": PROBE_MODEL}).encode(),
        # The load monitor's read (smgrl/registry/loads.py), answered as SGLang would: not a rollout.
        "/v1/loads": json.dumps({"timestamp": "", "version": "0.5.23", "loads": [{"dp_rank": 0}]}).encode(),
    }

    def __init__(self, script: Callable | None = None) -> None:
        self.script = script or self.json_ok
        self.seen: list[Seen] = []
        self.url = ""
        self.active = 0  # rollout requests being answered right now
        self.cancelled = 0  # rollout answers cut short because the gateway went away

    @staticmethod
    async def json_ok(req: Seen, w: ChunkWriter) -> None:
        await w.full(200, json.dumps({"text": "ok", "meta_info": {"weight_version": "default"}}).encode())

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream) -> None:
        async with stream:
            async for raw in read_requests(stream):
                method, target, headers, body = raw.method, raw.target, raw.headers, raw.body
                writer = ChunkWriter(stream)
                if raw.path in self.PROBE:
                    await writer.full(200, self.PROBE[raw.path])
                    continue
                req = Seen(method, target, headers, body)
                self.seen.append(req)
                self.active += 1
                try:
                    await self.script(req, writer)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.cancelled += 1
                    return
                finally:
                    self.active -= 1
                if writer.close_after:
                    return


class ChunkWriter:
    """How a script answers: a whole body, or a chunked stream piece by piece."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.close_after = False

    async def full(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        head = f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {len(body)}\r\n\r\n"
        await self.stream.send_all(head.encode() + body)

    async def start(self, status: int = 200, content_type: str = "text/event-stream") -> None:
        head = f"HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
        await self.stream.send_all(head.encode())

    async def chunk(self, data: bytes) -> None:
        await self.stream.send_all(b"%x\r\n%s\r\n" % (len(data), data))

    async def end(self) -> None:
        await self.stream.send_all(b"0\r\n\r\n")

    async def hang_up(self) -> None:
        """Close the connection without finishing the answer."""
        self.close_after = True
        await self.stream.aclose()

"""Test helpers shipped with smgrl (as trio ships ``trio.testing``): run a gateway in process.

``gateway_in_process(cfg)`` wires the real parts (journal writer with group commit, projections,
registry jobs, the Quart app) over an in-memory or SQLite journal, without sockets for the
gateway itself: requests go through ``httpx.ASGITransport``. Engines are real fake engines on
loopback (``smgrl.fake.fake_fleet``), so every engine call crosses a real TCP connection.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Sequence

import attrs
import httpx
import trio

from journal import EventStore, JournalWriter, MemoryStore
from smgrl.core.config import Config
from smgrl.history.replay import replay
from smgrl.http.app import create_app
from smgrl.registry import KeyRing, Registration
from smgrl.runtime.gateway import Gateway
from smgrl.runtime.routing_loop import run_routing_loop
from smgrl.state import FleetState
from smgrl.telemetry.journaling import record_interrupted


@attrs.define
class InProcess:
    gateway: Gateway
    app: object
    client: httpx.AsyncClient
    store: EventStore
    writer: JournalWriter

    async def wait_visible(self, count: int, timeout: float = 10.0) -> None:
        """Wait until ``count`` workers finished discovery (registration is asynchronous)."""
        with trio.fail_after(timeout):
            while sum(1 for w in self.gateway.fleet.registry if w.is_visible) < count:
                await trio.sleep(0.005)

    async def register(
        self,
        urls: Sequence[str],
        *,
        api_key: str | None = None,
        wait: bool = True,
        labels: dict | None = None,
    ) -> list[str]:
        ids = []
        for url in urls:
            w = await self.gateway.registry.register(
                Registration(url=url, api_key=api_key, labels=dict(labels or {})), "api"
            )
            ids.append(w.id)
        if wait:
            # Each registered worker becomes visible with its discovery event, which also creates
            # its DP ranks: waiting on the ids (not on a count taken before the ranks exist) is
            # what makes the fleet complete when this returns.
            registry = self.gateway.fleet.registry
            with trio.fail_after(10):
                while not all((w := registry.get(i)) is not None and w.is_visible for i in ids):
                    await trio.sleep(0.005)
        return ids


@contextlib.asynccontextmanager
async def gateway_in_process(
    cfg: Config,
    *,
    store=None,
    worker_urls: Sequence[str] = (),
    api_key: str | None = None,
    shared: bool = False,
) -> AsyncIterator[InProcess]:
    """``shared``: one of several gateways on ``store`` (a file others append to): its writer
    feeds every process's events in order from where replay stopped, but nothing follows the
    journal (``writer.catch_up()`` by hand), and startup recovery is left to the caller."""
    store = store if store is not None else MemoryStore()
    fleet = FleetState()
    replay(store, fleet)
    keys = KeyRing(store.secrets())
    writer = JournalWriter(store, lock_wait_secs=cfg.journal_lock_wait_secs)
    if shared:
        writer.position = fleet.last_seq
    gateway = Gateway.build(cfg, fleet=fleet, journal=writer, store=store, keys=keys)  # wires the hooks
    app = create_app(gateway)
    # One nursery owns the writer and the registry jobs for the life of the test's gateway.
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        if not shared:
            await record_interrupted(writer, fleet, "gateway_restart")
        await nursery.start(gateway.registry.run)
        await nursery.start(gateway.refits.run)  # resumes sagas the journal left open
        if gateway.dataplane.pins is not None:
            await nursery.start(gateway.dataplane.pins.run)  # shared: flushes pin releases
        if gateway.dataplane.queues is not None:
            await nursery.start(run_routing_loop, gateway.dataplane.queues)  # PSRL's routing loop
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(
            transport=transport, base_url="http://smgrl.test", timeout=math.inf
        ) as client:
            running = InProcess(gateway, app, client, store, writer)
            if worker_urls:
                await running.register(worker_urls, api_key=api_key)
            try:
                yield running
            finally:
                nursery.cancel_scope.cancel()
        # The writer drains under its own shield when cancelled; close the engine pools too.
    with trio.CancelScope(shield=True):
        await gateway.pools.aclose()

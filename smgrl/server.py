"""The gateway process: replay the journal, then run every part under one root nursery.

Task tree (structured concurrency; a parent outlives its children)::

    serve()
    └── outer nursery ........ the journal writer: it outlives everything that appends
        └── inner nursery .... registry jobs, snapshotter, health checker, metrics listener,
                               hypercorn

Startup restores the projections from the newest fleet snapshot plus the events after it
(``smgrl.state.replay.restore``); the snapshotter stores a new one every ``SMGRL_SNAPSHOT_EVERY``
(default 50,000) events.

Shutdown (SIGINT/SIGTERM sets ``shutdown``): hypercorn stops accepting and gives in-flight
requests ``--shutdown-grace-period-secs`` to finish (a fan-out cut short past that records itself
as cancelled), the inner nursery is cancelled, and then, shielded, the operations still open are
recorded as interrupted, ``gateway.stopped`` is appended and the writer drains and closes.
"""

from __future__ import annotations

import logging
import os

import attrs
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.trio import serve as hypercorn_serve

from journal import JournalWriter, MemoryStore, SqliteStore
from smgrl import __version__, hypercorn_patches
from smgrl.api.metrics_server import serve_metrics
from smgrl.app import create_app
from smgrl.config import Config
from smgrl.gateway import Gateway
from smgrl.journaling import ev
from smgrl.logs import event as log_event
from smgrl.registry.health import HealthChecker
from smgrl.registry.keys import KeyRing
from smgrl.registry.service import Registration
from smgrl.state.replay import Snapshotter, record_interrupted, restore, snapshot_every

log = logging.getLogger("smgrl.server")

# Bound on the shielded shutdown bookkeeping, so a wedged disk cannot hang the process forever.
SHUTDOWN_RECORD_SECS = 15.0


@attrs.frozen
class Running:
    """What ``serve`` reports once it listens (for tests, the demo and the CLI banner)."""

    gateway: Gateway
    urls: list[str]
    metrics_url: str | None


def hypercorn_config(cfg: Config) -> HyperConfig:
    # Measured: one idle watcher per connection and head+body in one write roughly halve
    # hypercorn's per-request CPU; the patches also fix a keep-alive hang and the resets after
    # early answers (smgrl/hypercorn_patches.py), so on another hypercorn this refuses (one line).
    hypercorn_patches.require()
    hc = HyperConfig()
    host = f"[{cfg.host}]" if ":" in cfg.host and not cfg.host.startswith("[") else cfg.host
    hc.bind = [f"{host}:{cfg.port}"]
    hc.accesslog = None
    hc.errorlog = None
    hc.graceful_timeout = cfg.shutdown_grace_period_secs
    hc.include_date_header = False
    hc.include_server_header = False
    hc.keep_alive_max_requests = 1_000_000_000
    hc.keep_alive_timeout = 75
    # Rollout fleets open hundreds of connections at once; hypercorn's default accept backlog
    # (100) made the kernel drop the rest of the SYNs, and each dropped one waited a 1 s, 2 s,
    # 4 s... retransmit (measured: 1,000 concurrent streams took 16 s instead of 1 s). The
    # kernel caps it at net.core.somaxconn.
    hc.backlog = 4096
    return hc


async def serve(
    cfg: Config, *, shutdown: trio.Event | None = None, store=None, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    shutdown = shutdown if shutdown is not None else trio.Event()
    own_store = store is None
    if store is None:
        # ``--journal :memory:`` keeps the journal in memory (nothing survives the process): for
        # throwaway runs and for measuring what the SQLite file costs.
        store = MemoryStore() if cfg.journal == ":memory:" else SqliteStore.open(cfg.journal)
    # The newest valid snapshot plus the events after it: a 1M-event journal starts in well
    # under a second (benchmarks/journal.py). Synchronous on purpose: nothing runs before it.
    fleet, restored = restore(store)
    keys = KeyRing(store.secrets())
    writer = JournalWriter(store, lock_wait_secs=cfg.journal_lock_wait_secs)
    # Gateway.build wires the writer's commit hooks (projections, key ring, registry jobs, metrics).
    gw = Gateway.build(cfg, fleet=fleet, journal=writer, store=store, keys=keys)
    app = create_app(gw)
    clean = False
    try:
        async with trio.open_nursery() as outer:
            await outer.start(writer.run)
            interrupted = await record_interrupted(writer, fleet, "gateway_restart")
            await writer.append("gateway", _started_event(cfg))
            log_event(
                log,
                "journal replayed",
                path=cfg.journal,
                events=restored.replayed,
                snapshot_seq=restored.snapshot_seq,
                head=restored.head,
                workers=len(fleet.registry),
                interrupted_operations=len(interrupted),
            )
            try:
                async with trio.open_nursery() as inner:
                    await inner.start(gw.registry.run)
                    snapshots = Snapshotter(
                        fleet, writer, every=snapshot_every(), last_seq=restored.snapshot_seq
                    )
                    await inner.start(snapshots.run)
                    if cfg.audit:
                        await inner.start(gw.audit.run, writer)
                    for url in cfg.worker_urls:
                        if fleet.registry.conflict_for(url) is None:
                            await gw.registry.register(Registration(url=url, api_key=cfg.api_key), "cli")
                    if cfg.health.enabled:
                        checker = HealthChecker(
                            fleet=fleet, registry=gw.registry, pools=gw.pools, keys=keys, cfg=cfg.health
                        )
                        await inner.start(checker.run)
                    metrics_url = None
                    if cfg.prometheus_port:
                        mhost = cfg.prometheus_host or cfg.host
                        listeners = await inner.start(
                            serve_metrics,
                            lambda: gw.metrics.render(fleet.registry),
                            mhost,
                            cfg.prometheus_port,
                        )
                        sockname = listeners[0].socket.getsockname()
                        metrics_url = f"http://{_hostport(sockname)}/metrics"
                    http_done = trio.Event()

                    async def run_http(task_status=trio.TASK_STATUS_IGNORED) -> None:
                        try:
                            await hypercorn_serve(
                                app,
                                hypercorn_config(cfg),
                                shutdown_trigger=shutdown.wait,
                                task_status=task_status,
                            )
                        finally:
                            http_done.set()

                    urls = await inner.start(run_http)
                    task_status.started(Running(gw, urls, metrics_url))
                    log_event(
                        log,
                        "listening",
                        urls=",".join(urls),
                        metrics=metrics_url,
                        rl=cfg.rl.enabled,
                        pid=os.getpid(),
                    )
                    # hypercorn returns only after its graceful shutdown (in-flight requests
                    # done or past the grace period); then the jobs, the health checker and the
                    # metrics listener have nothing left to serve.
                    await http_done.wait()
                    inner.cancel_scope.cancel()
            finally:
                # Shielded: the process is going down, but the journal must still say which
                # operations were cut short and that the gateway stopped.
                with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_RECORD_SECS):
                    # After a fail-stop (journal/writer.py) memory no longer matches the journal
                    # and nothing more is written; the writer's ProjectionError ends serve().
                    if not writer.failed:
                        await gw.audit.flush(writer)
                        await record_interrupted(writer, fleet, "shutdown")
                        await writer.append("gateway", _stopped_event(clean=True, reason="shutdown"))
                        await writer.aclose()
                    await gw.pools.aclose()
                clean = not writer.failed
    finally:
        if own_store:
            store.close()
        log_event(log, "stopped", clean=clean)


def _hostport(sockname) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _started_event(cfg: Config):
    return ev("gateway.started", version=__version__, pid=os.getpid(), config=cfg.scrubbed())


def _stopped_event(clean: bool, reason: str):
    return ev("gateway.stopped", clean=clean, reason=reason)

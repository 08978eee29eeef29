"""The gateway process: replay the journal, then run every part under one root nursery.

Task tree (structured concurrency; a parent outlives its children)::

    serve()
    └── outer nursery ........ the journal writer: it outlives everything that appends
        └── inner nursery .... registry jobs, snapshotter, health checker, metrics listener,
                               the HTTP server (smgrl.http.server)

Startup restores the projections from the newest fleet snapshot plus the events after it
(``smgrl.history.replay.restore_verified``); the snapshotter (``smgrl.runtime.snapshots``) stores a new one every ``SMGRL_SNAPSHOT_EVERY``
(default 25,000) events.

One code path whatever the deployment: what differs between a lone gateway and one of several
processes on the journal is the process's role (``smgrl.runtime.roles``: ``Alone`` holds every
lease, ``Shared`` runs each duty where its lease is), asked at each step.

Startup, in this order, so that a failure changes nothing it need not: take the journal's
ownership lock (``journal/lock.py``: a second gateway on the file is refused naming the owner),
bind the HTTP and metrics ports, open the journal (a foreign or newer file is refused untouched),
restore the projections after checking the hash chain of what is replayed
(``restore_verified``). Each failure is a :class:`StartupError` whose one line names the port or
the path; ``smgrl launch`` prints it and exits 1.

Shutdown (SIGINT/SIGTERM sets ``shutdown``): the HTTP server stops accepting and gives in-flight
requests ``--shutdown-grace-period-secs`` to finish; one log line says what it waits for. A second
signal sets ``stop_now``: the inner nursery (the HTTP server, its request handlers) is cancelled at once,
while the journal writer, in the outer nursery, keeps running. Then, shielded, the operations still
open (a hung engine call, say) are recorded as interrupted, ``gateway.stopped`` is appended and the
writer drains and closes.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import socket
import sqlite3
from functools import partial
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.config import Sockets

from journal import (
    JournalError,
    JournalLock,
    JournalWriter,
    MemoryStore,
    PgStore,
    SqliteStore,
    describe,
    is_postgres_url,
)
from smgrl import __version__
from smgrl.cluster.sharing import Sharing
from smgrl.core.config import Config
from smgrl.core.errors import StartupError, WorkerApiError
from smgrl.events import GatewayStarted, GatewayStopped
from smgrl.history.replay import restore_verified
from smgrl.http.app import create_app
from smgrl.http.routes.metrics_server import serve_metrics
from smgrl.http.server import serve as http_serve
from smgrl.registry import HealthChecker, KeyRing, Registration, monitoring_enabled
from smgrl.runtime import gctune
from smgrl.runtime.gateway import Gateway
from smgrl.runtime.listeners import bind_metrics, close_sockets, hostport, hypercorn_config
from smgrl.runtime.roles import Alone, Shared, role_for
from smgrl.runtime.routing_loop import run_routing_loop
from smgrl.runtime.snapshots import Snapshotter, snapshot_every
from smgrl.telemetry.journaling import record_interrupted
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.server")

# Bound on the shielded shutdown bookkeeping, so a wedged disk cannot hang the process forever.
SHUTDOWN_RECORD_SECS = 15.0


@attrs.frozen
class Running:
    """What ``serve`` reports once it listens (for tests, the demo and the CLI banner)."""

    gateway: Gateway
    urls: list[str]
    metrics_url: str | None


@attrs.frozen
class Process:
    """What ``serve`` bound, opened and restored before anything runs (``_run`` takes it)."""

    cfg: Config
    role: Alone | Shared  # this process's part on the journal (smgrl/runtime/roles.py)
    store: Any
    fleet: Any  # the projections, restored
    restored: Any  # what replay did (``restore_verified``)
    hc: HyperConfig
    sockets: Sockets  # the HTTP port
    private: socket.socket | None  # the port other processes forward to (None when alone)
    metrics_listeners: list[trio.SocketListener] | None
    shutdown: trio.Event
    stop_now: trio.Event


async def serve(
    cfg: Config,
    *,
    shutdown: trio.Event | None = None,
    stop_now: trio.Event | None = None,
    store=None,
    sharing: Sharing | None = None,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the gateway until ``shutdown`` (graceful) and, if it is set too, ``stop_now``.

    ``store``: an already open journal (tests); the gateway then neither locks nor closes it.
    ``sharing``: this process's part in a group sharing the journal (``smgrl/cluster/sharing.py``; set
    for a ``--workers N`` worker, and always made for a PostgreSQL journal, shared by design).
    """
    shutdown = shutdown if shutdown is not None else trio.Event()
    stop_now = stop_now if stop_now is not None else trio.Event()
    if sharing is None and is_postgres_url(cfg.journal):
        sharing = Sharing()
    role = role_for(sharing)
    with contextlib.ExitStack() as resources:
        own_store = store is None
        lock = None
        # A PostgreSQL journal has no lock file (its writers share it: docs/journal.md).
        if own_store and cfg.journal != ":memory:" and not is_postgres_url(cfg.journal):
            lock = resources.enter_context(own_journal(cfg.journal, group=role.lock_group))
        hc = hypercorn_config(cfg)
        sockets = role.http_sockets(hc, cfg)
        resources.callback(close_sockets, sockets)
        private = role.private_socket(cfg, hc.backlog)
        if private is not None:
            resources.callback(private.close)
        metrics_listeners = await bind_metrics(cfg)
        for listener in metrics_listeners or ():
            resources.callback(listener.socket.close)
        if lock is not None:
            lock.update(port=sockets.insecure_sockets[0].getsockname()[1])
        if own_store:
            # ``--journal :memory:`` keeps the journal in memory (nothing survives the process):
            # for throwaway runs and for measuring what the SQLite file costs.
            store = MemoryStore() if cfg.journal == ":memory:" else open_journal(cfg.journal)
            resources.callback(store.close)
        # The newest valid snapshot plus the events after it, after checking their hash chain: a
        # 1M-event journal starts in under a second (benchmarks/journal.py). Synchronous on
        # purpose: nothing runs before it.
        fleet, restored = restore_verified(store)
        process = Process(
            cfg, role, store, fleet, restored, hc, sockets, private, metrics_listeners, shutdown, stop_now
        )
        await _run(process, task_status)


async def _run(p: Process, task_status) -> None:
    cfg, role, store, fleet, restored = p.cfg, p.role, p.store, p.fleet, p.restored
    keys = KeyRing(store.secrets())
    writer = JournalWriter(store, lock_wait_secs=cfg.journal_lock_wait_secs)
    role.prepare(writer, restored)
    # Gateway.build wires the writer's commit hooks (projections, key ring, registry jobs, metrics).
    gateway = Gateway.build(cfg, fleet=fleet, journal=writer, store=store, keys=keys)
    role.wire(gateway, writer, store, cfg, p.private)
    app = create_app(gateway)
    clean = False
    # The tail and the presence lease run beside the writer until it closed; then cancelled.
    side: list[trio.CancelScope] = []
    try:
        async with trio.open_nursery() as outer:
            await outer.start(writer.run)
            interrupted = await role.join(outer, side, writer, store, fleet, gateway)
            await writer.append("gateway", _started_event(cfg))
            await role.announce(writer, gateway, store)
            # A log line's fields (shaped like other log_event calls; each line its own facts).
            log_event(
                log,
                "journal replayed",
                path=describe(cfg.journal),  # a URL's password never reaches a log line
                events=restored.replayed,
                snapshot_seq=restored.snapshot_seq,
                head=restored.head,
                workers=len(fleet.registry),
                interrupted_operations=len(interrupted),
            )
            try:
                # The inner nursery: everything that serves; cancelled by a second signal
                # (``_stop_watch``) while the writer, in the outer one, takes the last records.
                async with trio.open_nursery() as inner:
                    await _start_parts(p, gateway, writer, inner)
                    await _serve_http(p, gateway, app, inner, task_status)
            finally:
                # Shielded: the process is going down, but the journal must still say which
                # operations were cut short and that the gateway stopped. The writer lives in
                # the outer nursery, which nothing has cancelled, so it still takes appends.
                with trio.CancelScope(shield=True), trio.move_on_after(SHUTDOWN_RECORD_SECS):
                    # After a fail-stop (journal/writer.py) memory no longer matches the journal
                    # and nothing more is written; the writer's ProjectionError ends serve().
                    if not writer.failed:
                        await gateway.audit.flush(writer)
                        # Several processes: only this one's operations; the others still run.
                        await record_interrupted(writer, fleet, "shutdown", only=role.mine())
                        await writer.append("gateway", _stopped_event(clean=True, reason="shutdown"))
                        await writer.aclose()
                    await gateway.pools.aclose()
                    if gateway.forwarder is not None:
                        await gateway.forwarder.aclose()
                    clean = not writer.failed
                for scope in side:
                    scope.cancel()
    finally:
        log_event(log, "stopped", clean=clean)


async def _start_parts(p: Process, gateway: Gateway, writer, inner: trio.Nursery) -> None:
    """Start the refit sagas, the duties (each where its lease is: all of them when alone), the
    audit counts, the CLI's engines, the health checker and the load monitor."""
    cfg, role, store, fleet = p.cfg, p.role, p.store, p.fleet
    snapshots = Snapshotter(fleet, writer, every=snapshot_every(), last_seq=p.restored.snapshot_seq)
    if snapshots.due():
        # Startup replayed and chain-checked more events than a snapshot spans (no snapshot yet,
        # or one that failed its hash): store what it checked before serving, so the next start
        # restores it and checks only the rows after it. The long check is paid once
        # (docs/journal.md#startup-trust).
        await snapshots.take()
    checker = None
    if cfg.health.enabled:
        checker = HealthChecker(
            fleet=fleet, registry=gateway.registry, pools=gateway.pools, keys=gateway.keys, cfg=cfg.health
        )
    # Every process runs the refits it is asked for (one at a time fleet-wide: a conditional
    # append); only the holder of every lease resumes the open sagas at once: with several
    # processes an open saga may be another live process's (docs/scale-out.md), and the
    # recovery duty resumes those whose process is gone.
    await role.start_duty(inner, store, "discovery", gateway.registry.run)
    await inner.start(partial(gateway.refits.run, resume=role.resumes_sagas))
    await role.start_duty(inner, store, "snapshots", snapshots.run)
    recovery = role.recovery(store, writer, fleet, gateway.refits)
    if recovery is not None:
        await role.start_duty(inner, store, "recovery", recovery)
    if cfg.audit:
        await inner.start(gateway.audit.run, writer)
    if gateway.dataplane.queues is not None:
        # PSRL's routing loop: per process (its queues are this process's waiting requests),
        # in the inner nursery with the handlers it serves.
        await inner.start(run_routing_loop, gateway.dataplane.queues)
    for url in cfg.worker_urls:
        if fleet.registry.conflict_for(url) is None:
            try:
                await gateway.registry.register(Registration(url=url, api_key=cfg.api_key), "cli")
            except WorkerApiError:
                # Several processes: another one registered it first (409).
                if not role.registered_elsewhere():
                    raise
    if checker is not None:
        await role.start_duty(inner, store, "health", checker.run)
    if monitoring_enabled(cfg):
        # Per process, never leased: samples are in memory only, and every process serves
        # GET /workers rows of its own (smgrl/registry/loads.py).
        await inner.start(gateway.loads.run)


async def _serve_http(p: Process, gateway: Gateway, app, inner: trio.Nursery, task_status) -> None:
    """The metrics listener and the HTTP server; report ``Running``; return after its graceful
    shutdown (in-flight requests done or past the grace period), the inner nursery cancelled:
    the jobs, the health checker and the metrics listener have nothing left to serve."""
    cfg, hc, role = p.cfg, p.hc, p.role
    metrics_url = None
    if p.metrics_listeners is not None:
        await inner.start(
            serve_metrics, lambda: gateway.metrics.render(p.fleet.registry), p.metrics_listeners
        )
        sockname = p.metrics_listeners[0].socket.getsockname()
        metrics_url = f"http://{hostport(sockname)}/metrics"
    http_done = trio.Event()
    served = role.served(p.sockets, p.private)

    async def run_http(task_status=trio.TASK_STATUS_IGNORED) -> None:
        for sock in served.insecure_sockets:
            sock.listen(hc.backlog)
        try:
            await http_serve(
                app,
                served.insecure_sockets,
                shutdown_trigger=p.shutdown.wait,
                graceful_timeout=cfg.shutdown_grace_period_secs,
                header_read_timeout=cfg.header_read_timeout_secs or math.inf,
                keep_alive_timeout=cfg.idle_connection_timeout_secs or math.inf,
                task_status=task_status,
            )
        finally:
            http_done.set()

    urls = await inner.start(run_http)
    urls = urls[: len(p.sockets.insecure_sockets)]  # the private one, if any, is last
    inner.start_soon(_stop_watch, gateway, p.shutdown, p.stop_now, inner.cancel_scope)
    task_status.started(Running(gateway, urls, metrics_url))
    gctune.freeze_startup()  # the replayed state, the app: the process's own
    role.report_ready({"pid": os.getpid(), "metrics_url": metrics_url, "urls": urls})
    log_event(
        log,
        "listening",
        urls=",".join(urls),
        metrics=metrics_url,
        rl=cfg.rl.enabled,
        pid=os.getpid(),
        forward=gateway.forwarder.me.url if gateway.forwarder is not None else None,
    )
    await http_done.wait()
    inner.cancel_scope.cancel()


async def _stop_watch(
    gateway: Gateway, shutdown: trio.Event, stop_now: trio.Event, inner: trio.CancelScope
) -> None:
    """Say what a graceful stop waits for, and cut it short on ``stop_now`` (a second signal)."""
    await shutdown.wait()
    # From now on an operation cut short is the gateway's doing: it is recorded interrupted
    # (reason shutdown) by serve's shielded bookkeeping, not cancelled as for a client gone.
    gateway.control.stopping = True
    waiting = _in_flight(gateway)
    if waiting:
        log.warning(
            "shutting down: waiting up to %gs for %s; press Ctrl-C again (or send SIGTERM) to stop"
            " waiting: operations still open are then recorded interrupted",
            gateway.cfg.shutdown_grace_period_secs,
            waiting,
        )
    else:
        log_event(log, "shutting down")
    await stop_now.wait()
    log.warning("stopping now: cancelling the requests in flight")
    # Only the inner nursery: the HTTP server and its handlers go, the journal writer stays for the
    # shielded bookkeeping in serve().
    inner.cancel()


def _in_flight(gateway: Gateway) -> str:
    """What a graceful stop waits for, in words: the open control operations and rollout requests."""
    parts = []
    ops = list(gateway.fleet.operations.open.values())
    if ops:
        shown = ", ".join(
            f"{op.op_id} ({op.method} {op.path}, {_plural(len(op.targets), 'engine')})" for op in ops[:3]
        )
        more = f" and {len(ops) - 3} more" if len(ops) > 3 else ""
        parts.append(f"{_plural(len(ops), 'control operation')} [{shown}{more}]")
    active = gateway.dataplane.admission.active
    if active:
        parts.append(_plural(active, "rollout request"))
    return " and ".join(parts)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@contextlib.contextmanager
def own_journal(path: str, *, group: str | None = None):
    """The journal's ownership lock for this process (``journal/lock.py``), as a StartupError:
    exclusive for a lone gateway, shared with ``group`` for a ``--workers N`` worker."""
    try:
        if group:
            lock = JournalLock.acquire(path, mode="shared", group=group, version=__version__)
        else:
            lock = JournalLock.acquire(path, version=__version__)
    except JournalError as exc:  # JournalLocked: names the owner
        raise StartupError(str(exc)) from None
    except OSError as exc:
        raise StartupError(_journal_os_error(path, exc)) from None
    try:
        yield lock
    finally:
        lock.release()


def open_journal(path: str):
    """``SqliteStore.open`` (``PgStore.open`` for a postgresql:// URL) with every failure as one
    StartupError line naming the path (a URL without its password)."""
    if is_postgres_url(path):
        try:
            return PgStore.open(path)
        except ImportError:
            raise StartupError(
                "a postgresql:// journal needs psycopg: pip install 'psycopg[binary]'"
            ) from None
        except (JournalError, ValueError) as exc:  # unreachable server, foreign schema, bad schema=
            raise StartupError(_scrub_url(str(exc), path)) from None
    if os.path.isdir(path):
        raise StartupError(f"--journal {path} is a directory, not a journal file")
    try:
        return SqliteStore.open(path)
    except JournalError as exc:  # foreign file, newer format or migrations
        raise StartupError(str(exc)) from None
    except sqlite3.Error as exc:
        raise StartupError(f"cannot open the journal {path}: {exc}") from None
    except OSError as exc:
        raise StartupError(_journal_os_error(path, exc)) from None


def _scrub_url(text: str, url: str) -> str:
    """Belt and braces: the stores already scrub the password; never let it through here either."""
    return text.replace(url, describe(url))


def _journal_os_error(path: str, exc: OSError) -> str:
    parent = os.path.dirname(os.path.abspath(path))
    if exc.errno == errno.ENOENT and not os.path.isdir(parent):
        return f"cannot create the journal {path}: the directory {parent} does not exist"
    return f"cannot open the journal {path}: {exc.strerror or exc}"


def _started_event(cfg: Config):
    return GatewayStarted(version=__version__, pid=os.getpid(), config=cfg.scrubbed())


def _stopped_event(clean: bool, reason: str):
    return GatewayStopped(clean=clean, reason=reason)

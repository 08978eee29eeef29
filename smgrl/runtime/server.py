"""The gateway process: replay the journal, then run every part under one root nursery.

Task tree (structured concurrency; a parent outlives its children)::

    serve()
    └── outer nursery ........ the journal writer: it outlives everything that appends
        └── inner nursery .... registry jobs, snapshotter, health checker, metrics listener,
                               hypercorn

Startup restores the projections from the newest fleet snapshot plus the events after it
(``smgrl.history.replay.restore_verified``); the snapshotter (``smgrl.runtime.snapshots``) stores a new one every ``SMGRL_SNAPSHOT_EVERY``
(default 25,000) events.

Startup, in this order, so that a failure changes nothing it need not: take the journal's
ownership lock (``journal/lock.py``: a second gateway on the file is refused naming the owner),
bind the HTTP and metrics ports, open the journal (a foreign or newer file is refused untouched),
restore the projections after checking the hash chain of what is replayed
(``restore_verified``). Each failure is a :class:`StartupError` whose one line names the port or
the path; ``smgrl launch`` prints it and exits 1.

Shutdown (SIGINT/SIGTERM sets ``shutdown``): hypercorn stops accepting and gives in-flight
requests ``--shutdown-grace-period-secs`` to finish; one log line says what it waits for. A second
signal sets ``stop_now``: the inner nursery (hypercorn, its request handlers) is cancelled at once,
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

import attrs
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

from journal import (
    ChangeWatcher,
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
from smgrl.cluster.forwarding import Forwarder, Peer, owner_key, private_socket
from smgrl.cluster.sharing import Sharing, presence, recovery_duty, run_leased
from smgrl.core.config import Config
from smgrl.core.errors import StartupError, WorkerApiError
from smgrl.history.replay import restore_verified
from smgrl.http import hypercorn_patches
from smgrl.http.app import create_app
from smgrl.http.routes.metrics_server import serve_metrics
from smgrl.registry import HealthChecker, KeyRing, Registration, monitoring_enabled
from smgrl.runtime import gctune
from smgrl.runtime.gateway import Gateway
from smgrl.runtime.routing_loop import run_routing_loop
from smgrl.runtime.snapshots import Snapshotter, snapshot_every
from smgrl.telemetry.journaling import ev, record_interrupted
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


def hypercorn_config(cfg: Config) -> HyperConfig:
    # Measured: one idle watcher per connection and head+body in one write roughly halve
    # hypercorn's per-request CPU; the patches also fix a keep-alive hang and the resets after
    # early answers (smgrl/http/hypercorn_patches.py), so on another hypercorn this refuses (one line).
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
    # SMG's two connection bounds (--header-read-timeout-secs, --idle-connection-timeout-secs),
    # enforced by the patched idle watcher (hypercorn_patches.IdleWatch); 0 disables (inf).
    hc.keep_alive_timeout = cfg.idle_connection_timeout_secs or math.inf
    setattr(hc, hypercorn_patches.HEADER_READ_TIMEOUT, cfg.header_read_timeout_secs or math.inf)
    # Rollout fleets open hundreds of connections at once; hypercorn's default accept backlog
    # (100) made the kernel drop the rest of the SYNs, and each dropped one waited a 1 s, 2 s,
    # 4 s... retransmit (measured: 1,000 concurrent streams took 16 s instead of 1 s). The
    # kernel caps it at net.core.somaxconn.
    hc.backlog = 4096
    return hc


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
    with contextlib.ExitStack() as resources:
        own_store = store is None
        lock = None
        # A PostgreSQL journal has no lock file (its writers share it: docs/journal.md).
        if own_store and cfg.journal != ":memory:" and not is_postgres_url(cfg.journal):
            group = sharing.group if sharing is not None else None
            lock = resources.enter_context(own_journal(cfg.journal, group=group))
        hc = hypercorn_config(cfg)
        sockets = (
            inherited_http(sharing.fd)
            if sharing is not None and sharing.fd is not None
            else bind_http(hc, cfg)
        )
        resources.callback(_close_sockets, sockets)
        private = None
        if sharing is not None:
            # Several processes: a private loopback listener, the same app, so that the others
            # can reach THIS process (the shared port reaches any): smgrl/cluster/forwarding.py.
            try:
                # --forward-port pins it: worker i of --workers N takes PORT + i.
                port = cfg.forward_port + sharing.index if cfg.forward_port else 0
                private = private_socket(hc.backlog, port)
            except OSError as exc:
                where = f"127.0.0.1:{port}" if port else "127.0.0.1"
                raise StartupError(
                    f"cannot listen on {where} (the private port other gateway processes forward to"
                    f"{', --forward-port' if port else ''}): {exc.strerror or exc}"
                ) from None
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
        await _run(
            cfg,
            store,
            fleet,
            restored,
            hc,
            sockets,
            metrics_listeners,
            shutdown,
            stop_now,
            task_status,
            sharing,
            private,
        )


async def _run(
    cfg,
    store,
    fleet,
    restored,
    hc,
    sockets,
    metrics_listeners,
    shutdown,
    stop_now,
    task_status,
    sharing=None,
    private=None,
):
    keys = KeyRing(store.secrets())
    writer = JournalWriter(store, lock_wait_secs=cfg.journal_lock_wait_secs)
    if sharing is not None:
        # Several writers: on_commit gets every process's events, in seq order, from the seq the
        # projections were restored to (docs/journal.md, "Several writers").
        writer.position = restored.head
    # Gateway.build wires the writer's commit hooks (projections, key ring, registry jobs, metrics).
    gateway = Gateway.build(cfg, fleet=fleet, journal=writer, store=store, keys=keys)
    if sharing is not None:
        gateway.control.identity = sharing.identity
        gateway.sharing = sharing
        committed = writer.on_commit

        def on_commit(records) -> None:
            sharing.committed(records)
            committed(records)

        writer.on_commit = on_commit
        if private is not None:
            gateway.forwarder = _forwarder(cfg, store, sharing, private)
            if gateway.sessions is not None:
                # Its session ids name this process, so every other process can find it.
                gateway.sessions.owner = gateway.forwarder.me.owner
    app = create_app(gateway)
    clean = False
    # The tail and the presence lease run beside the writer until it closed; then cancelled.
    side: list[trio.CancelScope] = []
    try:
        async with trio.open_nursery() as outer:
            await outer.start(writer.run)
            if sharing is None:
                interrupted = await record_interrupted(writer, fleet, "gateway_restart")
            else:
                # The tail: the other processes' events reach the projections within the
                # watcher's interval (woken at once by a local append). Then this process's
                # presence; what a dead process left open is the recovery lease's duty.
                # The first change_token() of a PostgreSQL store opens its LISTEN connection and
                # waits (up to 10 s) until it has subscribed, so that no commit goes unnoticed:
                # taken in a thread, the event loop never blocks on it (later calls return at once).
                await trio.to_thread.run_sync(store.change_token)
                watcher = ChangeWatcher(store)
                await outer.start(_in_scope, side, writer.follow, watcher)
                if gateway.dataplane.pins is not None:
                    # Prompt-group pin releases no pin decision took along (smgrl/dataplane/pins.py).
                    await outer.start(_in_scope, side, gateway.dataplane.pins.run)
                await outer.start(_in_scope, side, presence, store, sharing)
                interrupted = []
            await writer.append("gateway", _started_event(cfg))
            if gateway.forwarder is not None:
                me = gateway.forwarder.me
                await writer.append(f"peer:{me.owner}", me.event())
            if gateway.sessions is not None and sharing is None:
                # Sessions live in memory: those an earlier process left open are ended, in the
                # journal, before this one serves (their ids answer 410 session_gone).
                await gateway.sessions.end_previous(store)
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
                async with trio.open_nursery() as inner:
                    snapshots = Snapshotter(
                        fleet, writer, every=snapshot_every(), last_seq=restored.snapshot_seq
                    )
                    if snapshots.due():
                        # Startup replayed and chain-checked more events than a snapshot spans
                        # (no snapshot yet, or one that failed its hash): store what it checked
                        # before serving, so the next start restores it and checks only the rows
                        # after it. The long check is paid once (docs/journal.md#startup-trust).
                        await snapshots.take()
                    checker = None
                    if cfg.health.enabled:
                        checker = HealthChecker(
                            fleet=fleet,
                            registry=gateway.registry,
                            pools=gateway.pools,
                            keys=keys,
                            cfg=cfg.health,
                        )
                    if sharing is None:
                        await inner.start(gateway.registry.run)
                        await inner.start(gateway.refits.run)  # resumes sagas the journal left open
                        await inner.start(snapshots.run)
                    else:
                        # Every process runs the refits it is asked for (one at a time fleet-wide:
                        # a conditional append); none resumes an open saga, which may be another
                        # live process's (docs/scale-out.md). Duties that must run once run where
                        # their lease is (smgrl/cluster/sharing.py).
                        await inner.start(partial(gateway.refits.run, resume=False))
                        duties = {
                            "discovery": gateway.registry.run,
                            "snapshots": snapshots.run,
                            "health": checker.run if checker is not None else None,
                            "recovery": partial(recovery_duty, store, writer, fleet, sharing, gateway.refits),
                        }
                        for name, duty in duties.items():
                            if duty is not None:
                                await inner.start(run_leased, store, sharing, name, _as_duty(duty))
                    if cfg.audit:
                        await inner.start(gateway.audit.run, writer)
                    if gateway.dataplane.queues is not None:
                        # PSRL's routing loop: per process (its queues are this process's
                        # waiting requests), in the inner nursery with the handlers it serves.
                        await inner.start(run_routing_loop, gateway.dataplane.queues)
                    for url in cfg.worker_urls:
                        if fleet.registry.conflict_for(url) is None:
                            try:
                                await gateway.registry.register(
                                    Registration(url=url, api_key=cfg.api_key), "cli"
                                )
                            except WorkerApiError:
                                # Several processes: another one registered it first (409).
                                if sharing is None:
                                    raise
                    if checker is not None and sharing is None:
                        await inner.start(checker.run)
                    if monitoring_enabled(cfg):
                        # Per process, never leased: samples are in memory only, and every
                        # process serves GET /workers rows of its own (smgrl/registry/loads.py).
                        await inner.start(gateway.loads.run)
                    metrics_url = None
                    if metrics_listeners is not None:
                        await inner.start(
                            serve_metrics, lambda: gateway.metrics.render(fleet.registry), metrics_listeners
                        )
                        sockname = metrics_listeners[0].socket.getsockname()
                        metrics_url = f"http://{_hostport(sockname)}/metrics"
                    http_done = trio.Event()

                    served = sockets
                    if private is not None:
                        served = Sockets(
                            secure_sockets=[],
                            insecure_sockets=[*sockets.insecure_sockets, private],
                            quic_sockets=[],
                        )

                    async def run_http(task_status=trio.TASK_STATUS_IGNORED) -> None:
                        for sock in served.insecure_sockets:
                            sock.listen(hc.backlog)
                        try:
                            await worker_serve(
                                wrap_app(app, hc.wsgi_max_body_size, None),
                                hc,
                                sockets=served,
                                shutdown_trigger=shutdown.wait,
                                task_status=task_status,
                            )
                        finally:
                            http_done.set()

                    urls = await inner.start(run_http)
                    if private is not None:
                        urls = urls[: len(sockets.insecure_sockets)]  # the private one last
                    inner.start_soon(_stop_watch, gateway, shutdown, stop_now, inner.cancel_scope)
                    task_status.started(Running(gateway, urls, metrics_url))
                    gctune.freeze_startup()  # the replayed state, the app: the process's own
                    if sharing is not None:
                        sharing.report_ready({"pid": os.getpid(), "metrics_url": metrics_url, "urls": urls})
                    log_event(
                        log,
                        "listening",
                        urls=",".join(urls),
                        metrics=metrics_url,
                        rl=cfg.rl.enabled,
                        pid=os.getpid(),
                        forward=gateway.forwarder.me.url if gateway.forwarder is not None else None,
                    )
                    # hypercorn returns only after its graceful shutdown (in-flight requests
                    # done or past the grace period); then the jobs, the health checker and the
                    # metrics listener have nothing left to serve.
                    await http_done.wait()
                    inner.cancel_scope.cancel()
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
                        mine = sharing.mine if sharing is not None else None
                        await record_interrupted(writer, fleet, "shutdown", only=mine)
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
    # Only the inner nursery: hypercorn and its handlers go, the journal writer stays for the
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


async def _in_scope(scopes: list, fn, *args, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run ``fn`` in a cancel scope appended to ``scopes`` (the caller cancels them all)."""
    with trio.CancelScope() as scope:
        scopes.append(scope)
        await fn(*args, task_status=task_status)


def _as_duty(start):
    """A duty for ``run_leased``: the service's ``run`` (a trio task taking ``task_status``)."""

    async def duty() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(start)

    return duty


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


def inherited_http(fd: int) -> Sockets:
    """The listening socket a ``--workers N`` supervisor bound and handed down (``smgrl/cluster/supervisor.py``):
    every worker accepts from the same socket, the kernel hands each connection to one of them."""
    sock = socket.socket(fileno=fd)
    sock.setblocking(False)
    return Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[])


def bind_http(hc: HyperConfig, cfg: Config) -> Sockets:
    """Bind the HTTP port now, before the journal is touched: a port in use is one line naming
    it, and nothing is written. Not listening yet (``run_http`` does, once the state is
    restored): until then a client is refused at once instead of waiting in the backlog."""
    try:
        sockets = hc.create_sockets()
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {_hostport((cfg.host, cfg.port))} (--port): {exc.strerror or exc}"
        ) from None
    return sockets


async def bind_metrics(cfg: Config) -> list[trio.SocketListener] | None:
    """The metrics listener's sockets (``--prometheus-port``, 0 picks a free port); None when
    ``prometheus_port`` is None (in-process gateways)."""
    if cfg.prometheus_port is None:
        return None
    host = cfg.prometheus_host or cfg.host
    try:
        return await trio.open_tcp_listeners(cfg.prometheus_port, host=host)
    except OSError as exc:
        raise StartupError(
            f"cannot listen on {_hostport((host, cfg.prometheus_port))} (--prometheus-port): {exc.strerror or exc}"
        ) from None


def _close_sockets(sockets: Sockets) -> None:
    for sock in sockets.insecure_sockets:
        sock.close()


def _hostport(sockname) -> str:
    host, port = sockname[0], sockname[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _forwarder(cfg: Config, store, sharing: Sharing, private: socket.socket) -> Forwarder:
    port = private.getsockname()[1]
    owner = owner_key(sharing.identity)
    me = Peer(sharing.identity, owner, socket.gethostname(), f"http://127.0.0.1:{port}", cfg.advertise_url)
    return Forwarder(store, me)


def _started_event(cfg: Config):
    return ev("gateway.started", version=__version__, pid=os.getpid(), config=cfg.scrubbed())


def _stopped_event(clean: bool, reason: str):
    return ev("gateway.stopped", clean=clean, reason=reason)

"""``smgrl launch --workers N``: N gateway processes on one port and one journal.

The supervisor (this process) does no gateway work. It binds the HTTP port (a port in use is one
line, exit 1, before any worker starts), starts N workers (``python -m smgrl launch`` with the same
flags) that inherit that listening socket (the kernel hands each new connection to one of them),
a group token for the journal's shared lock (``journal/lock.py``) and two pipes: ``ready`` (the
worker writes one JSON line once it listens: its pid and private metrics URL) and ``lifeline``
(the worker stops when the supervisor is gone, SIGKILL included: the pipe's end reads EOF).

* Metrics: the supervisor serves ``--prometheus-port``; a scrape fetches every worker's metrics
  (each worker listens on a free loopback port) and answers them as one exposition, every sample
  labelled ``gateway_worker="<index>"`` (sum over it for fleet totals).
* A worker that exits while the supervisor runs is restarted (after 1 s, or
  ``SMGRL_WORKER_RESTART_DELAY_SECS``); more than
  ``MAX_RESTARTS`` restarts within ``RESTART_WINDOW_SECS`` and the supervisor stops every worker
  and exits 1 (a worker that cannot start would otherwise restart forever).
* SIGINT/SIGTERM: forwarded to every worker (a second signal is forwarded too: the workers then
  stop waiting for requests in flight), the supervisor exits once they all have.

Workers run in their own session, so a terminal's Ctrl-C reaches the supervisor only, which
forwards it once.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
from collections import deque

import attrs
import trio

from smgrl.cluster.sharing import ENV_FD, ENV_GROUP, ENV_INDEX, ENV_LIFELINE_FD, ENV_READY_FD
from smgrl.core.errors import StartupError
from smgrl.core.ids import new_hex_id
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.supervisor")

MAX_RESTARTS = 5
RESTART_WINDOW_SECS = 60.0
RESTART_DELAY_SECS = 1.0
READY_TIMEOUT_SECS = 120.0


def restart_delay() -> float:
    """``SMGRL_WORKER_RESTART_DELAY_SECS`` (default 1): how long a dead worker stays down."""
    try:
        return max(0.0, float(os.environ.get("SMGRL_WORKER_RESTART_DELAY_SECS", RESTART_DELAY_SECS)))
    except ValueError:
        return RESTART_DELAY_SECS


SCRAPE_TIMEOUT_SECS = 5.0


@attrs.define(eq=False)
class _Worker:
    index: int
    proc: trio.Process | None = None
    metrics_url: str | None = None
    lifeline: int | None = None  # our end of the lifeline pipe


def child_args(argv: list[str]) -> list[str]:
    """The launch flags without ``--workers`` (each worker is a lone process of the group)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--workers":
            skip = True
            continue
        if arg.startswith("--workers="):
            continue
        out.append(arg)
    return out


class Supervisor:
    def __init__(self, cfg, args: list[str], workers: int) -> None:
        self.cfg = cfg
        self.args = child_args(args)
        self.count = workers
        self.group = new_hex_id()
        self.workers = [_Worker(i) for i in range(workers)]
        self.stopping = False
        self.restarts: deque[float] = deque()
        self.failed: str | None = None

    async def run(self) -> None:
        from smgrl.http.routes.metrics_server import serve_metrics
        from smgrl.runtime.listeners import bind_http, bind_metrics, hypercorn_config

        hc = hypercorn_config(self.cfg)
        sockets = bind_http(hc, self.cfg)
        sock = sockets.insecure_sockets[0]
        sock.listen(hc.backlog)
        sock.set_inheritable(True)
        self.fd = sock.fileno()
        metrics = await bind_metrics(self.cfg)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._signals, nursery.cancel_scope)
                # The first worker alone: it creates and migrates a new journal file (two
                # processes creating one at once would collide); then the others together.
                await self._start(self.workers[0])
                async with trio.open_nursery() as starting:
                    for worker in self.workers[1:] if not self.failed else ():
                        starting.start_soon(self._start, worker)
                if self.failed:
                    raise StartupError(self.failed)
                for worker in self.workers:
                    nursery.start_soon(self._watch, worker, nursery)
                metrics_url = None
                if metrics is not None:
                    await nursery.start(serve_metrics, self.render_metrics, metrics)
                    host, port = metrics[0].socket.getsockname()[:2]
                    metrics_url = f"http://{host}:{port}/metrics"
                host, port = sock.getsockname()[:2]
                log_event(
                    log,
                    "listening",
                    urls=f"http://{host}:{port}",
                    metrics=metrics_url,
                    workers=self.count,
                    pids=",".join(str(w.proc.pid) for w in self.workers if w.proc),
                    pid=os.getpid(),
                )
        finally:
            with trio.CancelScope(shield=True):
                await self._stop_all()
            sock.close()
            for listener in metrics or ():
                listener.socket.close()
        if self.failed:
            raise StartupError(self.failed)

    async def _start(self, worker: _Worker, *, restarting: bool = False) -> None:
        worker.metrics_url = None
        ready_r, ready_w = os.pipe()
        life_r, life_w = os.pipe()
        env = dict(os.environ)
        env.update(
            {
                ENV_GROUP: self.group,
                ENV_FD: str(self.fd),
                ENV_INDEX: str(worker.index),
                ENV_READY_FD: str(ready_w),
                ENV_LIFELINE_FD: str(life_r),
            }
        )
        # Each worker's own metrics listener, scraped by this process: a free loopback port, or
        # --worker-metrics-port + the worker's index.
        base = self.cfg.worker_metrics_port
        extra = [
            "--prometheus-port",
            str(base + worker.index if base else 0),
            "--prometheus-host",
            "127.0.0.1",
        ]
        cmd = [sys.executable, "-m", "smgrl", "launch", *self.args, *extra]
        try:
            worker.proc = await trio.lowlevel.open_process(
                cmd, env=env, pass_fds=(self.fd, ready_w, life_r), start_new_session=True
            )
        finally:
            os.close(ready_w)
            os.close(life_r)
        worker.lifeline = life_w
        line = b""
        with trio.move_on_after(READY_TIMEOUT_SECS):
            async with trio.lowlevel.FdStream(ready_r) as stream:
                while not line.endswith(b"\n"):
                    chunk = await stream.receive_some(4096)
                    if not chunk:
                        break
                    line += chunk
        try:
            info = json.loads(line)
        except ValueError:
            code = None
            with trio.move_on_after(10):  # it closed its end: it is exiting (or hung: no code)
                code = await worker.proc.wait()
            why = (
                f"gateway worker {worker.index} did not start"
                + (f" (exit code {code})" if code is not None else "")
                + ": its error is above"
            )
            if restarting:  # counted by _watch, which gives up past MAX_RESTARTS
                log_event(log, why, logging.ERROR)
            else:
                self.failed = self.failed or why
            return
        worker.metrics_url = info.get("metrics_url")

    async def _watch(self, worker: _Worker, nursery: trio.Nursery) -> None:
        while True:
            code = await worker.proc.wait()
            if self.stopping:
                return
            now = trio.current_time()
            self.restarts.append(now)
            while self.restarts and now - self.restarts[0] > RESTART_WINDOW_SECS:
                self.restarts.popleft()
            if len(self.restarts) > MAX_RESTARTS:
                self.failed = (
                    f"gateway workers exited {len(self.restarts)} times within {RESTART_WINDOW_SECS:g}s"
                    f" (worker {worker.index}: exit code {code}); stopping all"
                )
                log_event(log, "giving up", logging.ERROR, reason=self.failed)
                nursery.cancel_scope.cancel()
                return
            log_event(
                log,
                "gateway worker exited; restarting it",
                logging.WARNING,
                worker=worker.index,
                pid=worker.proc.pid,
                exit_code=code,
            )
            self._close_lifeline(worker)
            await trio.sleep(restart_delay())
            await self._start(worker, restarting=True)
            # One that exited before listening is counted as a restart on the next round.

    async def _signals(self, scope: trio.CancelScope) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                self.stopping = True
                self._signal_all(signal.SIGTERM)
                scope.cancel()  # _stop_all (shielded) waits for the workers

    def _signal_all(self, sig: int) -> None:
        for worker in self.workers:
            if worker.proc is not None and worker.proc.returncode is None:
                try:
                    worker.proc.send_signal(sig)
                except ProcessLookupError:
                    pass

    async def _stop_all(self) -> None:
        self.stopping = True
        self._signal_all(signal.SIGTERM)
        # A second signal to us while waiting is forwarded (the workers then stop waiting for
        # requests in flight); bounded: a worker still there after the grace period plus the
        # journal bookkeeping is killed.
        limit = self.cfg.shutdown_grace_period_secs + 20
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:

                async def forward() -> None:
                    async for _ in signals:
                        self._signal_all(signal.SIGTERM)

                nursery.start_soon(forward)
                with trio.move_on_after(limit):
                    for worker in self.workers:
                        if worker.proc is not None:
                            await worker.proc.wait()
                nursery.cancel_scope.cancel()
        self._signal_all(signal.SIGKILL)
        for worker in self.workers:
            self._close_lifeline(worker)

    def _close_lifeline(self, worker: _Worker) -> None:
        if worker.lifeline is not None:
            os.close(worker.lifeline)
            worker.lifeline = None

    async def render_metrics(self) -> bytes:
        """Every worker's metrics as one exposition, each sample labelled ``gateway_worker``."""
        from smgrl.cluster.metrics_merge import merge_expositions

        texts: dict[str, str] = {}

        async def scrape(worker: _Worker) -> None:
            if worker.metrics_url is None:
                return
            with trio.move_on_after(SCRAPE_TIMEOUT_SECS):
                try:
                    texts[str(worker.index)] = await _get(worker.metrics_url)
                except (OSError, ValueError, trio.BrokenResourceError):
                    pass  # a worker restarting: its samples are absent from this scrape

        async with trio.open_nursery() as nursery:
            for worker in self.workers:
                nursery.start_soon(scrape, worker)
        return merge_expositions(texts, label="gateway_worker").encode()


async def _get(url: str) -> str:
    """GET a worker's loopback metrics URL (http://host:port/metrics) and return the body."""
    import h11

    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    stream = await trio.open_tcp_stream(host.strip("[]"), int(port))
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        out = conn.send(h11.Request(method="GET", target="/" + path, headers=[("host", hostport)]))
        out += conn.send(h11.EndOfMessage())
        await stream.send_all(out)
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                return body.decode()


def run_supervisor(cfg, args: list[str], workers: int) -> None:
    """``smgrl launch --workers N`` (N > 1): see the module docstring."""
    from smgrl.runtime.startup import failure_line
    from smgrl.telemetry import logs

    logs.configure(cfg.log_level, cfg.log_json)
    import click

    try:
        trio.run(Supervisor(cfg, args, workers).run)
    except BaseException as exc:
        failure = failure_line(exc)
        if failure is None:
            raise
        logs.shutdown()
        click.echo(f"error: {failure.removeprefix('Configuration error: ')}", err=True)
        sys.exit(1)
    finally:
        logs.shutdown()

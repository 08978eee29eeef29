"""The gateway process ``smgrl launch`` runs (also PSRL's ``launch_router``): logging, the signal
watchers, ``serve`` under ``trio.run``; a known failure is one line on stderr, exit 1."""

from __future__ import annotations

import os
import signal
import sys

import click
import trio

from smgrl.cli.running import config_text
from smgrl.core.config import Config
from smgrl.runtime.startup import failure_line


def run_gateway(cfg: Config) -> None:
    from smgrl.runtime import gctune
    from smgrl.runtime.server import serve
    from smgrl.telemetry import logs

    logs.configure(cfg.log_level, cfg.log_json)

    from smgrl.cluster.sharing import Sharing

    # A --workers N worker (smgrl/cluster/supervisor.py started it): its group, socket and pipes.
    sharing = Sharing.from_env()
    gctune.tune()  # everything imported so far lives as long as the process (smgrl/runtime/gctune.py)

    async def main_task() -> None:
        shutdown, stop_now = trio.Event(), trio.Event()
        async with trio.open_nursery() as nursery:
            # The signal watcher sets ``shutdown`` (drain gracefully), then ``stop_now`` (stop
            # waiting); serve() returns once the journal is closed.
            nursery.start_soon(_watch_signals, shutdown, stop_now)
            if sharing is not None and sharing.lifeline_fd is not None:
                nursery.start_soon(_watch_lifeline, sharing.lifeline_fd, shutdown)
            await serve(cfg, shutdown=shutdown, stop_now=stop_now, sharing=sharing)
            nursery.cancel_scope.cancel()

    try:
        trio.run(main_task)
    except BaseException as exc:  # sorted below: known failures are one line, bugs a traceback
        failure = failure_line(exc)
        if failure is None:
            raise
        logs.shutdown()  # the log lines written before the failure come first
        click.echo(f"error: {config_text(failure)}", err=True)
        sys.exit(1)
    finally:
        logs.shutdown()  # every queued log line is written before the process exits


async def _watch_lifeline(fd: int, shutdown: trio.Event) -> None:
    """A --workers N worker stops gracefully when its supervisor is gone (SIGKILL included): the
    lifeline pipe, whose write end only the supervisor holds, then reads end-of-file."""
    async with trio.lowlevel.FdStream(fd) as stream:
        while await stream.receive_some(64):
            pass
    os.write(2, b"the --workers supervisor is gone: stopping\n")
    shutdown.set()


async def _watch_signals(shutdown: trio.Event, stop_now: trio.Event) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        count = 0
        async for _ in signals:
            count += 1
            if count == 1:
                shutdown.set()  # graceful: in-flight requests get the grace period
            elif count == 2:
                stop_now.set()  # stop waiting: serve() records open operations interrupted
            else:
                # A third signal while the (bounded, shielded) bookkeeping runs: leave now. The
                # journal survives a kill; the next start records open operations interrupted.
                os.write(2, b"error: stopped without closing the journal (third signal)\n")
                os._exit(1)

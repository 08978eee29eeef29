#!/usr/bin/env python3
"""Where a fan-out's time goes, phase by phase: a timeline inside the gateway.

Starts ``benchmarks/min_engine.py`` on N ports and one ``smgrl launch`` whose process is this
script (``--serve``): before the gateway starts, it wraps a few methods with clock reads, so each
fan-out records when it reached each phase. Then one client sends ``--fanouts`` sequential
label-selector fan-outs (``POST /v1/rl/engine/flush_cache?selector=bench=yes``, engines
registered through ``POST /workers``), as the independent harness does. Printed: the median of
each phase (wall time, and the gateway thread's CPU time), the median arrival of each engine's
answer after the intent was durable, and the client's own median, whose difference from the
phases' sum is the kernel, the HTTP parse before the app and the client itself.

    python benchmarks/fanout_phases.py [--engines 8] [--fanouts 600] [--journal :memory:]

``--journal :memory:`` keeps the journal in memory (nothing touches a file): the same code path
without SQLite, which bounds from below what any tuning of the journal's storage could give.

Phases (each ends where the next starts):

* ``server``: the request's bytes parsed until its app task starts;
* ``app layers``: the ASGI layers in front of the control plane's raw front;
* ``front``: the raw front (route, auth, body, targets) until the operation starts;
* ``intent``: ``control.started`` built, committed and applied (the first transaction);
* ``sends``: the engine requests written;
* ``engine round``: the answers collected, each recorded as it arrives;
* ``close``: the result, ``control.outcome`` x N, ``control.finished`` and the audit committed
  (the second transaction) and applied;
* ``answer``: the response rendered and written.

The clock reads cost about a microsecond each. Every process this starts is stopped by its PID;
everything listens on 127.0.0.1; every loop is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PHASES = ("server", "app layers", "front", "intent", "sends", "engine round", "close", "answer")
MARKS = ("read", "app", "front", "started", "durable", "sent", "collected", "closed", "written")


def serve(out_path: str, argv: list[str]) -> None:
    """The gateway process: hooks in, then ``smgrl launch``; the timeline is written at exit."""
    from smgrl.control import service
    from smgrl.http.fronts import rl_front
    from smgrl.http.server import connection
    from smgrl.upstream import batch

    wall, cpu = time.perf_counter, time.thread_time
    rows: list[dict] = []
    now: dict = {}

    def mark(name: str) -> None:
        now.setdefault(name, (wall(), cpu()))

    conn = connection.ClientConnection
    feed, app = conn._feed, conn._app

    async def _feed(self, data):
        if b"/v1/rl/engine/" in data:
            now.clear()
            now["answers"] = []
            mark("read")
        return await feed(self, data)

    async def _app(self, cycle, scope):
        mark("app")
        return await app(self, cycle, scope)

    front = rl_front.EngineFront.__call__

    async def _front(self, scope, receive, send):
        mark("front")
        await front(self, scope, receive, send)
        if "written" in now and "read" in now:
            rows.append(dict(now))

    svc = service.ControlService
    start, durable, finish = svc._start, svc._intent_durable, svc._finish

    async def _start(self, *a, **k):
        mark("started")
        return await start(self, *a, **k)

    async def _durable(self, op):
        await durable(self, op)
        mark("durable")

    async def _finish(self, *a, **k):
        mark("collected")
        result = await finish(self, *a, **k)
        mark("closed")
        return result

    wait = batch.Batch.wait

    async def _wait(self, *a, **k):
        mark("sent")
        done = await wait(self, *a, **k)
        if "answers" in now:
            now["answers"] += [wall()] * len(done)
        return done

    write_body = conn.write_body

    async def _write_body(self, cycle, body, more):
        await write_body(self, cycle, body, more)
        if not more:
            mark("written")

    conn._feed, conn._app, conn.write_body = _feed, _app, _write_body
    rl_front.EngineFront.__call__ = _front
    svc._start, svc._intent_durable, svc._finish = _start, _durable, _finish
    batch.Batch.wait = _wait

    from smgrl.cli.entry import main

    sys.argv = ["smgrl", "launch", *argv]
    try:
        main()
    finally:
        with open(out_path, "w") as f:
            json.dump(rows, f)


def summarise(rows: list[dict], client_ms: list[float]) -> str:
    rows = [r for r in rows if all(m in r for m in MARKS)]
    lines = ["| phase | wall us (median) | CPU us (median) |", "|---|---|---|"]
    total_wall = total_cpu = 0.0
    for phase, a, b in zip(PHASES, MARKS[:-1], MARKS[1:], strict=True):
        w = statistics.median(r[b][0] - r[a][0] for r in rows) * 1e6
        c = statistics.median(r[b][1] - r[a][1] for r in rows) * 1e6
        total_wall, total_cpu = total_wall + w, total_cpu + c
        lines.append(f"| {phase} | {w:.0f} | {c:.0f} |")
    lines.append(f"| sum of the phases | {total_wall:.0f} | {total_cpu:.0f} |")
    lines.append(f"| the client's request, end to end | {statistics.median(client_ms) * 1000:.0f} | |")
    n = min(len(r["answers"]) for r in rows)
    arrivals = [statistics.median(r["answers"][k] - r["durable"][0] for r in rows) * 1e6 for k in range(n)]
    sent = statistics.median(r["sent"][0] - r["durable"][0] for r in rows) * 1e6
    lines.append("")
    lines.append(
        f"after the intent was durable: requests written by {sent:.0f} us; answers recorded at "
        + ", ".join(f"{a:.0f}" for a in arrivals)
        + f" us ({len(rows)} fan-outs)"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--fanouts", type=int, default=600)
    ap.add_argument("--journal", default=None, help="the gateway's --journal (default: a file here)")
    ap.add_argument("--serve", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve[0], args.serve[1:])
        return

    from benchmarks.fanout_compare import Client, register, start_min_engines
    from smgrl.demo.procs import Child, free_port, wait_for_workers

    with (
        tempfile.TemporaryDirectory(prefix="smgrl-phases-") as work,
        open(os.path.join(work, "log.txt"), "w") as log,
    ):
        engines, urls = start_min_engines(args.engines, log)
        gateway = None
        try:
            port = free_port()
            out = os.path.join(work, "timeline.json")
            argv = [sys.executable, os.path.abspath(__file__), "--serve", out, "--host", "127.0.0.1"]
            argv += ["--port", str(port), "--prometheus-port", str(free_port()), "--enable-rl"]
            argv += ["--disable-health-check", "--disable-load-monitoring", "--log-level", "warn"]
            argv += ["--journal", args.journal or os.path.join(work, "journal.db")]
            gateway = Child(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), "smgrl")
            deadline = time.monotonic() + 30
            while True:
                try:
                    register(port, urls)
                    break
                except OSError:
                    if time.monotonic() > deadline or gateway.proc.poll() is not None:
                        raise RuntimeError("the gateway did not start") from None
                    time.sleep(0.1)
            wait_for_workers(f"http://127.0.0.1:{port}", len(urls))
            client = Client(port, "/v1/rl/engine/flush_cache?selector=bench%3Dyes")
            for _ in range(min(60, args.fanouts)):
                client.once()
            client_ms = [client.once() for _ in range(args.fanouts)]
        finally:
            if gateway is not None:
                gateway.stop()
            engines.stop()
        with open(out) as f:
            rows = json.load(f)
        journal = args.journal or "a SQLite file"
        print(
            f"{args.engines} engines, {args.fanouts} sequential fan-outs, journal {journal}; load {os.getloadavg()}"
        )
        print(summarise(rows[-args.fanouts :], client_ms))


if __name__ == "__main__":
    main()

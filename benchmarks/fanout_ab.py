#!/usr/bin/env python3
"""Two smgrl gateways, A and B, interleaved on one set of engines: what a journal change costs.

Starts ``benchmarks/min_engine.py`` on N ports and two ``smgrl launch`` processes that differ
only in their journal: ``--a-journal`` / ``--b-journal`` (default: a fresh SQLite file each;
``:memory:`` keeps it in memory) and ``--a-sql`` / ``--b-sql`` (SQL statements, ``;``-separated,
run on that gateway's fresh SQLite journal before the gateway opens it: an index dropped or
changed, say). Both register the engines through ``POST /workers`` with a label, then each sends
``--fanouts`` sequential label-selector fan-outs, alternating A and B, the order reversed every
other fan-out. Printed per gateway: p50 and p99 of the client's time, and CPU per fan-out from
``/proc``, both taken over the same interval, so load on the machine weighs on both alike.

    python benchmarks/fanout_ab.py [--engines 8] [--fanouts 800] [--b-journal :memory:]
    python benchmarks/fanout_ab.py --b-sql "DROP INDEX idx_events_ts"

Two interpreters side by side share the cores' caches: every figure is higher than with one
gateway alone (about 1.5x here), so read the difference between A and B, not the values.
Every process this starts is stopped by its PID; everything listens on 127.0.0.1; every loop is
bounded.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.fanout_compare import Client, cpu_seconds, pct, register, start_min_engines
from smgrl.demo.procs import Child, free_port, wait_for_workers

SELECTED = "/v1/rl/engine/flush_cache?selector=bench%3Dyes"
WARMUP = 100


def prepare(path: str, sql: str) -> None:
    """A fresh journal at ``path`` (the store's own schema), then ``sql`` run on it."""
    from journal import SqliteStore

    SqliteStore.open(path).close()
    with sqlite3.connect(path) as conn:
        for statement in filter(None, (s.strip() for s in sql.split(";"))):
            conn.execute(statement)


def start(work: str, name: str, journal: str | None, sql: str, log) -> tuple[Child, int]:
    path = journal or os.path.join(work, f"{name}.db")
    if sql:
        if path == ":memory:":
            raise SystemExit(f"--{name}-sql needs a file journal")
        prepare(path, sql)
    port = free_port()
    argv = [sys.executable, "-m", "smgrl", "launch", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--prometheus-port", str(free_port()), "--enable-rl", "--disable-health-check"]
    argv += ["--disable-load-monitoring", "--log-level", "warn", "--journal", path]
    return Child(
        subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT), f"smgrl-{name}"
    ), port


def ready(child: Child, port: int, urls: list[str]) -> Client:
    deadline = time.monotonic() + 30
    while True:  # bounded by the deadline: the gateway is starting
        try:
            register(port, urls)
            break
        except OSError:
            if time.monotonic() > deadline or child.proc.poll() is not None:
                raise RuntimeError(f"{child.name} did not start") from None
            time.sleep(0.1)
    wait_for_workers(f"http://127.0.0.1:{port}", len(urls))
    return Client(port, SELECTED)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--fanouts", type=int, default=800, help="per gateway")
    for name in ("a", "b"):
        ap.add_argument(f"--{name}-journal", default=None, help="the gateway's --journal (default: a file)")
        ap.add_argument(f"--{name}-sql", default="", help="SQL run on its fresh journal first")
    args = ap.parse_args()
    labels = {"a": (args.a_journal, args.a_sql), "b": (args.b_journal, args.b_sql)}

    with (
        tempfile.TemporaryDirectory(prefix="smgrl-ab-") as work,
        open(os.path.join(work, "log.txt"), "w") as log,
    ):
        engines, urls = start_min_engines(args.engines, log)
        gateways: list[tuple[Child, int]] = []
        try:
            for name, (journal, sql) in labels.items():
                gateways.append(start(work, name, journal, sql, log))
            clients = [ready(child, port, urls) for child, port in gateways]
            for _ in range(WARMUP):
                for client in clients:
                    client.once()
            times: list[list[float]] = [[], []]
            before = [cpu_seconds(child.pid) for child, _ in gateways]
            for k in range(args.fanouts):
                for i in (0, 1) if k % 2 == 0 else (1, 0):
                    times[i].append(clients[i].once())
            after = [cpu_seconds(child.pid) for child, _ in gateways]
        finally:
            for child, _ in gateways:
                child.stop()
            engines.stop()
    print(f"{args.engines} engines, {args.fanouts} fan-outs per gateway, interleaved; load {os.getloadavg()}")
    print("| gateway | journal | SQL first | p50 us | p99 us | CPU us per fan-out |")
    print("|---|---|---|---|---|---|")
    for i, (name, (journal, sql)) in enumerate(labels.items()):
        cpu = (after[i] - before[i]) * 1e6 / args.fanouts
        p50, p99 = statistics.median(times[i]) * 1000, pct(times[i], 0.99) * 1000
        print(
            f"| {name.upper()} | {journal or 'a SQLite file'} | {sql or '-'} | {p50:.0f} | {p99:.0f} | {cpu:.0f} |"
        )


if __name__ == "__main__":
    main()

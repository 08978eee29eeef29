"""Several writers on one journal: append rate with 1 and 2 processes appending, and
the cross-process visibility lag, on SQLite and on PostgreSQL.

    .venv/bin/python benchmarks/journal_shared.py                  # both stores
    .venv/bin/python benchmarks/journal_shared.py --stores sqlite --seconds 3 --lag-events 500

(a) Append rate. N processes (1, then 2) each call ``store.append_batch`` in a loop for
    ``--seconds`` seconds, with ``--batch`` events per transaction (1: the gateway when idle, each
    append its own commit; 32: under load, group commit), all starting together. Reported: events
    per second summed over the processes, and the chain verified afterwards.
    Also: where a transaction's time goes, per process count: getting the write lock vs holding
    it (split where the head read each store does first inside its write transaction returns), how much
    of the wall time the lock was held, the appenders' CPU / wall and their involuntary context
    switches per transaction (the machine taking their core away, lock held or not).
(b) Visibility lag. One process appends ``--lag-events`` events, one every ~``--gap-ms``; each
    carries its send time (CLOCK_MONOTONIC, shared by the processes of one host). Another process
    tails with ``ChangeWatcher`` (SQLite: ``PRAGMA data_version`` polled every 5 ms; PostgreSQL:
    LISTEN/NOTIFY) and ``store.read(after_seq=...)``, and records when each event was read:
    p50 / p99 / max of (read - sent).

PostgreSQL: a throwaway server from the system's binaries (tests/journal/pg_harness.py), on
loopback, fsync off (as in the tests: this measures the protocol and locking, not the disk).
SQLite: WAL, synchronous=NORMAL (the default), in a temp dir. Everything is deleted at the end.
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
from pathlib import Path

_HERE = Path(__file__).resolve().parent
# Run as a script, benchmarks/journal.py would shadow the journal package: the checkout first.
sys.path[:] = [str(_HERE.parent), str(_HERE.parent / "tests" / "journal")] + [
    p for p in sys.path if Path(p or ".").resolve() != _HERE
]

from journal import Append, open_store
from smgrl.events import ControlOutcome


def _event(tag: str) -> ControlOutcome:
    return ControlOutcome(
        op_id=tag, worker_id="w", url="http://w:8000", status=200, latency_ms=1, excerpt="ok"
    )


# -- child roles ----------------------------------------------------------------------------------


def child_append(target: str, name: str, seconds: float, batch: int) -> None:
    import resource

    store = open_store(target)
    # When the write lock was surely held: both stores read the head first thing inside their
    # write transaction, after BEGIN IMMEDIATE / the advisory lock (PostgreSQL: in the same round
    # trip as the lock), so the return of that read splits a transaction into getting the lock
    # (with that round trip) and holding it for the rest.
    head, locked = store._head, []

    def timed_head(conn):
        got = head(conn)
        locked.append(time.perf_counter())
        return got

    store._head = timed_head
    print("ready", flush=True)
    sys.stdin.readline()
    n, end = 0, time.monotonic() + seconds
    took: list[float] = []
    waits: list[float] = []
    held: list[float] = []
    usage0, cpu0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), time.perf_counter()
    while time.monotonic() < end:
        items = [Append(name, _event(f"{name}-{n + i}")) for i in range(batch)]
        t0 = time.perf_counter()
        store.append_batch(items, wait=30)
        t1 = time.perf_counter()
        took.append((t1 - t0) * 1000)
        waits.append((locked[-1] - t0) * 1000)
        held.append((t1 - locked[-1]) * 1000)
        n += batch
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    store.close()
    print(
        json.dumps(
            {
                "events": n,
                "ms": took,
                "wait_ms": waits,
                "held_ms": held,
                "cpu_s": cpu,
                "wall_s": wall,
                "preempted": usage.ru_nivcsw - usage0.ru_nivcsw,  # involuntary context switches
            }
        ),
        flush=True,
    )


def child_lag_writer(target: str, count: int, gap_ms: float) -> None:
    import random

    store = open_store(target)
    print("ready", flush=True)
    sys.stdin.readline()
    for _ in range(count):
        time.sleep(random.uniform(0.5, 1.5) * gap_ms / 1000)  # paced like sparse control-plane events
        store.append_batch([Append("lag", _event(str(time.monotonic_ns())))], wait=30)
    store.close()
    print("done", flush=True)


def child_lag_reader(target: str, count: int) -> None:
    import trio

    from journal import ChangeWatcher

    async def main() -> list[float]:
        store = open_store(target, readonly=True)
        watcher = ChangeWatcher(store)
        lags: list[float] = []
        position = store.last_seq()
        token = store.change_token()
        print("ready", flush=True)
        while len(lags) < count:
            token = await watcher.wait(token)
            for rec in store.read(after_seq=position):
                lags.append((time.monotonic_ns() - int(rec.event.op_id)) / 1e6)
                position = rec.seq
        watcher.close()
        store.close()
        return lags

    print(json.dumps({"lags_ms": trio.run(main)}), flush=True)


# -- the parent -----------------------------------------------------------------------------------


def _spawn(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, __file__, "--child", *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def append_rate(target: str, procs: int, seconds: float, batch: int) -> tuple[float, list[float]]:
    children = [_spawn("append", target, f"p{i}", str(seconds), str(batch)) for i in range(procs)]
    for c in children:
        assert c.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    for c in children:
        c.stdin.write("go\n")
        c.stdin.flush()
    results = [json.loads(c.stdout.readline()) for c in children]
    elapsed = time.monotonic() - t0
    for c in children:
        c.wait(60)
    DETAIL.append((target, procs, batch, elapsed, os.getloadavg()[0], results))
    return sum(r["events"] for r in results) / elapsed, [ms for r in results for ms in r["ms"]]


DETAIL: list[tuple] = []  # (target, procs, batch, elapsed, load average, per-process results)


def detail_rows(name: str) -> list[str]:
    """Where a transaction's time goes: waiting for the write lock vs holding it, and how busy
    the machine left the appenders (CPU / wall, involuntary context switches per transaction)."""
    rows = []
    for _target, procs, batch, elapsed, load, results in DETAIL:
        waits = [ms for r in results for ms in r["wait_ms"]]
        held = [ms for r in results for ms in r["held_ms"]]
        txns = len(held)
        busy = sum(held) / 1000 / elapsed  # of the wall time, how much the lock was held (1.0: always)
        cpu = sum(r["cpu_s"] for r in results) / sum(r["wall_s"] for r in results)
        preempted = sum(r["preempted"] for r in results) / max(1, txns)
        rows.append(
            f"| {name} | {batch} | {procs} | {txns} | {pct(waits, 50):.2f} / {pct(waits, 99):.2f} |"
            f" {pct(held, 50):.2f} / {pct(held, 99):.2f} | {busy:.2f} | {cpu:.2f} | {preempted:.2f} | {load:.1f} |"
        )
    DETAIL.clear()
    return rows


def lag(target: str, count: int, gap_ms: float) -> list[float]:
    reader = _spawn("lag-reader", target, str(count))
    writer = _spawn("lag-writer", target, str(count), str(gap_ms))
    assert reader.stdout.readline().strip() == "ready"
    assert writer.stdout.readline().strip() == "ready"
    writer.stdin.write("go\n")
    writer.stdin.flush()
    lags = json.loads(reader.stdout.readline())["lags_ms"]
    writer.wait(120)
    reader.wait(60)
    return lags


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def run_store(name: str, make_target, args) -> list[str]:
    rows = []
    for batch in args.batch:
        rates, took = {}, {}
        for procs in (1, 2):
            target = make_target(f"rate_{batch}_{procs}")
            open_store(target).close()
            rates[procs], took[procs] = append_rate(target, procs, args.seconds, batch)
            with open_store(target) as store:
                report = store.verify()
                assert report.ok, report
        rows.append(
            f"| {name} | {batch} | {rates[1]:,.0f} | {rates[2]:,.0f} | {rates[2] / rates[1]:.2f} |"
            f" {pct(took[1], 50):.2f} / {pct(took[1], 99):.2f} | {pct(took[2], 50):.2f} / {pct(took[2], 99):.2f} |"
        )
    target = make_target("lag")
    open_store(target).close()
    lags = lag(target, args.lag_events, args.gap_ms)
    lag_row = f"| {name} | {len(lags)} | {pct(lags, 50):.2f} | {pct(lags, 99):.2f} | {max(lags):.2f} |"
    DETAIL_ROWS.extend(detail_rows(name))
    return rows + [lag_row]


DETAIL_ROWS: list[str] = []


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        role, *rest = sys.argv[2:]
        if role == "append":
            child_append(rest[0], rest[1], float(rest[2]), int(rest[3]))
        elif role == "lag-writer":
            child_lag_writer(rest[0], int(rest[1]), float(rest[2]))
        else:
            child_lag_reader(rest[0], int(rest[1]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", nargs="+", default=["sqlite", "postgres"], choices=["sqlite", "postgres"])
    parser.add_argument("--seconds", type=float, default=3.0, help="append loop length per run")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="events per transaction")
    parser.add_argument("--lag-events", type=int, default=400)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    args = parser.parse_args()
    rate_rows: list[str] = []
    lag_rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for store in args.stores:
            if store == "sqlite":
                out = run_store("SQLite", lambda tag: os.path.join(tmp, f"{tag}.db"), args)
            else:
                import pg_harness

                why = pg_harness.unavailable()
                if why:
                    print(f"PostgreSQL skipped: {why}", file=sys.stderr)
                    continue
                server = pg_harness.PgServer().start()
                try:
                    out = run_store("PostgreSQL", server.url, args)
                finally:
                    server.stop()
            rate_rows += out[:-1]
            lag_rows.append(out[-1])
    print(f"## Append rate ({args.seconds:g} s per run, events/s summed over the processes)\n")
    print(
        "| store | events per transaction | 1 process | 2 processes | 2 / 1 |"
        " commit ms p50 / p99, 1 process | 2 processes |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rate_rows))
    print("\n## Cross-process visibility lag (append in one process -> read by another's tail), ms\n")
    print("| store | events | p50 | p99 | max |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(lag_rows))
    print("\n## Where the append time goes (per transaction, over the processes), ms\n")
    print(
        "| store | events per transaction | processes | transactions | lock wait p50 / p99 |"
        " lock held p50 / p99 | lock held / wall | appender CPU / wall | involuntary switches per transaction | load average |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(DETAIL_ROWS))


if __name__ == "__main__":
    main()

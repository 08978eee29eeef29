#!/usr/bin/env python3
"""Fan-out and discovery latency: smgrl vs SMG 1.13.0 vs direct calls, side by side in one run.

For each fleet size N (default 1, 8, 64, 256) on the same fake SGLang engines (one fake process on
loopback), this starts each gateway with ``--worker-urls`` of the first N engines and measures,
one request at a time over one kept-alive connection:

* ``POST /v1/rl/engine/flush_cache?selector=engine=sglang`` (a fan-out to all N);
* ``GET /v1/rl/workers`` (discovery);
* the same N ``POST /flush_cache`` calls made directly from this process (trio, smgrl's upstream
  pool, all N concurrently): the floor any gateway adds to.

SMG is measured when ``smg`` is installed (``--smg-bin``, default: on PATH or /tmp/smgvenv/bin/smg).
smgrl variants: the journal on a SQLite file (the default), and ``--journal :memory:`` to show what
the file costs. Prints a markdown table with p50/p99 and the smgrl/SMG ratio. Every process this
starts is stopped by its PID; everything listens on 127.0.0.1; every loop is bounded.

    python benchmarks/fanout.py [--sizes 1,8,64,256] [--rounds 200] [--out docs/benchmarks-fanout.md]

Before/after in one run (``--baseline-src DIR``, e.g. ``git archive main | tar -x -C DIR``): this
checkout's smgrl, the one in DIR and SMG run at once, and one client alternates blocks of 25
fan-outs (then discovery polls) between them, in an order reversed every other block, so load on
the machine hits each alike. Besides
latency it reports each gateway's CPU per request (``/proc/<pid>/stat``), which a busy machine
disturbs less than latency.

    python benchmarks/fanout.py --baseline-src /tmp/base --sizes 1,8,64 --rounds 400

smgrl, SMG and the direct fan-out interleaved on a minimal stdlib engine (``min_engine.py``), with
the added time (p50 minus direct's) and the spread across rounds (``fanout_compare.py``):

    python benchmarks/fanout.py --compare --sizes 8,64 --rounds 10 --iters 30 [--register labels]
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import trio

from smgrl.demo.procs import Child, free_port, start_fake_engines, start_gateway, wait_for_workers
from smgrl.upstream import PoolSet

from fanout_compare import compare, interleave, pct, start_gateways  # isort: skip - this folder

FANOUT = "/v1/rl/engine/flush_cache?selector=engine%3Dsglang"


def requester(port: int, method: str, path: str) -> tuple[Callable[[], float], Callable[[], None]]:
    """(one request over a kept-alive connection, returning its latency in ms; close)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def once() -> float:
        t0 = time.perf_counter()
        conn.request(method, path, body=b"" if method == "POST" else None)
        resp = conn.getresponse()
        resp.read()
        dt = (time.perf_counter() - t0) * 1000
        if resp.status not in (200, 207):
            raise RuntimeError(f"{method} {path} answered {resp.status}")
        return dt

    return once, conn.close


def timed_requests(port: int, method: str, path: str, rounds: int, warmup: int = 10) -> list[float]:
    once, close = requester(port, method, path)
    try:
        for _ in range(warmup):
            once()
        return [once() for _ in range(rounds)]
    finally:
        close()


def direct(urls: list[str], rounds: int, warmup: int = 10) -> list[float]:
    async def run() -> list[float]:
        pools = PoolSet()
        samples = []

        async def one(url: str) -> None:
            resp, _, _ = await pools.get(url).request("POST", "/flush_cache", headers=[(b"accept", b"*/*")])
            assert resp.status == 200

        for i in range(warmup + rounds):
            t0 = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for url in urls:
                    nursery.start_soon(one, url)
            if i >= warmup:
                samples.append((time.perf_counter() - t0) * 1000)
        await pools.aclose()
        return samples

    return trio.run(run)


LOG_LEVEL = ["--log-level", "info"]  # both gateways' (--log-level)


def start_smg(binary: str, urls: list[str], log) -> tuple[Child, int]:
    import subprocess

    port = free_port()
    argv = [
        binary,
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *(["--worker-urls", *urls] if urls else []),
        *LOG_LEVEL,
        "--enable-rl",
        "--disable-health-check",
        "--disable-circuit-breaker",
        "--disable-load-monitoring",
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        str(free_port()),
    ]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    return Child(proc, "smg"), port


METRICS_PORTS: dict[int, int] = {}  # smgrl gateway port -> its metrics port


def journal_transactions(port: int) -> float:
    """``smgrl_journal_transactions_total`` of the smgrl gateway listening on ``port``."""
    conn = http.client.HTTPConnection("127.0.0.1", METRICS_PORTS[port], timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    for line in text.splitlines():
        if line.startswith("smgrl_journal_transactions_total "):
            return float(line.split()[1])
    raise RuntimeError("smgrl_journal_transactions_total is not exposed")


def start_smgrl(urls: list[str], journal: str, log) -> tuple[Child, int]:
    port = free_port()
    METRICS_PORTS[port] = metrics_port = free_port()
    child = start_gateway(
        [
            "--enable-rl",
            "--disable-health-check",
            "--disable-load-monitoring",
            *(["--worker-urls", *urls] if urls else []),
            *LOG_LEVEL,
            "--journal",
            journal,
            "--prometheus-port",
            str(metrics_port),
        ],
        port=port,
        log=log,
    )
    return child, port


def start_smgrl_src(urls: list[str], journal: str, src: str, log) -> tuple[Child, int]:
    """smgrl from the checkout ``src`` (its directory first on sys.path)."""
    import subprocess

    port = free_port()
    argv = [sys.executable, "-m", "smgrl", "launch", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--enable-rl", "--disable-health-check", "--disable-load-monitoring", *LOG_LEVEL]
    argv += ["--worker-urls", *urls] if urls else []
    argv += ["--journal", journal, "--prometheus-port", str(free_port())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=src)
    return Child(proc, "smgrl-baseline"), port


def interleaved(args, smg: str | None) -> None:
    """Every gateway up at once; blocks of 25 requests alternate between them."""
    sizes = [int(s) for s in args.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="smgrl-bench-fanout-")
    log = open(os.path.join(work, "gateways.log"), "w")  # noqa: SIM115 - shared by every child, closed in finally
    fakes, all_urls = start_fake_engines("sglang", max(sizes))
    block = 25
    lines = [
        "| engines | request | gateway | p50 ms | p99 ms | CPU us/req | p50 / SMG | CPU / SMG |",
        "|---|---|---|---|---|---|---|---|",
    ]
    try:
        for n in sizes:
            urls = all_urls[:n]
            children = {}
            try:
                starters = (start_smgrl, start_smgrl_src, start_smg)
                start_gateways(children, urls, work, n, log, args.baseline_src, smg, starters)
                for child, port in children.values():
                    wait_for_workers(f"http://127.0.0.1:{port}", 1 if n == 1 else n, child=child, timeout=120)
                for what, method, path in (
                    ("fan-out", "POST", FANOUT),
                    ("discovery", "GET", "/v1/rl/workers"),
                ):
                    run, closers = {}, []
                    for name, (_, port) in children.items():
                        once, close = requester(port, method, path)
                        run[name] = once
                        closers.append(close)
                        for _ in range(10):  # warm-up: the connection, caches
                            once()
                    pids = {name: child.proc.pid for name, (child, _) in children.items()}
                    try:
                        lat, _, cpu = interleave(run, pids, max(1, args.rounds // block), block)
                    finally:
                        for close in closers:
                            close()
                    ref = children.get("SMG 1.13.0") and "SMG 1.13.0"
                    for name in children:
                        p50 = statistics.median(lat[name])
                        us = cpu[name] / len(lat[name]) * 1e6
                        vs = ""
                        if ref:
                            ref_us = cpu[ref] / len(lat[ref]) * 1e6
                            vs = f" {p50 / statistics.median(lat[ref]):.2f}x | {us / ref_us:.2f}x |"
                        else:
                            vs = " | |"
                        lines.append(
                            f"| {n} | {what} | {name} | {p50:.2f} | {pct(lat[name], 0.99):.2f} | {us:.0f} |{vs}"
                        )
                    print("\n".join(lines[-len(children) :]), file=sys.stderr)
            finally:
                for child, _ in children.values():
                    child.stop()
    finally:
        fakes.stop()
        log.close()
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    shutil.rmtree(work, ignore_errors=True)


def find_smg(explicit: str | None) -> str | None:
    for cand in (explicit, shutil.which("smg"), "/tmp/smgvenv/bin/smg"):
        if cand and os.path.exists(cand):
            return cand
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,8,64,256")
    ap.add_argument("--rounds", type=int, default=None, help="default 200; 10 with --compare")
    ap.add_argument(
        "--compare", action="store_true", help="smgrl, SMG and direct interleaved (fanout_compare.py)"
    )
    ap.add_argument("--engine", choices=["min", "smgrl"], default="min", help="--compare's engines")
    ap.add_argument("--register", choices=["urls", "labels"], default="urls", help="--compare's registration")
    ap.add_argument("--iters", type=int, default=30, help="--compare: fan-outs per participant and round")
    ap.add_argument("--concurrency", type=int, default=32, help="--compare: the direct fan-out's bound")
    ap.add_argument("--log-level", default="info", help="both gateways' log level")
    ap.add_argument("--smg-bin", default=None)
    ap.add_argument("--out", default=None, help="also write the table to this file")
    ap.add_argument("--baseline-src", default=None, help="interleave with the smgrl of this checkout")
    args = ap.parse_args()
    LOG_LEVEL[1] = args.log_level
    sizes = [int(s) for s in args.sizes.split(",")]
    smg = find_smg(args.smg_bin)
    if args.compare:
        args.rounds = args.rounds or 10
        compare(args, smg, start_smg, start_smgrl, start_smgrl_src)
        return
    args.rounds = args.rounds or 200
    if args.baseline_src:
        interleaved(args, smg)
        return
    work = tempfile.mkdtemp(prefix="smgrl-bench-fanout-")
    log = open(os.path.join(work, "gateways.log"), "w")  # noqa: SIM115 - shared by every child, closed in finally
    fakes, all_urls = start_fake_engines("sglang", max(sizes))
    rows = []
    try:
        for n in sizes:
            urls = all_urls[:n]
            rounds = max(30, args.rounds if n <= 64 else args.rounds // 4)
            result = {"n": n, "direct": direct(urls, rounds)}
            variants = [
                ("smgrl", lambda urls=urls, n=n: start_smgrl(urls, os.path.join(work, f"j{n}.db"), log)),
                ("smgrl_mem", lambda urls=urls: start_smgrl(urls, ":memory:", log)),
            ]
            if smg:
                variants.insert(0, ("smg", lambda urls=urls: start_smg(smg, urls, log)))
            for name, starter in variants:
                child, port = starter()
                try:
                    wait_for_workers(f"http://127.0.0.1:{port}", 1 if n == 1 else n, child=child, timeout=120)
                    before = journal_transactions(port) if name != "smg" else 0.0
                    result[f"{name}_fanout"] = timed_requests(port, "POST", FANOUT, rounds)
                    if name != "smg":
                        # timed_requests sends `warmup` (10) extra fan-outs before the timed rounds.
                        spent = journal_transactions(port) - before
                        result[f"{name}_tx"] = spent / (rounds + 10)
                    result[f"{name}_workers"] = timed_requests(port, "GET", "/v1/rl/workers", rounds)
                finally:
                    child.stop()
            rows.append(result)
            print(f"N={n} done", file=sys.stderr)
    finally:
        fakes.stop()
        log.close()
    table = render(rows, smg is not None)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    shutil.rmtree(work, ignore_errors=True)


def render(rows: list[dict], with_smg: bool) -> str:
    def cell(samples):
        return f"{statistics.median(samples):.2f} / {pct(samples, 0.99):.2f}"

    lines = ["Fan-out of `POST flush_cache` (ms, p50 / p99):", ""]
    head = "| engines | direct | smgrl | smgrl (journal in memory) |" + (
        " SMG 1.13.0 | smgrl/SMG p50 |" if with_smg else ""
    )
    lines += [head, "|" + "---|" * head.count("|")[:-1] if False else "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        line = (
            f"| {r['n']} | {cell(r['direct'])} | {cell(r['smgrl_fanout'])} | {cell(r['smgrl_mem_fanout'])} |"
        )
        if with_smg:
            ratio = statistics.median(r["smgrl_fanout"]) / statistics.median(r["smg_fanout"])
            line += f" {cell(r['smg_fanout'])} | {ratio:.2f}x |"
        lines.append(line)
    lines += ["", "Discovery `GET /v1/rl/workers` (ms, p50 / p99):", ""]
    head = "| engines | smgrl |" + (" SMG 1.13.0 | smgrl/SMG p50 |" if with_smg else "")
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        line = f"| {r['n']} | {cell(r['smgrl_workers'])} |"
        if with_smg:
            ratio = statistics.median(r["smgrl_workers"]) / statistics.median(r["smg_workers"])
            line += f" {cell(r['smg_workers'])} | {ratio:.2f}x |"
        lines.append(line)
    lines += [
        "",
        "Journal transactions per fan-out (`smgrl_journal_transactions_total`): "
        + ", ".join(f"{r['n']} engines {r['smgrl_tx']:.2f}" for r in rows),
    ]
    journal_cost = [
        statistics.median(r["smgrl_fanout"]) / statistics.median(r["smgrl_mem_fanout"]) - 1 for r in rows
    ]
    lines += [
        "",
        "Journal cost (SQLite file vs in-memory journal, fan-out p50): "
        + ", ".join(f"{r['n']} engines {c * 100:+.0f}%" for r, c in zip(rows, journal_cost)),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()

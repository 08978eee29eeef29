#!/usr/bin/env python3
"""Load: N fan-outs over E engines back to back while other clients poll discovery and the journal.

Starts E fake SGLang engines (one `smgrl fake-engine` process) and a real `smgrl launch` with its
journal on a SQLite file, then, at the same time:

* one client sends N `POST /v1/rl/engine/flush_cache?selector=engine=sglang` fan-outs back to back
  over one kept-alive connection;
* P pollers loop over `GET /v1/rl/workers`, `GET /v1/rl/journal` (the newest page) and
  `GET /v1/rl/operations/{latest}` until the fan-outs are done.

It counts errors (any fan-out not 200 with every engine succeeded, any poll not 200, any transport
error) and samples the gateway's resident memory (VmRSS, /proc) after every 100th fan-out. The
promise (docs/reliability.md): zero errors, and VmRSS growth under 10% from the 100th to the Nth
fan-out. Exit status 1 when it is not kept.

    python benchmarks/load.py [--fanouts 1000] [--engines 64] [--pollers 2] [--out FILE]

tests/e2e/test_load.py runs a CI-sized version (300 fan-outs over 16 engines) through `run()`.
Every process is stopped by its PID; everything listens on 127.0.0.1; every loop is bounded.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

FANOUT = "/v1/rl/engine/flush_cache?selector=engine%3Dsglang"
SAMPLE_EVERY = 100
REQUEST_TIMEOUT = 60.0
MAX_GROWTH = 0.10


def _here_importable() -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(0, root)


def vm_rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Poller(threading.Thread):
    """Polls discovery and the journal routes until ``stop`` is set (bounded by ``deadline``)."""

    def __init__(self, port: int, stop: threading.Event, latest: list[str], deadline: float):
        super().__init__(daemon=True)
        self.port, self.stop, self.latest, self.deadline = port, stop, latest, deadline
        self.requests = 0
        self.errors: list[str] = []

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT)
        after = 0
        try:
            while not self.stop.is_set() and time.monotonic() < self.deadline:
                paths = ["/v1/rl/workers", f"/v1/rl/journal?after={after}&limit=100"]
                if self.latest:
                    paths.append(f"/v1/rl/operations/{self.latest[-1]}")
                for path in paths:
                    try:
                        conn.request("GET", path)
                        resp = conn.getresponse()
                        body = resp.read()
                    except (OSError, http.client.HTTPException) as exc:
                        self.errors.append(f"GET {path}: {exc!r}")
                        conn.close()
                        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=REQUEST_TIMEOUT)
                        continue
                    self.requests += 1
                    if resp.status != 200:
                        self.errors.append(f"GET {path}: {resp.status} {body[:200]!r}")
                    elif path.startswith("/v1/rl/journal"):
                        page = json.loads(body)
                        # Follow the tail: the newest page, as a dashboard would.
                        after = max(0, page["last_seq"] - 100)
        finally:
            conn.close()


def run(
    fanouts: int = 1000,
    engines: int = 64,
    pollers: int = 2,
    journal_dir: str | None = None,
    bound_secs: float = 900.0,
) -> dict:
    """Run the load; return the figures (see ``render``). Raises on setup failure only."""
    _here_importable()
    from smgrl.demo.procs import free_port, start_fake_engines, start_gateway, wait_for_workers

    work = journal_dir or tempfile.mkdtemp(prefix="smgrl-load-")
    log = open(os.path.join(work, "gateway.log"), "w")  # noqa: SIM115 - closed in the finally below
    fakes = gw = None
    try:
        fakes, urls = start_fake_engines("sglang", engines)
        port = free_port()
        gw = start_gateway(
            [
                "--enable-rl",
                "--disable-health-check",
                "--worker-urls",
                *urls,
                "--journal",
                os.path.join(work, "journal.db"),
                "--prometheus-port",
                str(free_port()),
            ],
            port=port,
            log=log,
        )
        wait_for_workers(f"http://127.0.0.1:{port}", engines, child=gw, timeout=120)
        deadline = time.monotonic() + bound_secs
        stop = threading.Event()
        latest: list[str] = []
        threads = [Poller(port, stop, latest, deadline) for _ in range(pollers)]
        for t in threads:
            t.start()
        errors: list[str] = []
        latencies: list[float] = []
        rss: dict[int, int] = {0: vm_rss_kib(gw.pid)}
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
        started = time.monotonic()
        try:
            for i in range(1, fanouts + 1):
                if time.monotonic() > deadline:
                    errors.append(f"bound of {bound_secs:g}s reached after {i - 1} fan-outs")
                    break
                t0 = time.perf_counter()
                try:
                    conn.request("POST", FANOUT, body=b"{}", headers={"content-type": "application/json"})
                    resp = conn.getresponse()
                    body = resp.read()
                except (OSError, http.client.HTTPException) as exc:
                    errors.append(f"fan-out {i}: {exc!r}")
                    conn.close()
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_TIMEOUT)
                    continue
                latencies.append((time.perf_counter() - t0) * 1000)
                op = resp.getheader("x-smgrl-operation-id")
                if op:
                    latest.append(op)
                    del latest[:-1]
                if resp.status != 200:
                    errors.append(f"fan-out {i}: {resp.status} {body[:200]!r}")
                else:
                    answer = json.loads(body)
                    if answer["succeeded"] != engines or answer["failed"]:
                        errors.append(f"fan-out {i}: {answer['succeeded']}/{engines} succeeded")
                if i % SAMPLE_EVERY == 0:
                    rss[i] = vm_rss_kib(gw.pid)
        finally:
            conn.close()
            elapsed = time.monotonic() - started
            stop.set()
            for t in threads:
                t.join(REQUEST_TIMEOUT)
        poll_errors = [e for t in threads for e in t.errors]
        first = SAMPLE_EVERY if SAMPLE_EVERY in rss else min(rss)
        last = max(rss)
        growth = (rss[last] - rss[first]) / rss[first]
        return {
            "fanouts": fanouts,
            "engines": engines,
            "pollers": pollers,
            "fanout_errors": errors,
            "poll_requests": sum(t.requests for t in threads),
            "poll_errors": poll_errors,
            "engine_calls": len(latencies) * engines,
            "elapsed_s": elapsed,
            "fanout_p50_ms": statistics.median(latencies) if latencies else None,
            "fanout_p99_ms": sorted(latencies)[int(0.99 * (len(latencies) - 1))] if latencies else None,
            "rss_kib": rss,
            "rss_first": (first, rss[first]),
            "rss_last": (last, rss[last]),
            "rss_growth": growth,
            "gateway_exit": gw.stop(),
        }
    finally:
        if gw is not None:
            gw.stop()
        if fakes is not None:
            fakes.stop()
        log.close()
        if journal_dir is None:
            shutil.rmtree(work, ignore_errors=True)


def kept(result: dict) -> bool:
    return (
        not result["fanout_errors"]
        and not result["poll_errors"]
        and result["rss_growth"] < MAX_GROWTH
        and result["gateway_exit"] == 0
    )


def render(r: dict) -> str:
    samples = " ".join(f"{k}:{v // 1024}" for k, v in sorted(r["rss_kib"].items()))
    rows = [
        (
            "fan-outs (back to back)",
            f"{r['fanouts']} over {r['engines']} engines ({r['engine_calls']} engine calls)",
        ),
        ("pollers (discovery, journal, operations)", f"{r['pollers']}: {r['poll_requests']} requests"),
        ("errors (fan-outs / polls)", f"{len(r['fanout_errors'])} / {len(r['poll_errors'])}"),
        ("fan-out p50 / p99 (ms, informational)", f"{r['fanout_p50_ms']:.1f} / {r['fanout_p99_ms']:.1f}"),
        ("wall time (s, informational)", f"{r['elapsed_s']:.1f}"),
        (
            f"VmRSS at fan-out {r['rss_first'][0]} -> {r['rss_last'][0]} (MiB)",
            f"{r['rss_first'][1] / 1024:.1f} -> {r['rss_last'][1] / 1024:.1f} ({r['rss_growth'] * 100:+.1f}%)",
        ),
        ("VmRSS samples (fan-out:MiB)", samples),
        ("gateway exit status after SIGTERM", str(r["gateway_exit"])),
        ("promise kept (0 errors, growth < 10%)", "yes" if kept(r) else "NO"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"| {'measure'.ljust(width)} | value |", f"|{'-' * (width + 2)}|---|"]
    lines += [f"| {k.ljust(width)} | {v} |" for k, v in rows]
    for e in (r["fanout_errors"] + r["poll_errors"])[:10]:
        lines.append(f"error: {e}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fanouts", type=int, default=1000)
    ap.add_argument("--engines", type=int, default=64)
    ap.add_argument("--pollers", type=int, default=2)
    ap.add_argument("--out", default=None, help="also write the table to this file")
    args = ap.parse_args()
    result = run(args.fanouts, args.engines, args.pollers)
    table = render(result)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")
    sys.exit(0 if kept(result) else 1)


if __name__ == "__main__":
    main()

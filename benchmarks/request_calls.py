#!/usr/bin/env python3
"""Exact work per rollout request in a gateway process: Python and C calls (cProfile's call
counts, which do not depend on how busy the machine is) or system calls (``strace -c``).

Starts four fake SGLang engines and a gateway (``smgrl launch``, or with ``--bare`` the bare
proxy of ``benchmarks/dataplane.py``: smgrl's HTTP server + smgrl's upstream pool, nothing else),
sends warm-up requests, then counts ``--requests`` sequential ``POST /generate`` on one kept-alive
connection. The gateway profiles only between two SIGUSR1 (sent by this script). Everything
listens on 127.0.0.1; every process is stopped by its PID.

    python benchmarks/request_calls.py [--src DIR] [--requests 1000] [--bare] [--strace] [--top 40]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pstats
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import trio

from smgrl.demo.procs import free_port, start_fake_engines, wait_listening
from smgrl.upstream import EnginePool

# Runs in the gateway process: profile between two SIGUSR1, then dump the stats to argv[1].
WRAP = r"""
import cProfile, signal, sys
OUT, prof = sys.argv[1], [None]
def flip(*_):
    if prof[0] is None:
        prof[0] = cProfile.Profile(); prof[0].enable()
    else:
        prof[0].disable(); prof[0].dump_stats(OUT); prof[0] = None
signal.signal(signal.SIGUSR1, flip)
"""
LAUNCH = WRAP + 'sys.argv = ["smgrl", "launch", *sys.argv[2:]]\nfrom smgrl.cli.entry import main\nmain()\n'
BODY = json.dumps(
    {"text": "The quick brown fox jumps over the lazy dog.", "sampling_params": {"max_new_tokens": 8}}
).encode()


async def load(base: str, n: int) -> None:
    pool = EnginePool(base, max_idle=4)
    for _ in range(n):
        response, body, _ = await pool.request(
            "POST", "/generate", headers=[(b"content-type", b"application/json")], body=BODY
        )
        assert response.status == 200, (response.status, body)


def where(path: str) -> str:
    if path == "~":
        return "C (builtins)"
    if "site-packages/" in path:
        return path.split("site-packages/")[1].split("/")[0]
    if "/smgrl/" in path:
        return "smgrl/" + path.split("/smgrl/")[-1]
    return "stdlib " + os.path.basename(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=ROOT, help="the checkout whose smgrl runs the gateway")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--bare", action="store_true", help="the bare proxy instead of smgrl")
    ap.add_argument("--strace", action="store_true", help="count system calls instead (strace -c -f)")
    ap.add_argument("--top", type=int, default=30, help="the N functions called most per request")
    args = ap.parse_args()
    src, n = os.path.abspath(args.src), args.requests
    work = tempfile.mkdtemp(prefix="request-calls-")
    out = os.path.join(work, "gateway.prof")
    fake, urls = start_fake_engines("sglang", 4)
    port = free_port()
    env = dict(os.environ, PYTHONPATH=src)
    if args.bare:
        sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
        from dataplane import BARE_APP

        code = WRAP + "sys.argv = sys.argv[1:]\n" + BARE_APP
        argv = [sys.executable, "-c", code, out, str(port), *urls]
    else:
        argv = [
            sys.executable, "-c", LAUNCH, out, "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *urls, "--journal", ":memory:", "--prometheus-port", str(free_port()),
            "--policy", "round_robin", "--disable-health-check", "--log-level", "warn",
        ]  # fmt: skip
    gateway = subprocess.Popen(argv, env=env, cwd=src)
    base = f"http://127.0.0.1:{port}"
    tracer = None
    try:
        if args.bare:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    trio.run(load, base, 1)
                    break
                except Exception:  # noqa: BLE001 - not listening yet (trio groups connect errors)
                    time.sleep(0.2)
        else:
            wait_listening(base)
        trio.run(load, base, 300)  # warm: connections pooled, caches filled
        if args.strace:
            trace = os.path.join(work, "strace.txt")
            tracer = subprocess.Popen(["strace", "-c", "-f", "-p", str(gateway.pid), "-o", trace])
            time.sleep(1)  # attached
        else:
            os.kill(gateway.pid, signal.SIGUSR1)
            time.sleep(0.5)
        trio.run(load, base, n)
        if tracer is not None:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(30)
        else:
            os.kill(gateway.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 30
            while not os.path.exists(out) and time.monotonic() < deadline:
                time.sleep(0.2)
            time.sleep(0.5)
    finally:
        if tracer is not None and tracer.poll() is None:
            tracer.kill()
        gateway.send_signal(signal.SIGTERM)
        try:
            gateway.wait(20)
        except subprocess.TimeoutExpired:
            gateway.kill()
        fake.stop()
    if args.strace:
        with open(trace) as f:
            print(f.read())
        return
    stats = pstats.Stats(out).stats
    total = sum(v[1] for v in stats.values())
    print(f"{'bare proxy' if args.bare else 'smgrl'} ({src}): {total / n:.1f} calls per request")
    by_place = collections.Counter()
    for (path, _, _), v in stats.items():
        by_place[where(path)] += v[1]
    for place, calls in by_place.most_common(15):
        print(f"  {calls / n:8.1f}  {place}")
    print(f"the {args.top} functions called most (per request):")
    rows = sorted(stats.items(), key=lambda kv: -kv[1][1])[: args.top]
    for (path, line, name), v in rows:
        print(f"  {v[1] / n:8.2f}  {where(path)}:{line} {name}")


if __name__ == "__main__":
    main()

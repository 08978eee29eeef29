#!/usr/bin/env python3
"""Where the gateway's CPU goes: py-spy profiles of the rollout and the fan-out paths.

Starts fake SGLang engines and one ``smgrl launch`` on loopback, drives one load for ``--secs``
while ``py-spy record --format raw`` samples the gateway process, then folds the samples into
buckets (by source file) and prints each bucket's share of the gateway's busy samples, inclusive
(any frame of the stack in the bucket) and self (the innermost frame). Idle time (trio waiting
in epoll) is left out. Needs ``py-spy`` (``pip install py-spy``; root, or ptrace allowed).

    python benchmarks/profile.py rollout --clients 64 [--engines 4] [--secs 15]
    python benchmarks/profile.py fanout --engines 8 [--secs 15]
    python benchmarks/profile.py discovery --engines 8
    python benchmarks/profile.py bare --clients 64   # the gateway's HTTP server + a bare ASGI app
    python benchmarks/profile.py grpc --clients 1 [--route /v1/chat/completions] [--stream]
                                                     # rollouts to fake engines over gRPC

Every process this starts is stopped by its PID; every loop is bounded by ``--secs``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.dataplane import GENERATE_BODY, HEADERS, cpu_seconds, start_bare, wait_routable
from smgrl.demo.procs import Child, free_port, start_fake_engines, start_gateway, wait_for_workers
from smgrl.tito.testkit import make_model_dir
from smgrl.upstream import EnginePool

# Buckets, first match wins: a prefix of the frame's file as py-spy prints it (the path below
# site-packages or the repository).
BUCKETS = [
    ("smgrl raw front (api/dataplane.py)", "smgrl/http/fronts/dataplane.py"),
    ("smgrl HTTP server (http/server)", "smgrl/http/server/"),
    ("smgrl hypercorn patches", "smgrl/http/hypercorn_patches.py"),
    ("smgrl gRPC answer (dataplane/grpc)", "smgrl/dataplane/grpc/"),
    ("smgrl gRPC client (upstream/grpc)", "smgrl/upstream/grpc/"),
    ("smgrl data plane service", "smgrl/dataplane/"),
    ("smgrl upstream pool + parser", "smgrl/upstream/"),
    ("smgrl routing", "smgrl/routing/"),
    ("smgrl control plane routes (api/)", "smgrl/http/"),
    ("smgrl control (fan-out)", "smgrl/control/"),
    ("smgrl registry", "smgrl/registry/"),
    ("smgrl state/projections", "smgrl/state/"),
    ("smgrl logs", "smgrl/telemetry/logs.py"),
    ("smgrl metrics", "smgrl/telemetry/metrics.py"),
    ("smgrl metrics", "smgrl/telemetry/tallies.py"),
    ("journal", "journal/"),
    ("h11", "h11/"),
    ("hypercorn", "hypercorn/"),
    ("quart / werkzeug", "quart"),
    ("quart / werkzeug", "werkzeug/"),
    ("prometheus_client", "prometheus_client/"),
    ("trio sockets (send/recv syscalls)", "trio/_socket.py"),
    ("trio sockets (send/recv syscalls)", "trio/_highlevel_socket.py"),
    ("trio run loop, cancel scopes, sync", "trio/"),
    ("logging", "logging/"),
    ("json", "json/"),
    ("h2 / hpack (gRPC's HTTP/2)", "h2/"),
    ("h2 / hpack (gRPC's HTTP/2)", "hpack/"),
    ("protobuf", "google/protobuf/"),
    ("tokenizers / jinja2", "tokenizers/"),
    ("tokenizers / jinja2", "jinja2/"),
]
# Frames that only wrap everything (the entry point, trio.run): not a bucket of their own.
OUTER = (
    "smgrl/__main__.py",
    "smgrl/cli/main.py",
    "smgrl/cli/gateway.py",
    "smgrl/runtime/server.py",
    "<string>",
    "runpy.py",
)


def _file(frame: str) -> str:
    inner = frame.rpartition(" (")[2]
    return inner.rsplit(":", 1)[0]


def bucket_of(frame: str) -> str | None:
    path = _file(frame)
    if path.startswith(OUTER):
        return None
    for name, prefix in BUCKETS:
        if path.startswith(prefix):
            return name
    return "smgrl other" if path.startswith("smgrl/") else "other (stdlib, C)"


def fold(raw_path: str) -> tuple[int, dict, dict]:
    """(total samples, inclusive counts, self counts) per bucket from py-spy's raw output."""
    total = 0
    inclusive: dict[str, int] = collections.Counter()
    own: dict[str, int] = collections.Counter()
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            if _idle(frames[-1]):
                continue
            total += n
            for name in {bucket_of(fr) for fr in frames} - {None}:
                inclusive[name] += n
            own[bucket_of(frames[-1]) or "other (stdlib, C)"] += n
    return total, inclusive, own


# Innermost frames that are a thread waiting, not working (py-spy's --nonblocking sampling
# cannot always tell): trio in epoll_wait, a thread blocked on a lock or a queue.
_WAITS = (
    "EpollIOManager.get_events ",
    "get_events (",
    "Condition.wait (",
    "Event.wait (",
    "QueueListener.dequeue (",
    "Thread.join (",
)


def _idle(leaf: str) -> bool:
    return leaf.startswith(_WAITS)


def top_functions(raw_path: str, limit: int = 25) -> list[tuple[str, int]]:
    own: dict[str, int] = collections.Counter()
    with open(raw_path) as f:
        for line in f:
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if stack and count.isdigit() and not _idle(stack.split(";")[-1]):
                own[stack.split(";")[-1]] += int(count)
    return own.most_common(limit)


# -- loads ----------------------------------------------------------------------------------------


async def rollout_load(
    base: str, clients: int, secs: float, route: str = "/generate", body: bytes = GENERATE_BODY
) -> int:
    pool = EnginePool(base, max_idle=clients)
    done = 0
    deadline = trio.current_time() + secs

    async def client() -> None:
        nonlocal done
        while trio.current_time() < deadline:
            resp, _, _ = await pool.request("POST", route, headers=HEADERS, body=body)
            done += resp.status == 200

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(client)
    await pool.aclose()
    return done


async def control_load(base: str, method: str, path: str, secs: float) -> int:
    pool = EnginePool(base, max_idle=1)
    done = 0
    deadline = trio.current_time() + secs
    while trio.current_time() < deadline:
        resp, _, _ = await pool.request(method, path, headers=[], body=b"" if method == "POST" else None)
        done += resp.status in (200, 207)
    await pool.aclose()
    return done


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["rollout", "fanout", "discovery", "bare", "grpc"])
    ap.add_argument("--route", default="/generate", help="grpc: the route driven")
    ap.add_argument("--stream", action="store_true", help="grpc: streamed requests")
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--secs", type=float, default=15.0)
    ap.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    ap.add_argument(
        "--log-level",
        default="warn",
        help="the gateway's (benchmarks/fanout.py runs it at info, the default)",
    )
    ap.add_argument(
        "--gil",
        action="store_true",
        help="sample only the thread holding the GIL (py-spy --gil): Python CPU, without the time a "
        "thread spends preempted inside a syscall that released the GIL",
    )
    ap.add_argument("--top", type=int, default=0, help="also print the N hottest functions (self)")
    ap.add_argument("--keep", default=None, help="keep py-spy's raw output at this path")
    ap.add_argument("--fold", default=None, help="only fold an existing raw file (no run)")
    args = ap.parse_args()
    if args.fold:
        report(args, args.fold, "")
        return
    if shutil.which("py-spy") is None and not os.path.exists(
        os.path.join(os.path.dirname(sys.executable), "py-spy")
    ):
        sys.exit("error: py-spy not found (pip install py-spy)")
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    work = tempfile.mkdtemp(prefix="smgrl-profile-")
    log = open(os.path.join(work, "children.log"), "w")  # noqa: SIM115 - the children hold it
    children: list[Child] = []
    try:
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        if args.what == "bare":
            gw = start_bare(port, log)
        elif args.what == "grpc":
            from benchmarks.grpc_rollouts import start_smgrl

            tok = str(make_model_dir(os.path.join(work, "tok"), "chatml"))
            fakes, urls = start_fake_engines("sglang", args.engines, ["--grpc", "--tokenizer-path", tok])
            children.append(fakes)
            gw, base = start_smgrl(urls, fakes.control_urls, tok, work)
        else:
            fakes, urls = start_fake_engines("sglang", args.engines)
            children.append(fakes)
            flags = ["--worker-urls", *urls, "--disable-health-check", "--log-level", args.log_level]
            # A free metrics port: the default (29000) may be taken by another gateway on the machine.
            flags += ["--prometheus-port", str(free_port())]
            if args.what == "rollout":
                flags += ["--journal", ":memory:", "--policy", "round_robin"]
            else:
                flags += ["--enable-rl", "--journal", os.path.join(work, "j.db")]
            gw = start_gateway(flags, port=port, log=log)
        children.append(gw)
        if args.what == "bare":
            _wait_up(base)
        elif args.what == "grpc":
            pass  # start_smgrl waited for the workers
        elif args.what == "rollout":
            wait_routable(base)
        else:
            wait_for_workers(base, args.engines, child=gw, timeout=120)
        raw = args.keep or os.path.join(work, "profile.raw")
        # Warm up (connections, caches) before sampling.
        _load(args, base, 1.0)
        spy_proc = subprocess.Popen(
            [spy, "record", "-p", str(gw.pid), "-r", str(args.rate), "--format", "raw", "--nonblocking",
             "-o", raw, "-d", str(int(args.secs) + 1), *(["--gil"] if args.gil else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        cpu0 = cpu_seconds(gw.pid)
        t0 = time.perf_counter()
        done = _load(args, base, args.secs)
        elapsed = time.perf_counter() - t0
        cpu = cpu_seconds(gw.pid) - cpu0
        spy_proc.wait(timeout=args.secs + 60)
        head = (f"{args.what}: {done} requests in {elapsed:.1f}s ({done / elapsed:.0f}/s), "
                f"gateway CPU {cpu / max(done, 1) * 1e6:.0f} us/request")  # fmt: skip
        report(args, raw, head)
    finally:
        for child in reversed(children):
            child.stop()
        log.close()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def report(args, raw: str, head: str) -> None:
    total, inclusive, own = fold(raw)
    print(f"{head}, {total} busy samples")
    print(f"| where ({args.what}) | inclusive | self |")
    print("|---|---|---|")
    for name, n in sorted(inclusive.items(), key=lambda kv: -kv[1]):
        print(f"| {name} | {n / total * 100:.1f}% | {own.get(name, 0) / total * 100:.1f}% |")
    if args.top:
        print()
        for fn, n in top_functions(raw, args.top):
            print(f"{n / total * 100:5.1f}%  {fn}")


def _wait_up(base: str) -> None:
    import urllib.request

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(urllib.request.Request(base + "/", data=b"{}"), timeout=2).read()
            return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(base)


def _load(args, base: str, secs: float) -> int:
    if args.what in ("rollout", "bare"):
        return trio.run(rollout_load, base, args.clients, secs)
    if args.what == "grpc":
        from benchmarks.grpc_rollouts import CHAT, GENERATE, MODEL

        obj = {**(GENERATE if args.route == "/generate" else CHAT), "model": MODEL, "stream": args.stream}
        return trio.run(rollout_load, base, args.clients, secs, args.route, json.dumps(obj).encode())
    if args.what == "fanout":
        return trio.run(
            control_load, base, "POST", "/v1/rl/engine/flush_cache?selector=engine%3Dsglang", secs
        )
    return trio.run(control_load, base, "GET", "/v1/rl/workers", secs)


if __name__ == "__main__":
    main()

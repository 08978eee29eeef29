#!/usr/bin/env python3
"""Rollouts on gRPC engines: smgrl vs SMG 1.13.0's gRPC router vs calling the fakes directly,
side by side in one run on the same gRPC fakes.

Starts E fake SGLang engines served over gRPC (``smgrl fake-engine --grpc``, one process, the
test tokenizer), then smgrl (the gRPC workers registered with their control URLs) and, when
installed, SMG (``smg launch --worker-urls grpc://... --tokenizer-path DIR``; ``--smg-bin``).
Measured from this process, each client on its own kept-alive connection:

* ``/generate`` with ``input_ids`` and ``/v1/chat/completions``, buffered, at 1 and 64 clients:
  p50, req/s, the p50 added over calling the fakes directly (``direct``: the same Generate RPC
  through smgrl's gRPC client from this process), and the gateway's CPU per request (its
  process's user+system time over the run / requests);
* the same two routes streamed (``--stream-tokens`` tokens each, 64 streams): chunks/s through
  each gateway and directly (the fake's own rate limits it).

``--runs 3`` repeats the buffered ``/generate`` CPU measurement, the runs alternating between the
gateways, and prints each run's ratio to SMG and their median (the pass criterion: smgrl's CPU per
``/generate`` at most 2x SMG's). ``--baseline-src DIR`` adds the smgrl of another checkout as a
``baseline`` gateway: before and after side by side in one run. Every process this
starts is stopped by its PID; everything listens on 127.0.0.1; every loop is bounded.

    python benchmarks/grpc_rollouts.py [--engines 2] [--requests 1000] [--runs 3] [--out FILE]

A quicker pass over one cell: ``--routes /generate --concurrency 1 --streams 0``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (ROOT, os.path.join(ROOT, "benchmarks")):
    if path not in sys.path:
        sys.path.insert(0, path)

from dataplane import closed_loop, cpu_seconds, pct

from smgrl.dataplane.grpc.build import message, plan
from smgrl.demo.procs import Child, free_port, start_fake_engines, wait_listening
from smgrl.tito.testkit import make_model_dir
from smgrl.upstream import WIRES, Channel, EngineClient, EnginePool, UpstreamError

MODEL = "fake/Qwen3-0.6B"
TOKENS = 8
GENERATE = {
    "input_ids": [11, 12, 13, 14, 15, 16],
    "sampling_params": {"max_new_tokens": TOKENS, "ignore_eos": True},
}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "say something"}], "max_tokens": TOKENS,
        "ignore_eos": True}  # fmt: skip
HEADERS = [(b"content-type", b"application/json")]


def post(base: str, path: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, json.loads(r.read())


def get(base: str, path: str):
    with urllib.request.urlopen(base + path, timeout=5) as r:
        return json.loads(r.read())


def start_smgrl(urls, controls, tok: str, workdir: str, src: str | None = None) -> tuple[Child, str]:
    """smgrl on the fakes; ``src``: the smgrl of another checkout (``--baseline-src``)."""
    port = free_port()
    argv = [sys.executable, "-m", "smgrl", "launch", "--host", "127.0.0.1", "--port", str(port),
            "--journal", ":memory:", "--prometheus-port", str(free_port()), "--policy", "round_robin",
            "--disable-health-check", "--log-level", "warn", "--tokenizer-path", tok, "--enable-rl"]  # fmt: skip
    log = open(os.path.join(workdir, f"smgrl{'-baseline' if src else ''}.log"), "w")  # noqa: SIM115 - the child holds it
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=src or None)
    child = Child(proc, "smgrl-baseline" if src else "smgrl")
    base = f"http://127.0.0.1:{port}"
    wait_listening(base, child=child)
    for url, control in zip(urls, controls, strict=True):
        post(base, "/workers", {"url": url, "connection_mode": "grpc", "runtime": "sglang",
                                "labels": {"rl.control_url": control}})  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        rows = get(base, "/v1/rl/workers")["workers"]
        if len(rows) == len(urls) and all(r["labels"].get("grpc_wire") for r in rows):
            return child, base
        time.sleep(0.1)
    raise SystemExit("smgrl: the gRPC workers were not discovered")


def start_smg(smg: str, urls, tok: str, workdir: str) -> tuple[Child, str]:
    port = free_port()
    argv = [smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
            "--tokenizer-path", tok, "--policy", "round_robin", "--disable-health-check",
            "--prometheus-port", str(free_port()), "--log-level", "warn"]  # fmt: skip
    log = open(os.path.join(workdir, "smg.log"), "w")  # noqa: SIM115 - the child holds it
    child = Child(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT), "smg")
    base = f"http://127.0.0.1:{port}"
    wait_listening(base, child=child)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # SMG's gRPC workers become routable after their probe
        try:
            if post(base, "/generate", {**GENERATE, "model": MODEL})[0] == 200:
                return child, base
        except OSError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"smg: no answer from its gRPC workers; see {workdir}/smg.log")


async def direct_loop(urls, route: str, concurrency: int, total: int, tok):
    """The same work without a gateway: Generate RPCs through smgrl's gRPC client."""
    from smgrl.tito import ChatTokenizer

    chat = ChatTokenizer.load(tok)
    obj = GENERATE if route == "/generate" else CHAT
    the_plan = plan(route, obj, chat)
    clients = []
    for url in urls:
        host, port = url[len("grpc://") :].rsplit(":", 1)
        clients.append(EngineClient(Channel(host, int(port)), WIRES["sglang"]))
    latencies: list[float] = []
    remaining = total
    counter = 0

    async def client(i: int) -> None:
        nonlocal remaining, counter
        while remaining > 0:
            remaining -= 1
            counter += 1
            c = clients[(i + counter) % len(clients)]
            t0 = time.perf_counter()
            async with c.generate(message(c.wire, the_plan, 0, f"d{i}-{counter}", None)) as s:
                async for _ in s:
                    pass
            latencies.append((time.perf_counter() - t0) * 1000)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(concurrency):
            nursery.start_soon(client, i)
    rps = len(latencies) / (time.perf_counter() - t0)
    for c in clients:
        await c.channel.aclose()
    return latencies, rps


async def stream_loop(base: str, route: str, count: int, tokens: int):
    obj = {**(GENERATE if route == "/generate" else CHAT), "stream": True}
    if route == "/generate":
        obj["sampling_params"] = {**obj["sampling_params"], "max_new_tokens": tokens}
        obj["model"] = MODEL
    else:
        obj["max_tokens"] = tokens
    body = json.dumps(obj).encode()
    pool = EnginePool(base, max_idle=count)
    chunks = failed = 0

    async def one() -> None:
        nonlocal chunks, failed
        try:
            async with pool.stream("POST", route, headers=HEADERS, body=body) as resp:
                async for piece in resp.aiter_chunks():
                    chunks += piece.count(b"data: ") - piece.count(b"data: [DONE]")
        except (UpstreamError, OSError):
            failed += 1

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    await pool.aclose()
    return chunks / (time.perf_counter() - t0), failed


async def direct_streams(urls, count: int, tokens: int):
    the_plan = plan("/generate", {**GENERATE, "stream": True,
                                  "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}, None)  # fmt: skip
    clients = []
    for url in urls:
        host, port = url[len("grpc://") :].rsplit(":", 1)
        clients.append(EngineClient(Channel(host, int(port)), WIRES["sglang"]))
    chunks = 0

    async def one(i: int) -> None:
        nonlocal chunks
        c = clients[i % len(clients)]
        async with c.generate(message(c.wire, the_plan, 0, f"s{i}", None)) as s:
            async for _ in s:
                chunks += 1

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)
    rate = chunks / (time.perf_counter() - t0)
    for c in clients:
        await c.channel.aclose()
    return rate


def run(args) -> dict:
    workdir = tempfile.mkdtemp(prefix="smgrl-grpc-bench-")
    tok = str(make_model_dir(os.path.join(workdir, "tok"), "chatml"))
    engines, urls = start_fake_engines("sglang", args.engines, ["--grpc", "--tokenizer-path", tok])
    children = [engines]
    results: dict = {}
    try:
        gateways = {}
        child, base = start_smgrl(urls, engines.control_urls, tok, workdir)
        children.append(child)
        gateways["smgrl"] = (child, base)
        if args.baseline_src:
            child, base = start_smgrl(
                urls, engines.control_urls, tok, workdir, os.path.abspath(args.baseline_src)
            )
            children.append(child)
            gateways["baseline"] = (child, base)
        smg = args.smg_bin or shutil.which("smg")
        if smg and os.path.exists(smg):
            child, base = start_smg(smg, urls, tok, workdir)
            children.append(child)
            gateways["smg"] = (child, base)
        for route, obj in (("/generate", GENERATE), ("/v1/chat/completions", CHAT)):
            if args.routes and route not in args.routes:
                continue
            body = json.dumps({**obj, "model": MODEL}).encode()
            for c in args.concurrency:
                total = max(args.requests, c * 8) if c > 1 else max(args.requests // 4, 200)
                lat, rps = trio.run(direct_loop, urls, route, c, total, tok)
                direct_p50 = pct(lat, 0.5)
                results.setdefault("direct", {})[f"{route} c={c}"] = {"p50": direct_p50, "rps": rps}
                print(f"direct  {route:22s} c={c:<3d} p50={direct_p50:6.2f}ms {rps:7.0f} req/s", flush=True)
                # The runs alternate between the gateways (run 1 of each, then run 2 of each...,
                # the first of each run rotating), so that each run's ratio compares the same
                # minutes of a loaded machine.
                cpus: dict[str, list[float]] = {name: [] for name in gateways}
                last: dict[str, tuple] = {}
                for n in range(args.runs if route == "/generate" else 1):
                    names = list(gateways)
                    for name in names[n % len(names) :] + names[: n % len(names)]:  # who goes first rotates
                        child, base = gateways[name]
                        cpu0 = cpu_seconds(child.pid)
                        last[name] = trio.run(closed_loop, [base], route, body, c, total)
                        cpus[name].append((cpu_seconds(child.pid) - cpu0) / total * 1e6)
                for name in gateways:
                    lat, rps, errors = last[name]
                    runs = cpus[name]
                    row = {"p50": pct(lat, 0.5), "added_p50": pct(lat, 0.5) - direct_p50, "rps": rps,
                           "errors": errors, "cpu_us": statistics.median(runs), "cpu_runs": runs}  # fmt: skip
                    if "smg" in cpus and name != "smg":
                        ratios = [a / b for a, b in zip(runs, cpus["smg"], strict=True)]
                        row["smg_ratio_runs"] = ratios
                    results.setdefault(name, {})[f"{route} c={c}"] = row
                    ratio = (f" / SMG per run {', '.join(f'{x:.2f}' for x in row['smg_ratio_runs'])}"
                             f" (median {statistics.median(row['smg_ratio_runs']):.2f}x)"
                             if "smg_ratio_runs" in row else "")  # fmt: skip
                    print(f"{name:8s} {route:22s} c={c:<3d} p50={row['p50']:6.2f}ms (+{row['added_p50']:.2f}) "
                          f"{rps:7.0f} req/s errors={errors} CPU {row['cpu_us']:5.0f} us/req "
                          f"(runs {', '.join(f'{x:.0f}' for x in runs)}){ratio}", flush=True)  # fmt: skip
        if not args.streams:
            return results
        rate = trio.run(direct_streams, urls, args.streams, args.stream_tokens)
        results.setdefault("direct", {})["streams"] = rate
        print(f"direct  streams={args.streams} {rate:8.0f} chunks/s", flush=True)
        for name, (child, base) in gateways.items():
            for route in ("/generate", "/v1/chat/completions"):
                cpu0 = cpu_seconds(child.pid)
                cps, failed = trio.run(stream_loop, base, route, args.streams, args.stream_tokens)
                cpu = (cpu_seconds(child.pid) - cpu0) / args.streams * 1e6
                results.setdefault(name, {})[f"stream {route}"] = {"chunks_per_s": cps, "failed": failed,
                                                                   "cpu_us_per_stream": cpu}  # fmt: skip
                print(f"{name:7s} stream {route:22s} {cps:8.0f} chunks/s failed={failed} "
                      f"CPU {cpu:6.0f} us/stream", flush=True)  # fmt: skip
    finally:
        for child in reversed(children):
            child.stop()
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--streams", type=int, default=64, help="0: no stream rows")
    p.add_argument("--routes", type=lambda s: s.split(","), default=None,
                   help="only these buffered routes (comma-separated, e.g. /generate)")  # fmt: skip
    p.add_argument("--stream-tokens", type=int, default=64)
    p.add_argument("--smg-bin", default=None)
    p.add_argument("--baseline-src", default=None,
                   help="also run the smgrl of this checkout (before/after in one run: a `baseline` row)")  # fmt: skip
    p.add_argument("--out", default=None)
    args = p.parse_args()
    results = run(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

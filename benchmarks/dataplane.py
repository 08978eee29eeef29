#!/usr/bin/env python3
"""Data-plane speed: smgrl vs direct calls vs SMG 1.13.0, side by side in one run, same fakes.

Starts E fake SGLang engines (one ``smgrl fake-engine`` process), then each gateway with
``--worker-urls`` of all E engines, and measures from this process (trio, smgrl's upstream pool
as the HTTP client, one kept-alive connection per concurrent client):

* non-streaming ``POST /generate`` (``max_new_tokens`` 8) at 1, 64 and 256 concurrent clients:
  p50/p99 latency, requests per second, and the latency the gateway ADDS over calling an engine
  directly at the same concurrency (``direct``: the same requests round-robined over the
  engines by this process);
* ``--streams N`` concurrent streaming ``/v1/completions`` (default 1,000) through the gateway
  and directly: chunks per second, added per-chunk latency p99 (inter-chunk gap through the
  gateway minus directly), and dropped chunks (every stream must deliver all its tokens and
  ``data: [DONE]``).

Gateways: ``smgrl`` (the raw ASGI data plane, the shipped front), ``server-bare`` (the same
HTTP server serving an ASGI app that answers at once: the server's
floor, so ``smgrl - bare`` is smgrl's own CPU per request), ``server-bare-proxy`` (that
app forwarding each request to the engines with smgrl's upstream pool and relaying the answer
as is: the floor plus the upstream hop; ``--no-bare`` skips both), ``smgrl-baseline`` (the smgrl
of another checkout, ``--baseline-src DIR``: before/after in one run),
``smgrl-quart`` (the same service behind a Quart route: the measurement behind the choice of
front; ``--fronts``), and
SMG (``smg launch``, when installed: ``--smg-bin``, default on PATH or /tmp/smgvenv/bin/smg).
Every process this starts is stopped by its PID; everything listens on 127.0.0.1; every loop
is bounded (a request count or a deadline).

    python benchmarks/dataplane.py [--engines 4] [--requests 2000] [--concurrency 1,64,256]
        [--streams 1000] [--fronts] [--out FILE]

``--wrk RUNS``: the load from ``wrk`` (one thread, 64 connections, 8 s), see ``dataplane_wrk.py``.

``--interleaved-p50 ROUNDS`` (with ``--workers 1,2``, optionally ``--baseline-src``): only the
added p50 at 1 client, measured so that a busy machine's noise cancels out: every gateway runs at
once, and each round sends ``--round-requests`` sequential requests (one client) directly to the
engines and through each gateway in turn (the order rotates every round); a gateway's added p50
in a round is its median minus the direct median of THAT round. Reported: the median over rounds
of those added p50s (median of medians), their p25-p75 and min-max, and each gateway's ratio to
the first ``--workers`` entry (the median of the per-round ratios, with its p25-p75).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import sys
import tempfile
import time

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from smgrl.demo.procs import Child, free_port, start_fake_engines, wait_listening
from smgrl.upstream import EnginePool, UpstreamError

GENERATE_BODY = json.dumps(
    {"text": "The quick brown fox jumps over the lazy dog.", "sampling_params": {"max_new_tokens": 8}}
).encode()
HEADERS = [(b"content-type", b"application/json")]
MODEL = "fake/Qwen3-0.6B"  # SMG 1.13.0 and smgrl require `model` on OpenAI routes


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))] if s else float("nan")


# -- the load generator -------------------------------------------------------------------------


async def closed_loop(
    origins: list[str], path: str, body: bytes, concurrency: int, total: int, group_size: int = 0
):
    """``concurrency`` clients, each on its own kept-alive connection, ``total`` requests in all.
    ``group_size`` N > 0: prompt groups (``x-prompt-id``) of N requests running together, as a
    GRPO trainer sends them: the k-th requests of clients ``[jN, (j+1)N)`` share a group.

    Returns (latencies in ms, requests per second, errors).
    """
    pools = [EnginePool(o, max_idle=concurrency) for o in origins]
    latencies: list[float] = []
    errors = 0
    remaining = total
    warm = min(total // 10, 200)

    async def client(index: int) -> None:
        nonlocal remaining, errors
        i = index
        headers = HEADERS
        round_ = 0
        while remaining > 0:
            remaining -= 1
            pool = pools[i % len(pools)]
            i += 1
            if group_size:
                round_ += 1
                group = f"{round_}-{index // group_size}".encode()
                headers = [*HEADERS, (b"x-prompt-id", group)]
            t0 = time.perf_counter()
            try:
                resp, _, _ = await pool.request("POST", path, headers=headers, body=body)
                if resp.status != 200:
                    errors += 1
            except (UpstreamError, OSError):
                errors += 1
                continue
            latencies.append((time.perf_counter() - t0) * 1000)

    # Timing a batch of tasks, as the other mode below does (three lines of timing; each mode its own task).
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for c in range(concurrency):
            nursery.start_soon(client, c)
    elapsed = time.perf_counter() - t0
    for pool in pools:
        await pool.aclose()
    measured = latencies[warm:] if len(latencies) > warm * 2 else latencies
    return measured, len(latencies) / elapsed, errors


async def streams(origins: list[str], count: int, tokens: int, route: str = "/v1/completions"):
    """``count`` concurrent streams; (chunks/s, inter-chunk gaps ms, dropped chunks, failed)."""
    if route == "/generate":
        payload = {
            "text": "stream me",
            "stream": True,
            "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True},
        }
    else:
        payload = {
            "model": MODEL,
            "prompt": "stream me",
            "max_tokens": tokens,
            "ignore_eos": True,
            "stream": True,
        }
    body = json.dumps(payload).encode()
    pools = [EnginePool(o, max_idle=count) for o in origins]
    gaps: list[float] = []
    chunks = 0
    dropped = 0
    failed = 0

    async def one(i: int) -> None:
        nonlocal chunks, dropped, failed
        pool = pools[i % len(pools)]
        seen = 0
        done = False
        buf = b""
        last = None
        try:
            async with pool.stream("POST", route, headers=HEADERS, body=body) as resp:
                async for chunk in resp.aiter_chunks():
                    now = time.perf_counter()
                    buf += chunk
                    while b"\n\n" in buf:
                        event, buf = buf.split(b"\n\n", 1)
                        if event == b"data: [DONE]":
                            done = True
                        elif event.startswith(b"data: "):
                            seen += 1
                            chunks += 1
                            if last is not None:
                                gaps.append((now - last) * 1000)
                            last = now
        except (UpstreamError, OSError):
            failed += 1
        dropped += max(0, tokens - seen) + (0 if done else 1)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, i)
    elapsed = time.perf_counter() - t0
    for pool in pools:
        await pool.aclose()
    return chunks / elapsed, gaps, dropped, failed


# -- gateways -------------------------------------------------------------------------------------


def start_smgrl(
    urls: list[str], port: int, front: str, workdir: str, policy: str, src: str | None = None
) -> Child:
    """``src``: run the smgrl of another checkout (its directory goes first on PYTHONPATH), to
    compare two versions in one run (``--baseline-src``)."""
    import subprocess

    args = [
        "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
        "--journal", ":memory:", "--prometheus-port", str(free_port()), "--policy", policy,
        "--disable-health-check", "--log-level", "warn",
    ]  # fmt: skip
    argv = [sys.executable, os.path.abspath(__file__), "--serve", front, *args]
    if src:  # this script would put its own checkout first on sys.path
        argv = [sys.executable, "-m", "smgrl", "launch", *args]
    log = open(os.path.join(workdir, f"smgrl-{front}.log"), "w")  # noqa: SIM115 - the child holds it
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=src or None)
    return Child(proc, f"smgrl-{front}")


def start_workers(
    urls: list[str], port: int, workers: int, workdir: str, policy: str, src: str | None = None
) -> tuple[Child, str]:
    """``smgrl launch --workers N`` on an SQLite journal (N=1: a lone gateway on the same kind of
    journal, for the comparison); returns the child and its metrics URL. ``src``: the smgrl of
    another checkout (``--baseline-src``)."""
    import subprocess

    mport = free_port()
    journal = os.path.join(workdir, f"workers-{workers}{'-baseline' if src else ''}.db")
    args = [
        "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
        "--journal", journal, "--prometheus-port", str(mport), "--policy", policy,
        "--disable-health-check", "--log-level", "warn", "--workers", str(workers),
    ]  # fmt: skip
    log = open(os.path.join(workdir, f"smgrl-workers-{workers}.log"), "w")  # noqa: SIM115 - the child holds it
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(
        [sys.executable, "-m", "smgrl", "launch", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=src or None,
    )
    return Child(proc, f"smgrl-workers-{workers}"), f"http://127.0.0.1:{mport}/metrics"


def wait_workers(metrics_url: str, workers: int, deadline_s: float = 120.0) -> None:
    """Until every worker of a supervisor listens (its metrics appear in the merged exposition)."""
    if workers < 2:
        return
    import urllib.request

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(metrics_url, timeout=5) as r:
                if f'gateway_worker="{workers - 1}"'.encode() in r.read():
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"not every worker listens after {deadline_s:g}s")


def start_smg(smg: str, urls: list[str], port: int, workdir: str, policy: str) -> Child:
    import subprocess

    argv = [
        smg, "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls", *urls,
        "--policy", policy, "--disable-health-check", "--prometheus-port", str(free_port()),
        "--log-level", "warn",
    ]  # fmt: skip
    log = open(os.path.join(workdir, "smg.log"), "w")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    return Child(proc, "smg")


def start_bare(port: int, log, engines: list[str] = (), src: str | None = None) -> Child:
    """The gateway's HTTP server (smgrl's own; the patched hypercorn in a checkout from before
    it), serving an ASGI app that reads the body and answers at once: the server's own
    per-request floor, measured beside smgrl. With
    ``engines``, the app instead forwards the body to them (round-robin, smgrl's upstream pool)
    and relays the answer as is: the floor plus the upstream hop, nothing else."""
    import subprocess

    argv = [sys.executable, "-c", BARE_APP, str(port), *engines]
    env = dict(os.environ)
    if src:  # the server of another checkout (``--baseline-src``)
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=src or None)
    return Child(proc, "server-bare")


BARE_APP = r"""
import itertools, sys, trio
from hypercorn.trio import serve
from smgrl.core.config import Config
from smgrl.runtime.listeners import hypercorn_config
from smgrl.upstream import EnginePool

POOLS = itertools.cycle([EnginePool(url, max_idle=1024) for url in sys.argv[2:]] or [None])

BODY = b'{"text":"ok","meta_info":{"id":"x"}}'
HEAD = [(b"content-type", b"application/json"), (b"content-length", str(len(BODY)).encode())]

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif m["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    chunks = []
    while True:
        m = await receive()
        chunks.append(m.get("body", b""))
        if not m.get("more_body"):
            break
    pool = next(POOLS)
    if pool is None:
        await send({"type": "http.response.start", "status": 200, "headers": HEAD})
        await send({"type": "http.response.body", "body": BODY})
        return
    resp, body, _ = await pool.request("POST", scope["path"], headers=[(b"content-type", b"application/json")], body=b"".join(chunks))
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": resp.status, "headers": head})
    await send({"type": "http.response.body", "body": body})

async def main(port):
    try:  # the gateway's own server, where the checkout has one
        from smgrl.http.server import serve as own_serve
    except ImportError:  # an older checkout (--baseline-src): its patched hypercorn
        from smgrl.http import hypercorn_patches
        assert hypercorn_patches.apply()
        await serve(app, hypercorn_config(Config(host="127.0.0.1", port=port)))
        return
    import socket
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(4096)
    sock.setblocking(False)
    await own_serve(app, [sock], shutdown_trigger=trio.sleep_forever, graceful_timeout=1)

trio.run(main, int(sys.argv[1]))
"""


def wait_routable(base: str, deadline_s: float = 60.0) -> None:
    """Until a /generate through the gateway answers 200 (registration is asynchronous)."""
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            req = urllib.request.Request(
                base + "/generate", data=GENERATE_BODY, headers={"content-type": "application/json"}
            )
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.HTTPError):
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{base} never routed a /generate")


def serve(front: str, argv: list[str]) -> None:
    """Child entry: ``smgrl launch`` with the data plane behind the chosen front."""
    import smgrl.runtime.server
    from smgrl.cli.main import main

    if front == "quart":
        original = smgrl.runtime.server.create_app

        def create_app(gateway, journal_routes=None):
            app = original(gateway, journal_routes)
            _quart_front(app)
            return app

        smgrl.runtime.server.create_app = create_app
    main(["launch", *argv])


def _quart_front(app) -> None:
    """The same data-plane service behind Quart routes (buffered requests only)."""
    from quart import Response, request

    from smgrl.dataplane import request as rq

    dp = app.dataplane
    app.asgi_app = app.asgi_app.inner  # drop the raw ASGI front

    async def rollout():
        body = await request.get_data(cache=False)
        req = rq.parse(request.path, body)
        model = dp.resolve_model(req.model)
        headers = [(k.lower().encode(), v.encode()) for k, v in request.headers.items()]
        async with dp.dispatch(req, body, headers, model=model, buffered=True) as d:
            status, data = d.response.status, d.body
            wid = d.instance.worker_id
        return Response(
            data, status=status, content_type="application/json", headers={"x-smg-routed-worker-id": wid}
        )

    for path in (rq.GENERATE, rq.COMPLETIONS, rq.CHAT):
        app.add_url_rule(path, "dp" + path, rollout, methods=["POST"])


# -- the run --------------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """``pid`` and its descendants (Linux /proc): a --workers supervisor and its workers."""
    out, todo = [], [pid]
    while todo and len(out) < 256:
        p = todo.pop()
        out.append(p)
        # Every thread's list: a child started from a worker thread is listed under that thread.
        for path in glob.glob(f"/proc/{p}/task/*/children"):
            try:
                with open(path) as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
    return out


def cpu_seconds(pid: int | list[int] | None) -> float:
    """User + system CPU of a process (or the sum over several) so far (Linux /proc), 0.0 when unknown."""
    if isinstance(pid, list):
        return sum(cpu_seconds(p) for p in pid)
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def measure(name: str, origins: list[str], args, results: dict, pid: int | list[int] | None = None) -> None:
    for c in args.concurrency:
        total = max(args.requests, c * 8) if c > 1 else max(args.requests // 4, 200)
        cpu0 = cpu_seconds(pid)
        lat, rps, errors = trio.run(
            closed_loop, origins, "/generate", GENERATE_BODY, c, total, getattr(args, "group_size", 0)
        )
        cpu_us = (cpu_seconds(pid) - cpu0) / total * 1e6 if pid else float("nan")
        results.setdefault(name, {})[c] = {
            "p50": pct(lat, 0.5),
            "p99": pct(lat, 0.99),
            "rps": rps,
            "errors": errors,
            "cpu_us": cpu_us,
            "requests": total,
        }
        print(f"{name:12s} c={c:<4d} p50={pct(lat, .5):7.2f}ms p99={pct(lat, .99):7.2f}ms "
              f"{rps:8.0f} req/s errors={errors} gateway CPU {cpu_us:6.0f} us/request", flush=True)  # fmt: skip
    if args.streams:
        cps, gaps, dropped, failed = trio.run(
            streams, origins, args.streams, args.stream_tokens, args.stream_route
        )
        results.setdefault(name, {})["streams"] = {
            "chunks_per_s": cps,
            "gap_p50": pct(gaps, 0.5),
            "gap_p99": pct(gaps, 0.99),
            "dropped": dropped,
            "failed": failed,
        }
        print(f"{name:12s} streams={args.streams} {cps:8.0f} chunks/s gap p99={pct(gaps, .99):.2f}ms "
              f"dropped={dropped} failed={failed}", flush=True)  # fmt: skip


def interleaved_p50(
    targets: list[tuple[str, list[str]]], rounds: int, per_round: int
) -> dict[str, list[float]]:
    """Median latency (ms) of ``per_round`` sequential requests per target per round, rounds
    interleaved, the order rotated each round (``targets[0]`` is the direct baseline)."""
    medians: dict[str, list[float]] = {name: [] for name, _ in targets}
    for r in range(rounds):
        k = r % len(targets)
        for name, origins in targets[k:] + targets[:k]:
            lat, _, _ = trio.run(closed_loop, origins, "/generate", GENERATE_BODY, 1, per_round)
            medians[name].append(pct(lat, 0.5))
    return medians


def interleaved_table(medians: dict[str, list[float]], reference: str | None) -> str:
    """Added p50 per round (gateway median - direct median of the same round): median of
    medians, p25-p75, min-max; ratios to ``reference`` round by round."""
    direct = medians["direct"]
    added = {
        name: [m - d for m, d in zip(ms, direct, strict=True)]
        for name, ms in medians.items()
        if name != "direct"
    }
    lines = [
        (
            f"added p50 at 1 client over {len(direct)} interleaved rounds (direct p50: median"
            f" {pct(direct, 0.5):.3f} ms, p25-p75 {pct(direct, 0.25):.3f}-{pct(direct, 0.75):.3f}):"
        ),
        "",
        (
            "| gateway | added p50 ms (median of rounds) | p25-p75 | min-max | ratio to "
            f"{reference or '-'} (median of rounds) | ratio p25-p75 |"
        ),
        "|---|---|---|---|---|---|",
    ]
    for name, xs in added.items():
        ratio, spread = "-", "-"
        if reference is not None and reference in added and name != reference:
            ratios = [x / ref for x, ref in zip(xs, added[reference], strict=True) if ref > 0]
            if ratios:
                ratio = f"{pct(ratios, 0.5):.3f}"
                spread = f"{pct(ratios, 0.25):.3f}-{pct(ratios, 0.75):.3f}"
        lines.append(
            f"| {name} | {pct(xs, 0.5):.3f} | {pct(xs, 0.25):.3f}-{pct(xs, 0.75):.3f} |"
            f" {min(xs):.3f}-{max(xs):.3f} | {ratio} | {spread} |"
        )
    return "\n".join(lines)


def run_interleaved(args) -> None:
    """``--interleaved-p50``: every gateway at once, one set of instant fakes (module docstring)."""
    workers = [int(w) for w in args.workers.split(",") if w]
    if not workers and not args.baseline_src:
        sys.exit("error: --interleaved-p50 needs --workers N,... (or --baseline-src)")
    children: list[Child] = []
    with tempfile.TemporaryDirectory(prefix="smgrl-bench-dp-") as workdir:
        try:
            fake, urls = start_fake_engines("sglang", args.engines)
            children.append(fake)
            targets: list[tuple[str, list[str]]] = [("direct", urls)]
            for n in workers:
                port = free_port()
                child, metrics_url = start_workers(urls, port, n, workdir, args.policy)
                children.append(child)
                base = f"http://127.0.0.1:{port}"
                wait_listening(base, child=child)
                wait_workers(metrics_url, n)
                wait_routable(base)
                targets.append((f"smgrl --workers {n}", [base]))
            if args.baseline_src:
                port = free_port()
                child = start_smgrl(
                    urls, port, "asgi", workdir, args.policy, src=os.path.abspath(args.baseline_src)
                )
                children.append(child)
                base = f"http://127.0.0.1:{port}"
                wait_listening(base, child=child)
                wait_routable(base)
                targets.append(("smgrl-baseline", [base]))
            print(
                f"{len(targets) - 1} gateway(s), {args.interleaved_p50} rounds x {args.round_requests} requests",
                flush=True,
            )
            medians = interleaved_p50(targets, args.interleaved_p50, args.round_requests)
        finally:
            for child in reversed(children):
                child.stop()
    text = interleaved_table(medians, targets[1][0] if len(targets) > 1 else None)
    text += f"\n\n(load average at the end: {os.getloadavg()[0]:.1f})"
    print()
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
            f.write("\n<!-- raw -->\n" + json.dumps(medians) + "\n")


def report_pins(name: str, workdir: str, workers: int, baseline: bool, results: dict) -> None:
    """Prompt-group pin events the run journaled (gateways sharing a journal decide each group's
    pin once, by a conditional append, and release it once), per request sent."""
    import sqlite3

    path = os.path.join(workdir, f"workers-{workers}{'-baseline' if baseline else ''}.db")
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        pins, releases = (
            db.execute("SELECT count(*) FROM events WHERE type = ?", (t,)).fetchone()[0]
            for t in ("dataplane.group_pinned", "dataplane.group_released")
        )
    sent = sum(
        r["requests"] for r in results.get(name, {}).values() if isinstance(r, dict) and "requests" in r
    )
    results.setdefault(name, {})["pins"] = {"pinned": pins, "released": releases, "requests": sent}
    print(f"{name:12s} journaled {pins} pins and {releases} releases for {sent} requests", flush=True)


def table(results: dict, args) -> str:
    direct = results.get("direct", {})
    lines = [
        "| gateway | clients | p50 ms | p99 ms | added p50 ms | added p99 ms | req/s | gateway CPU us/req | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rows in results.items():
        for c in args.concurrency:
            r = rows.get(c)
            if r is None:
                continue
            d = direct.get(c)
            add50 = f"{r['p50'] - d['p50']:.2f}" if d and name != "direct" else "-"
            add99 = f"{r['p99'] - d['p99']:.2f}" if d and name != "direct" else "-"
            lines.append(
                f"| {name} | {c} | {r['p50']:.2f} | {r['p99']:.2f} | {add50} | {add99} | {r['rps']:.0f} | {r['cpu_us']:.0f} | {r['errors']} |"
            )
    bare = results.get("server-bare", {})
    proxy = results.get("server-bare-proxy", {})
    if bare and "smgrl" in results:
        lines += [
            "",
            (
                "smgrl's own CPU per request (smgrl minus the bare server, same run); the"
                " bare proxy minus the bare app is the upstream hop any forwarding app pays:"
            ),
            "",
        ]
        for c in args.concurrency:
            s, b, p = results["smgrl"].get(c), bare.get(c), proxy.get(c)
            if s and b:
                hop = f"; upstream hop {p['cpu_us'] - b['cpu_us']:.0f} us" if p else ""
                lines.append(
                    f"- {c} clients: {s['cpu_us'] - b['cpu_us']:.0f} us ({s['cpu_us']:.0f} - {b['cpu_us']:.0f}){hop}"
                )
    if args.streams:
        lines += [
            "",
            f"{args.streams} concurrent streams x {args.stream_tokens} tokens (`{args.stream_route}`, `stream: true`):",
            "",
            "| gateway | chunks/s | inter-chunk p50 ms | inter-chunk p99 ms | added p99 ms | dropped chunks | failed streams |",
            "|---|---|---|---|---|---|---|",
        ]
        ds = direct.get("streams")
        for name, rows in results.items():
            s = rows.get("streams")
            if s is None:
                continue
            added = f"{s['gap_p99'] - ds['gap_p99']:.2f}" if ds and name != "direct" else "-"
            lines.append(
                f"| {name} | {s['chunks_per_s']:.0f} | {s['gap_p50']:.2f} | {s['gap_p99']:.2f} | {added} | {s['dropped']} | {s['failed']} |"
            )
    return "\n".join(lines)


def interleaved(args, urls: list[str], workdir: str) -> str:
    """Every gateway up at once; each round gives each of them ``--interleave`` requests at each
    concurrency, the order reversed every other round (on a busy VM the gateway measured right
    after another one's block fares worse): machine noise then hits them alike. Gateway CPU per
    request summed over its blocks (/proc)."""
    children: dict[str, Child] = {}
    bases: dict[str, str] = {}
    log = open(os.path.join(workdir, "interleaved.log"), "w")  # noqa: SIM115 - the children hold it
    try:
        wanted = [("smgrl", None)]
        if args.baseline_src:
            wanted.append(("smgrl-baseline", os.path.abspath(args.baseline_src)))
        for name, src in wanted:
            port = free_port()
            children[name] = start_smgrl(urls, port, "asgi", workdir, args.policy, src=src)
            bases[name] = f"http://127.0.0.1:{port}"
        if not args.no_bare:
            bare = [("server-bare", None)]
            if args.baseline_src:
                bare.append(("server-bare-baseline", os.path.abspath(args.baseline_src)))
            for name, src in bare:
                port = free_port()
                children[name] = start_bare(port, log, src=src)
                bases[name] = f"http://127.0.0.1:{port}"
        if not args.no_smg and args.smg_bin and os.path.exists(args.smg_bin):
            port = free_port()
            children["SMG 1.13.0"] = start_smg(args.smg_bin, urls, port, workdir, args.policy)
            bases["SMG 1.13.0"] = f"http://127.0.0.1:{port}"
        for name, base in bases.items():
            if not name.startswith("server-bare"):
                wait_listening(base, child=children[name])
            wait_routable(base)
        lines = [
            "| clients | gateway | p50 ms | p99 ms | gateway CPU us/req | CPU / SMG |",
            "|---|---|---|---|---|---|",
        ]
        for c in args.concurrency:
            block = max(args.interleave, c * 4)
            lat: dict[str, list[float]] = {name: [] for name in bases}
            cpu = dict.fromkeys(bases, 0.0)
            done = dict.fromkeys(bases, 0)
            for turn in range(args.rounds):
                order = list(bases.items())
                if turn % 2:
                    order.reverse()
                for name, base in order:
                    pid = children[name].pid
                    c0 = cpu_seconds(pid)
                    got, _, _ = trio.run(closed_loop, [base], "/generate", GENERATE_BODY, c, block)
                    cpu[name] += cpu_seconds(pid) - c0
                    done[name] += block
                    lat[name] += got
            us = {name: cpu[name] / done[name] * 1e6 for name in bases}
            ref = us.get("SMG 1.13.0")
            for name in bases:
                vs = f"{us[name] / ref:.2f}x" if ref else "-"
                lines.append(
                    f"| {c} | {name} | {pct(lat[name], 0.5):.2f} | {pct(lat[name], 0.99):.2f} | {us[name]:.0f} | {vs} |"
                )
            print("\n".join(lines[-len(bases) :]), flush=True)
            if "server-bare" in us:
                lines.append(f"| {c} | smgrl - bare | | | {us['smgrl'] - us['server-bare']:.0f} | |")
    finally:
        for child in children.values():
            child.stop()
        log.close()
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3:])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=int, default=4)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--concurrency", default="1,64,256")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--stream-tokens", type=int, default=32)
    ap.add_argument("--stream-route", default="/v1/completions", choices=["/v1/completions", "/generate"])
    ap.add_argument("--token-latency-ms", type=float, default=20.0, help="fake engines' per-token delay")
    ap.add_argument("--policy", default="round_robin")
    ap.add_argument("--fronts", action="store_true", help="also measure the Quart-route front")
    ap.add_argument("--smg-bin", default=shutil.which("smg") or "/tmp/smgvenv/bin/smg")
    ap.add_argument("--no-smg", action="store_true")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare-server floor")
    ap.add_argument(
        "--baseline-src",
        default=None,
        help="also measure the smgrl of this checkout (e.g. `git worktree add /tmp/base main`) as smgrl-baseline",
    )
    ap.add_argument(
        "--workers",
        default="",
        help="also measure `smgrl launch --workers N` on an SQLite journal for each N listed (e.g. 1,2):"
        " CPU per request summed over the supervisor and its workers",
    )
    ap.add_argument(
        "--interleaved-p50",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="only the added p50 at 1 client: ROUNDS interleaved rounds over direct, each --workers N"
        " and --baseline-src, all running at once; median of round medians and the spread",
    )
    ap.add_argument("--round-requests", type=int, default=40, help="sequential requests per target per round")
    ap.add_argument(
        "--interleave",
        type=int,
        default=0,
        help="non-streaming only: every gateway up at once, blocks of this many requests (at least"
        " 4 per client) alternating between them for --rounds rounds (CPU per request on a busy machine)",
    )
    ap.add_argument("--rounds", type=int, default=6, help="rounds of --interleave blocks")
    ap.add_argument(
        "--group-size",
        type=int,
        default=0,
        help="send prompt groups (x-prompt-id) of this many requests running together (0: none);"
        " with --workers, the pins journaled per request are reported",
    )
    ap.add_argument(
        "--wrk", type=int, default=0, metavar="RUNS", help="load from wrk instead (dataplane_wrk.py)"
    )
    ap.add_argument("--wrk-connections", type=int, default=64)
    ap.add_argument("--wrk-secs", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    if args.wrk:
        from benchmarks.dataplane_wrk import run_wrk

        run_wrk(args, start_smgrl, start_smg, start_bare, wait_routable, cpu_seconds)
        return
    if args.interleaved_p50:
        run_interleaved(args)
        return
    if args.interleave:
        with tempfile.TemporaryDirectory(prefix="smgrl-bench-dp-") as workdir:
            fake, urls = start_fake_engines("sglang", args.engines)
            try:
                text = interleaved(args, urls, workdir)
            finally:
                fake.stop()
        print()
        print(text)
        if args.out:
            with open(args.out, "w") as f:
                f.write(text + "\n")
        return

    children: list[Child] = []
    results: dict = {}
    with tempfile.TemporaryDirectory(prefix="smgrl-bench-dp-") as workdir:
        try:
            # Two sets of the same fakes: instant ones for the per-request floor, and ones that
            # generate at --token-latency-ms per token for streams that behave like real ones.
            fake, urls = start_fake_engines("sglang", args.engines)
            children.append(fake)
            slow_fake, slow_urls = start_fake_engines(
                "sglang", args.engines, ["--token-latency-ms", str(args.token_latency_ms)]
            )
            children.append(slow_fake)
            print(f"{args.engines} fake engines: {', '.join(urls)}", flush=True)
            plain = argparse.Namespace(**{**vars(args), "streams": 0})
            only_streams = argparse.Namespace(**{**vars(args), "concurrency": []})
            measure("direct", urls, plain, results)
            if args.streams:
                measure("direct", slow_urls, only_streams, results)
            gateways = [("smgrl", "asgi")]
            if args.baseline_src:
                gateways.append(("smgrl-baseline", "baseline"))
            if not args.no_bare:
                gateways.append(("server-bare", "bare"))
                gateways.append(("server-bare-proxy", "bare-proxy"))
            if args.fronts:
                gateways.append(("smgrl-quart", "quart"))
            for n in [int(w) for w in args.workers.split(",") if w]:
                gateways.append((f"smgrl --workers {n}", f"workers:{n}"))
                if args.baseline_src:
                    gateways.append((f"smgrl-baseline --workers {n}", f"baseline-workers:{n}"))
            if not args.no_smg and args.smg_bin and os.path.exists(args.smg_bin):
                gateways.append(("SMG 1.13.0", "smg"))
            for name, front in gateways:
                phases = [(urls, plain)]
                if (
                    args.streams
                    and front not in ("quart", "bare", "bare-proxy")
                    and not front.startswith("workers")
                ):
                    phases.append((slow_urls, only_streams))
                for engine_urls, phase_args in phases:
                    port = free_port()
                    if front == "smg":
                        child = start_smg(args.smg_bin, engine_urls, port, workdir, args.policy)
                    elif front in ("bare", "bare-proxy"):
                        log = open(os.path.join(workdir, f"{front}.log"), "w")  # noqa: SIM115 - the child holds it
                        child = start_bare(port, log, engine_urls if front == "bare-proxy" else [])
                    elif front == "baseline":
                        src = os.path.abspath(args.baseline_src)
                        child = start_smgrl(engine_urls, port, "asgi", workdir, args.policy, src=src)
                    elif front.startswith(("workers:", "baseline-workers:")):
                        n = int(front.split(":")[1])
                        src = os.path.abspath(args.baseline_src) if front.startswith("baseline") else None
                        child, metrics_url = start_workers(engine_urls, port, n, workdir, args.policy, src)
                    else:
                        child = start_smgrl(engine_urls, port, front, workdir, args.policy)
                    children.append(child)
                    base = f"http://127.0.0.1:{port}"
                    if not front.startswith("bare"):  # the bare apps have no /liveness
                        wait_listening(base, child=child)
                    pids: int | list[int] = child.pid
                    if front.startswith(("workers:", "baseline-workers:")):
                        wait_workers(metrics_url, n)
                        pids = process_tree(child.pid)  # the supervisor and every worker
                    wait_routable(base)
                    measure(name, [base], phase_args, results, pids)
                    child.stop()
                    if args.group_size and front.startswith(("workers:", "baseline-workers:")):
                        report_pins(name, workdir, n, front.startswith("baseline"), results)
        finally:
            for child in reversed(children):
                child.stop()
    text = table(results, args)
    print()
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
            f.write("\n<!-- raw -->\n" + json.dumps(results, default=str) + "\n")


if __name__ == "__main__":
    main()

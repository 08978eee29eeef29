"""Fan-out latency of the upstream HTTP client: EnginePool vs httpx, side by side in one run.

    .venv/bin/python benchmarks/upstream.py [--engines 1,8,64,256] [--scale 1.0]

N trivial keep-alive HTTP/1.1 engines listen on 127.0.0.1 in a SEPARATE process (started here
with ``--serve``, stopped by its PID at the end). This process then times a concurrent fan-out
of ``POST /flush_cache`` to all N engines (one trio task per engine, body read in full), for
each client, rounds interleaved so machine noise hits every client alike:

- ``bare``: a fixed request written straight onto one kept-alive trio stream per engine and a
  fixed-length read (no parsing, no error handling): the floor for Python on trio.
- ``EnginePool``: smgrl.upstream, one pool per engine.
- ``httpx per engine``: one ``httpx.AsyncClient`` per engine.
- ``httpx shared``: one ``httpx.AsyncClient`` for all engines, default limits (100
  connections, 20 kept alive), as most code uses it.
- ``httpx shared, no limits``: the same with the pool limits lifted, to separate the cost of
  the limits from the cost of sharing one pool.

The engine process is a single-threaded ``selectors`` loop (cheaper per request than any
Python HTTP server) so that, on a small machine, the client side dominates what is measured.
Ratios matter, not absolutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import selectors
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial

BODY = (
    b"Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    b"waiting requests, the operation will not be performed.)\n"
)
RESPONSE = (
    b"HTTP/1.1 200 OK\r\ndate: Mon, 01 Jan 2024 00:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-length: %d\r\ncontent-type: text/plain; charset=utf-8\r\n\r\n" % len(BODY)
) + BODY


# -- the engines (a separate process) ------------------------------------------------------------


def serve(count: int) -> None:
    """Listen on ``count`` ports, print them as JSON, answer every request with RESPONSE."""
    selector = selectors.DefaultSelector()
    ports = []
    for _ in range(count):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1024)
        listener.setblocking(False)
        selector.register(listener, selectors.EVENT_READ, None)
        ports.append(listener.getsockname()[1])
    print(json.dumps(ports), flush=True)
    while True:
        for key, _ in selector.select():
            sock = key.fileobj
            if key.data is None:
                connection, _ = sock.accept()
                connection.setblocking(False)
                connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                selector.register(connection, selectors.EVENT_READ, bytearray())
                continue
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            if not data:
                selector.unregister(sock)
                sock.close()
                continue
            buffer = key.data
            buffer += data
            while (end := buffer.find(b"\r\n\r\n")) >= 0:
                length = 0
                for line in bytes(buffer[:end]).lower().split(b"\r\n"):
                    if line.startswith(b"content-length:"):
                        length = int(line[15:])
                if len(buffer) < end + 4 + length:
                    break
                del buffer[: end + 4 + length]
                sock.sendall(RESPONSE)  # tiny: fits the socket buffer, never blocks


# -- the clients (this process) ------------------------------------------------------------------

Call = Callable[[], Awaitable[None]]


async def make_calls(ports: list[int]) -> tuple[dict[str, list[Call]], Call]:
    """Per client, one zero-argument call per engine; and a function closing everything."""
    import httpx
    import trio

    from smgrl.upstream import EnginePool

    origins = [f"http://127.0.0.1:{port}" for port in ports]
    request = b"POST /flush_cache HTTP/1.1\r\nhost: 127.0.0.1\r\naccept: */*\r\n\r\n"
    streams = [await trio.open_tcp_stream("127.0.0.1", port) for port in ports]
    pools = [EnginePool(origin) for origin in origins]
    per_engine = [httpx.AsyncClient(base_url=origin) for origin in origins]
    shared = httpx.AsyncClient()
    unlimited = httpx.AsyncClient(limits=httpx.Limits(max_connections=None, max_keepalive_connections=None))
    headers = [(b"accept", b"*/*")]

    async def bare_one(stream: trio.SocketStream) -> None:
        await stream.send_all(request)
        received = 0
        while received < len(RESPONSE):
            received += len(await stream.receive_some(65536))

    async def pool_one(pool: EnginePool) -> None:
        response, _, _ = await pool.request("POST", "/flush_cache", headers=headers, limit=1 << 20)
        assert response.status == 200

    async def httpx_one(client: httpx.AsyncClient, url: str) -> None:
        response = await client.post(url)
        assert response.status_code == 200

    calls = {
        "bare": [partial(bare_one, stream) for stream in streams],
        "EnginePool": [partial(pool_one, pool) for pool in pools],
        "httpx per engine": [partial(httpx_one, client, "/flush_cache") for client in per_engine],
        "httpx shared": [partial(httpx_one, shared, origin + "/flush_cache") for origin in origins],
        "httpx shared, no limits": [
            partial(httpx_one, unlimited, origin + "/flush_cache") for origin in origins
        ],
    }

    async def close() -> None:
        for stream in streams:
            await stream.aclose()
        for pool in pools:
            await pool.aclose()
        for client in [*per_engine, shared, unlimited]:
            await client.aclose()

    return calls, close


async def fan_out(calls: list[Call], errors: dict[str, int], name: str) -> None:
    import trio

    async def guarded(call: Call) -> None:
        # A failed call is counted, not fatal: httpx's shared pool does fail under trio at
        # wide fan-outs ("this socket was already closed"), and that is a result too.
        try:
            await call()
        except Exception:  # noqa: BLE001 (any failure is a failed call)
            errors[name] += 1

    async with trio.open_nursery() as nursery:
        for call in calls:
            nursery.start_soon(guarded, call)


async def measure(
    ports: list[int], rounds: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, int]]:
    calls, close = await make_calls(ports)
    names = list(calls)
    samples: dict[str, list[float]] = {name: [] for name in names}
    errors = dict.fromkeys(names, 0)
    try:
        for index in range(warmup + rounds):
            # Rotate the order each round so no client always runs right after another.
            offset = index % len(names)
            for name in names[offset:] + names[:offset]:
                started = time.perf_counter()
                await fan_out(calls[name], errors, name)
                if index >= warmup:
                    samples[name].append((time.perf_counter() - started) * 1000)
    finally:
        await close()
    return samples, errors


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engines", default="1,8,64,256", help="comma-separated fan-out widths")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the number of rounds")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the engine process
    args = parser.parse_args()
    if args.serve:
        serve(args.serve)
        return

    import httpx
    import trio

    widths = [int(n) for n in args.engines.split(",")]
    engines = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(max(widths))], stdout=subprocess.PIPE
    )
    try:
        ports = json.loads(engines.stdout.readline())  # type: ignore[union-attr]
        results = {}
        for width in widths:
            rounds = max(20, int(min(400, 6400 // width) * args.scale))
            results[width] = (rounds, trio.run(measure, ports[:width], rounds, 3))
            print(f"measured {width} engines x {rounds} rounds", file=sys.stderr)
    finally:
        engines.terminate()  # by PID: only the process this script started
        try:
            engines.wait(timeout=5)
        except subprocess.TimeoutExpired:
            engines.kill()
            engines.wait()

    print(
        f"\nFan-out of POST /flush_cache, loopback, {platform.python_implementation()} "
        f"{platform.python_version()}, trio {trio.__version__}, httpx {httpx.__version__}, "
        f"{len(os.sched_getaffinity(0))} CPUs; latency per whole fan-out in ms.\n"
    )
    print("| engines | rounds | client | p50 ms | p99 ms | p50 vs EnginePool | failed calls |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for width, (rounds, (samples, errors)) in results.items():
        base = statistics.median(samples["EnginePool"])
        for name, values in samples.items():
            p50, p99 = statistics.median(values), percentile(values, 0.99)
            print(
                f"| {width} | {rounds} | {name} | {p50:.2f} | {p99:.2f} | {p50 / base:.2f}x | {errors[name]} |"
            )


if __name__ == "__main__":
    main()

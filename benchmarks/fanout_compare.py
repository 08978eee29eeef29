"""``benchmarks/fanout.py --compare``: smgrl, SMG 1.13.0 and the direct fan-out, interleaved.

Per fleet size N, on one engine process (``--engine min``: ``benchmarks/min_engine.py``, a
minimal stdlib server; ``--engine smgrl``: smgrl's fake engine), both gateways run at once with
the same N engines, registered by ``--worker-urls`` or (``--register labels``) through
``POST /workers`` with a label the fan-out then selects (``selector=bench=yes``). Then
``--rounds`` rounds, each giving every participant ``--iters`` sequential fan-outs over one
kept-alive connection, in an order reversed every other round. The participants:

* ``smgrl`` and ``SMG 1.13.0``: ``POST /v1/rl/engine/flush_cache?selector=...`` (body ``{}``);
* ``direct``: this process sends the N ``POST /flush_cache`` itself, over kept-alive sockets,
  at most ``--concurrency`` in flight (the gateways' bound, SMG's default 32), with nothing but
  the standard library: the floor any gateway adds to.

Reported per participant: p50 and p99 over all rounds, the spread (lowest and highest p50 of a
round), the added time (p50 minus direct's p50), CPU per fan-out (``/proc``), and the ratios
to SMG of the p50 and of the added time. The load average is printed before and after.
"""

from __future__ import annotations

import http.client
import json
import os
import selectors
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from smgrl.demo.procs import Child, free_port, start_fake_engines, wait_for_workers

HERE = os.path.dirname(os.path.abspath(__file__))


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def interleave(
    run: dict[str, Callable[[], float]], pids: dict[str, int], rounds: int, iters: int
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, float]]:
    """The one measurement loop of the fan-out benchmarks: ``rounds`` rounds, each calling every
    participant's ``run[name]()`` (one request, its latency in ms) ``iters`` times in a row, in an
    order reversed every other round, so that the machine's load hits every participant alike.

    Returns every latency per participant, the median of each of its rounds (the spread), and the
    CPU seconds its process spent during its own blocks (``pids[name]``; this process when the
    participant has no pid of its own, as the direct fan-out)."""
    lat: dict[str, list[float]] = {name: [] for name in run}
    medians: dict[str, list[float]] = {name: [] for name in run}
    cpu = dict.fromkeys(run, 0.0)
    for r in range(rounds):
        # The order reversed every other round: on a busy 2-core VM the participant measured
        # right after another one's block had a worse p50, which a fixed order charged to the
        # same participant every time.
        order = list(run)
        if r % 2:
            order.reverse()
        for name in order:
            pid = pids.get(name, os.getpid())
            c0 = cpu_seconds(pid)
            got = [run[name]() for _ in range(iters)]
            cpu[name] += cpu_seconds(pid) - c0
            lat[name] += got
            medians[name].append(statistics.median(got))
    return lat, medians, cpu


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def start_min_engines(count: int, log) -> tuple[Child, list[str]]:
    ports = []
    while len(ports) < count:  # a run of free consecutive ports
        first = free_port()
        if first + count > 65000:
            continue
        ports = list(range(first, first + count))
        for p in ports:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ports = []
                    break
    argv = [sys.executable, os.path.join(HERE, "min_engine.py"), "--ports", f"{ports[0]}-{ports[-1]}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 30
    for p in (ports[0], ports[-1]):
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", p)) == 0:
                    break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("benchmarks/min_engine.py did not start")
            time.sleep(0.05)
    return Child(proc, "min-engine"), [f"http://127.0.0.1:{p}" for p in ports]


class Direct:
    """N ``POST /flush_cache`` over kept-alive sockets, ``concurrency`` in flight (stdlib only)."""

    REQUEST = b"POST /flush_cache HTTP/1.1\r\nhost: e\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"

    def __init__(self, urls: list[str], concurrency: int) -> None:
        self.concurrency = concurrency
        self.socks = []
        for url in urls:
            host, _, port = url.rpartition("/")[2].partition(":")
            s = socket.create_connection((host, int(port)))
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            self.socks.append(s)
        self.sel = selectors.DefaultSelector()

    def once(self) -> float:
        t0 = time.perf_counter()
        waiting = iter(self.socks)
        bufs: dict[socket.socket, bytes] = {}

        def launch() -> None:
            s = next(waiting, None)
            if s is not None:
                s.send(self.REQUEST)
                bufs[s] = b""
                self.sel.register(s, selectors.EVENT_READ)

        for _ in range(self.concurrency):
            launch()
        while bufs:
            for key, _ in self.sel.select(30):
                s = key.fileobj
                buf = bufs[s] + s.recv(65536)
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    bufs[s] = buf
                    continue
                at = buf.lower().find(b"content-length:", 0, end)
                length = int(buf[at + 15 : buf.find(b"\r\n", at)]) if at >= 0 else 0
                if len(buf) < end + 4 + length:
                    bufs[s] = buf
                    continue
                if not buf.startswith(b"HTTP/1.1 200"):
                    raise RuntimeError(f"direct call answered {buf[:40]!r}")
                del bufs[s]
                self.sel.unregister(s)
                launch()
        return (time.perf_counter() - t0) * 1000

    def close(self) -> None:
        for s in self.socks:
            s.close()


class Client:
    def __init__(self, port: int, path: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.path = path

    def once(self) -> float:
        t0 = time.perf_counter()
        self.conn.request("POST", self.path, body=b"{}", headers={"content-type": "application/json"})
        resp = self.conn.getresponse()
        body = resp.read()
        dt = (time.perf_counter() - t0) * 1000
        if resp.status != 200:
            raise RuntimeError(f"fan-out answered {resp.status}: {body[:200]!r}")
        return dt


def register(port: int, urls: list[str]) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for url in urls:
        body = json.dumps({"url": url, "labels": {"bench": "yes"}})
        conn.request("POST", "/workers", body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        if resp.status not in (200, 201, 202):
            raise RuntimeError(f"POST /workers answered {resp.status}")
    conn.close()


def start_gateways(
    children: dict, reg: list[str], work: str, n: int, log, baseline_src, smg, starters
) -> None:
    """Start into ``children`` (name -> (Child, port)) smgrl, the smgrl of ``baseline_src`` when
    given, and SMG when ``smg`` names its binary, on the engines ``reg`` (``--worker-urls``; empty:
    registered later). ``starters``: (start_smgrl, start_smgrl_src, start_smg) of fanout.py."""
    start_smgrl, start_smgrl_src, start_smg = starters
    children["smgrl"] = start_smgrl(reg, os.path.join(work, f"j{n}.db"), log)
    if baseline_src:
        src = os.path.abspath(baseline_src)
        children["smgrl (baseline)"] = start_smgrl_src(reg, os.path.join(work, f"b{n}.db"), src, log)
    if smg:
        children["SMG 1.13.0"] = start_smg(smg, reg, log)


def compare(args, smg: str | None, start_smg, start_smgrl, start_smgrl_src=None) -> None:
    starters = (start_smgrl, start_smgrl_src, start_smg)
    sizes = [int(s) for s in args.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="smgrl-bench-compare-")
    log = open(os.path.join(work, "children.log"), "w")  # noqa: SIM115 - the children share it
    print(f"load average at start: {load()}", file=sys.stderr)
    if args.engine == "min":
        fakes, all_urls = start_min_engines(max(sizes), log)
    else:
        fakes, all_urls = start_fake_engines("sglang", max(sizes))
    labels = args.register == "labels"
    path = "/v1/rl/engine/flush_cache?selector=" + ("bench%3Dyes" if labels else "engine%3Dsglang")
    lines = [
        (
            f"engines: {args.engine}; registration: {args.register}; {args.rounds} rounds x {args.iters} "
            f"fan-outs per participant, order reversed every other round; direct bound {args.concurrency}"
        ),
        "",
        (
            "| engines | participant | p50 ms | p99 ms | spread of round p50s | added ms | CPU us | "
            "p50 / SMG | added / SMG |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    try:
        for n in sizes:
            urls = all_urls[:n]
            children = {}
            try:
                reg = [] if labels else urls
                start_gateways(children, reg, work, n, log, args.baseline_src, smg, starters)
                for child, port in children.values():
                    if labels:
                        wait_for_workers(f"http://127.0.0.1:{port}", 0, child=child, timeout=60)
                        register(port, urls)
                    wait_for_workers(f"http://127.0.0.1:{port}", n, child=child, timeout=120)
                run = {name: Client(port, path).once for name, (_, port) in children.items()}
                direct = Direct(urls, args.concurrency)
                run["direct"] = direct.once
                for fn in run.values():  # warm-up: connections, caches
                    for _ in range(10):
                        fn()
                pids = {name: children[name][0].pid for name in children}
                lat, rounds, cpu = interleave(run, pids, args.rounds, args.iters)
                direct.close()
                lines += _rows(n, lat, rounds, cpu)
                print("\n".join(lines[-len(run) :]), file=sys.stderr)
            finally:
                for child, _ in children.values():
                    child.stop()
    finally:
        fakes.stop()
        log.close()
    lines.append("")
    lines.append(f"load average at the end: {load()}")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


def _rows(n: int, lat: dict, rounds: dict, cpu: dict) -> list[str]:
    p50 = {k: statistics.median(v) for k, v in lat.items()}
    added = {k: p50[k] - p50["direct"] for k in lat}
    ref = "SMG 1.13.0" if "SMG 1.13.0" in lat else None
    out = []
    for name, samples in lat.items():
        us = f"{cpu[name] / len(samples) * 1e6:.0f}" if name != "direct" else "-"
        vs = vs_added = ""
        if ref and name != "direct":
            vs = f"{p50[name] / p50[ref]:.2f}x"
            vs_added = f"{added[name] / added[ref]:.2f}x" if added[ref] > 0 else "-"
        out.append(
            f"| {n} | {name} | {p50[name]:.2f} | {pct(samples, 0.99):.2f} | "
            f"{min(rounds[name]):.2f}-{max(rounds[name]):.2f} | "
            f"{added[name]:.2f} | {us} | {vs} | {vs_added} |"
        )
    return out

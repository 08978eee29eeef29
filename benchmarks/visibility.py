#!/usr/bin/env python3
"""Cross-process visibility lag through the gateway: a change acknowledged by one gateway process
until another process serves it (docs/scale-out.md).

Starts two gateway processes on one journal, each on its own port (SQLite: the two processes of
one ``--workers`` group, given the same group token; PostgreSQL with ``--postgres``: a server
started by tests/journal/pg_harness.py, as two hosts would share it), registers one worker through
A, then ``--rounds`` times: ``PATCH /workers/{id}`` a new label through A and, once A answered,
polls ``GET /workers/{id}`` on B until B serves that label. The lag is from A's answer to B's
first answer with the label (an upper bound: it includes B's last poll round trip). Every loop is
bounded; every process is stopped by its PID; everything listens on 127.0.0.1.

Before/after in one run: ``--baseline-src DIR`` (e.g. ``git archive main | tar -x -C DIR``) also
starts a pair of gateways of that checkout (its directory first on PYTHONPATH) on a journal of
its own in the same store, and both pairs run at once, taking turns round by round, so a busy
machine's load weighs on both alike; ``--repeat N`` runs (fresh processes and journals each) and
prints every run and the range.

``--push``: instead of polling B, read B's journal stream (``GET /v1/rl/journal/stream``, the
gateways get ``--enable-rl``), whose records are published once B's projections hold them; the
lag is a record's arrival minus its ``ts`` (A's append, same host clock): the scale-out target's "append in
one process to projection applied in the other", without the poll loop's load on B.

    python benchmarks/visibility.py [--rounds 300] [--postgres] [--push] [--baseline-src DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import sys
import tempfile
import threading
import time
import uuid

import httpx

from smgrl.demo.procs import free_port, start_gateway, wait_listening


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def pg_server():
    path = pathlib.Path(__file__).resolve().parents[1] / "tests" / "journal" / "pg_harness.py"
    spec = importlib.util.spec_from_file_location("pg_harness_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    why = module.unavailable()
    if why:
        sys.exit(f"error: {why}")
    return module.PgServer().start()


class Pair:
    """Two gateway processes A and B on one journal, and a worker registered through A."""

    def __init__(
        self, journal: str, env: dict, workdir: str, label: str, src: str | None, push: bool = False
    ) -> None:
        self.children = []
        self.push = push
        self.stop_stream = False
        self.applied: dict[str, float] = {}  # --push: label value -> lag (ms) B's stream showed it with
        self.arrived = threading.Condition()
        if src:  # the smgrl of another checkout: its directory first on the children's PYTHONPATH
            env = {**env, "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])}
        bases = []
        for name in ("a", "b"):
            port = free_port()
            log = open(os.path.join(workdir, f"{label}-{name}.log"), "w")  # noqa: SIM115 - the child holds it
            child = start_gateway(
                ["--prometheus-port", str(free_port()), "--log-level", "warn", "--disable-health-check"]
                + (["--enable-rl"] if push else []),
                port=port,
                env={**env, "SMGRL_JOURNAL": journal},
                log=log,
            )
            self.children.append(child)
            bases.append(f"http://127.0.0.1:{port}")
            wait_listening(bases[-1], child=child)
        self.a, self.b = (httpx.Client(base_url=base, timeout=10) for base in bases)
        r = self.a.post("/workers", json={"url": f"http://127.0.0.1:{free_port()}"})
        r.raise_for_status()
        self.wid = r.json()["worker_id"]
        if push:
            self.listening = threading.Event()
            threading.Thread(target=self._stream, args=(bases[1],), daemon=True).start()
            if not self.listening.wait(30):
                raise TimeoutError("B's journal stream did not open")

    def _stream(self, base: str) -> None:
        """--push: read B's journal stream (records published once B's projections hold them);
        each labels change's lag is the wall time it arrived minus the event's ts (A's append,
        same host clock)."""
        client = httpx.Client(base_url=base, timeout=httpx.Timeout(10, read=None))
        with client, client.stream("GET", "/v1/rl/journal/stream?after=0") as resp:
            self.listening.set()
            for line in resp.iter_lines():
                if self.stop_stream:
                    return
                if not line.startswith("data: "):
                    continue
                now = time.time()
                rec = json.loads(line[6:])
                if rec.get("type") != "worker.labels_changed":
                    continue
                with self.arrived:
                    self.applied[rec["payload"]["labels"].get("n")] = (now - rec["ts"]) * 1000
                    self.arrived.notify_all()

    def round(self, i: int) -> float:
        """PATCH a label through A, poll B until it serves it: the lag in ms (--push: wait for B's
        stream to show it; the lag from A's append to B's projections)."""
        self.a.patch(f"/workers/{self.wid}", json={"labels": {"n": str(i)}}).raise_for_status()
        if self.push:
            with self.arrived:
                if not self.arrived.wait_for(lambda: str(i) in self.applied, timeout=10):
                    raise TimeoutError(f"B's stream never showed round {i}")
                return self.applied.pop(str(i))
        acked = time.perf_counter()
        deadline = acked + 10
        while time.perf_counter() < deadline:
            row = self.b.get(f"/workers/{self.wid}")
            if row.status_code == 200 and row.json().get("labels", {}).get("n") == str(i):
                return (time.perf_counter() - acked) * 1000
        raise TimeoutError(f"B never served round {i}")

    def stop(self) -> None:
        self.stop_stream = True
        for child in reversed(self.children):
            child.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=300, help="rounds per run (per version)")
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument("--baseline-src", default=None, help="also run the gateways of this checkout")
    ap.add_argument("--repeat", type=int, default=1, help="runs (each with fresh processes and journals)")
    ap.add_argument(
        "--push",
        action="store_true",
        help="measure from A's append to B's projections (B's journal stream, --enable-rl), no polling",
    )
    args = ap.parse_args()
    versions = [("this", None)]
    if args.baseline_src:
        versions.append(("baseline", os.path.abspath(args.baseline_src)))
    store = ("PostgreSQL" if args.postgres else "SQLite") + (" (push)" if args.push else "")
    results: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _ in versions}
    pooled: dict[str, list[float]] = {label: [] for label, _ in versions}
    with tempfile.TemporaryDirectory(prefix="smgrl-bench-vis-") as workdir:
        server = pg_server() if args.postgres else None
        try:
            for n in range(args.repeat):
                pairs = {}
                try:
                    # Started in turns too (run by run): the pair started second came out ahead in
                    # an A/A run (both pairs the same code), by about 0.4 ms at p50.
                    for label, src in versions if n % 2 == 0 else versions[::-1]:
                        if server is not None:
                            journal, env = server.url(f"vis_{label}_{n}"), {}
                        else:  # the two processes of one shared-lock group
                            journal = os.path.join(workdir, f"{label}-{n}.db")
                            env = {"SMGRL_WORKER_GROUP": uuid.uuid4().hex}
                        pairs[label] = Pair(journal, env, workdir, f"{label}-{n}", src, args.push)
                    # Both versions run at once and take turns round by round: the machine's
                    # load (shared, noisy) weighs on both alike.
                    lags: dict[str, list[float]] = {label: [] for label, _ in versions}
                    for i in range(args.rounds):
                        order = list(lags) if i % 2 == 0 else list(lags)[::-1]
                        for label in order:
                            lags[label].append(pairs[label].round(i))
                finally:
                    for pair in pairs.values():
                        pair.stop()
                for label, samples in lags.items():
                    pooled[label] += samples
                    stats = (pct(samples, 0.5), pct(samples, 0.99), max(samples))
                    results[label].append(stats)
                    print(
                        f"{store} {label} run {n + 1}: {len(samples)} rounds: p50 {stats[0]:.2f} ms,"
                        f" p99 {stats[1]:.2f} ms, max {stats[2]:.2f} ms (load average"
                        f" {os.getloadavg()[0]:.1f})",
                        flush=True,
                    )
        finally:
            if server is not None:
                server.stop()
    for label, runs in results.items():
        p50s, p99s = [r[0] for r in runs], [r[1] for r in runs]
        print(
            f"{store} {label}: visibility lag over {len(runs)} run(s) of {args.rounds} rounds:"
            f" p50 {min(p50s):.2f}-{max(p50s):.2f} ms, p99 {min(p99s):.2f}-{max(p99s):.2f} ms;"
            f" all rounds pooled: p50 {pct(pooled[label], 0.5):.2f}, p90 {pct(pooled[label], 0.9):.2f},"
            f" p99 {pct(pooled[label], 0.99):.2f} ms"
        )


if __name__ == "__main__":
    main()

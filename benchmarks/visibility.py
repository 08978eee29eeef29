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
runs the gateways of that checkout (its directory first on PYTHONPATH), ``--repeat N`` times each,
alternating which version goes first, on the same journal store; it prints every run and the range.

    python benchmarks/visibility.py [--rounds 300] [--postgres] [--baseline-src DIR] [--repeat 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import sys
import tempfile
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


def run(rounds: int, journal: str, env: dict, workdir: str, src: str | None = None) -> list[float]:
    children = []
    if src:  # the smgrl of another checkout: its directory first on the children's PYTHONPATH
        env = {**env, "PYTHONPATH": os.pathsep.join([src, *filter(None, [os.environ.get("PYTHONPATH")])])}
    try:
        bases = []
        for name in ("a", "b"):
            port = free_port()
            log = open(os.path.join(workdir, f"{name}.log"), "w")  # noqa: SIM115 - the child holds it
            child = start_gateway(
                ["--prometheus-port", str(free_port()), "--log-level", "warn", "--disable-health-check"],
                port=port,
                env={**env, "SMGRL_JOURNAL": journal},
                log=log,
            )
            children.append(child)
            bases.append(f"http://127.0.0.1:{port}")
            wait_listening(bases[-1], child=child)
        a, b = (httpx.Client(base_url=base, timeout=10) for base in bases)
        r = a.post("/workers", json={"url": f"http://127.0.0.1:{free_port()}"})
        r.raise_for_status()
        wid = r.json()["worker_id"]
        lags = []
        for i in range(rounds):
            a.patch(f"/workers/{wid}", json={"labels": {"n": str(i)}}).raise_for_status()
            acked = time.perf_counter()
            deadline = acked + 10
            while time.perf_counter() < deadline:
                row = b.get(f"/workers/{wid}")
                if row.status_code == 200 and row.json().get("labels", {}).get("n") == str(i):
                    break
            else:
                raise TimeoutError(f"B never served round {i}")
            lags.append((time.perf_counter() - acked) * 1000)
        return lags
    finally:
        for child in reversed(children):
            child.stop()


def one(args, label: str, src: str | None, workdir: str, server, n: int) -> list[float]:
    if server is not None:
        return run(args.rounds, server.url(f"vis_{label}_{n}"), {}, workdir, src)
    env = {"SMGRL_WORKER_GROUP": uuid.uuid4().hex}  # two processes of one shared-lock group
    return run(args.rounds, os.path.join(workdir, f"{label}-{n}.db"), env, workdir, src)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--postgres", action="store_true")
    ap.add_argument("--baseline-src", default=None, help="also run the gateways of this checkout")
    ap.add_argument("--repeat", type=int, default=1, help="runs per version (interleaved)")
    args = ap.parse_args()
    versions = [("this", None)]
    if args.baseline_src:
        versions.append(("baseline", os.path.abspath(args.baseline_src)))
    store = "PostgreSQL" if args.postgres else "SQLite"
    results: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _ in versions}
    with tempfile.TemporaryDirectory(prefix="smgrl-bench-vis-") as workdir:
        server = pg_server() if args.postgres else None
        try:
            for n in range(args.repeat):
                order = versions if n % 2 == 0 else versions[::-1]  # alternate who goes first
                for label, src in order:
                    lags = one(args, label, src, workdir, server, n)
                    stats = (pct(lags, 0.5), pct(lags, 0.99), max(lags))
                    results[label].append(stats)
                    print(
                        f"{store} {label} run {n + 1}: {len(lags)} rounds: p50 {stats[0]:.2f} ms,"
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
            f" p50 {min(p50s):.2f}-{max(p50s):.2f} ms, p99 {min(p99s):.2f}-{max(p99s):.2f} ms"
        )


if __name__ == "__main__":
    main()

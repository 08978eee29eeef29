"""``benchmarks/dataplane.py --wrk RUNS``: rollout CPU per request under an external load generator.

The closed loop of ``dataplane.py`` is trio and smgrl's own upstream pool, in the benchmark's
process: a load generator that shares its code (and its CPU) with the thing measured. Here the
load is ``wrk`` (a C program: ``apt-get install wrk``), one thread and ``--wrk-connections``
(64) connections for ``--wrk-secs`` (8) seconds of ``POST /generate`` with a small body, against
each gateway in turn, all of them up at once on the same ``--engines`` (4) fake SGLang engines:
smgrl, SMG 1.13.0 and the bare patched hypercorn (an app that answers at once: the server's
floor), and with ``--baseline-src DIR`` the smgrl of another checkout (before/after in one run).
The order of the gateways is reversed every other run. Each gateway's CPU (user +
system, ``/proc``) during its wrk run divided by the requests wrk completed gives CPU per
request; reported per run, with the median over runs and their spread.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from smgrl.demo.procs import free_port, start_fake_engines

LUA = """wrk.method = "POST"
wrk.body = '%s'
wrk.headers["Content-Type"] = "application/json"
"""


def _wrk(base: str, script: str, args) -> tuple[int, float, float, str]:
    """(requests, requests/s, p50 ms, non-2xx note) of one wrk run."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{args.wrk_connections}", f"-d{args.wrk_secs}s", "--latency", "-s", script,
         base + "/generate"],
        capture_output=True, text=True, timeout=args.wrk_secs + 60, check=True,
    ).stdout  # fmt: skip
    total = int(re.search(r"(\d+) requests in", out).group(1))
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    m = re.search(r"50%\s+([\d.]+)(us|ms|s)\b", out)
    p50 = float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)] if m else float("nan")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: .*", out)
    note = f"{bad.group(1)} non-2xx" if bad else ""
    if errors:
        note += (" " if note else "") + errors.group(0)
    return total, rps, p50, note


def _wait_port(port: int) -> None:
    import socket
    import time

    for _ in range(600):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


def run_wrk(args, start_smgrl, start_smg, start_bare, wait_routable, cpu_seconds) -> None:
    from benchmarks.dataplane import GENERATE_BODY

    if shutil.which("wrk") is None:
        sys.exit("error: wrk not found (apt-get install -y wrk)")
    with open("/proc/loadavg") as f:
        load_start = " ".join(f.read().split()[:3])
    workdir = tempfile.mkdtemp(prefix="smgrl-bench-wrk-")
    script = os.path.join(workdir, "generate.lua")
    with open(script, "w") as f:
        f.write(LUA % json.dumps(json.loads(GENERATE_BODY)))
    log = open(os.path.join(workdir, "children.log"), "w")  # noqa: SIM115 - the children hold it
    fakes, urls = start_fake_engines("sglang", args.engines, log=log)
    gateways = {}
    try:
        port = free_port()
        gateways["smgrl"] = (start_smgrl(urls, port, "raw", workdir, args.policy), port)
        if args.baseline_src:  # another checkout's smgrl in the same run: before/after
            port = free_port()
            src = os.path.abspath(args.baseline_src)
            gateways["smgrl-baseline"] = (start_smgrl(urls, port, "raw", workdir, args.policy, src=src), port)
        if not args.no_smg and args.smg_bin and os.path.exists(args.smg_bin):
            port = free_port()
            gateways["SMG 1.13.0"] = (start_smg(args.smg_bin, urls, port, workdir, args.policy), port)
        if not args.no_bare:
            port = free_port()
            gateways["server-bare"] = (start_bare(port, log), port)
        for name, (_, port) in gateways.items():
            if name == "server-bare":
                _wait_port(port)
            else:
                wait_routable(f"http://127.0.0.1:{port}")
        per_run: dict[str, list[tuple[float, float, float, str]]] = {name: [] for name in gateways}
        for run in range(args.wrk):
            order = list(gateways) if run % 2 == 0 else list(reversed(gateways))
            for name in order:
                child, port = gateways[name]
                c0 = cpu_seconds(child.pid)
                total, rps, p50, note = _wrk(f"http://127.0.0.1:{port}", script, args)
                us = (cpu_seconds(child.pid) - c0) / max(total, 1) * 1e6
                per_run[name].append((us, rps, p50, note))
                print(f"run {run + 1} {name}: {us:.0f} us/request, {rps:.0f} req/s, p50 {p50:.2f} ms {note}",
                      file=sys.stderr)  # fmt: skip
    finally:
        for child, _ in gateways.values():
            child.stop()
        fakes.stop()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
    with open("/proc/loadavg") as f:
        load_end = " ".join(f.read().split()[:3])
    print(table(per_run, args, load_start, load_end))


def table(per_run: dict, args, load_start: str, load_end: str) -> str:
    ref = "SMG 1.13.0" if "SMG 1.13.0" in per_run else None
    lines = [
        (
            f"wrk -t1 -c{args.wrk_connections} -d{args.wrk_secs}s POST /generate, {args.engines} fake SGLang "
            f"engines, {args.wrk} runs (order reversed every other run); load average {load_start} at the "
            f"start, {load_end} at the end"
        ),
        "",
        (
            "| gateway | CPU us/request per run | median | req/s per run | p50 ms per run | CPU / SMG per run | "
            "median CPU / SMG |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for name, runs in per_run.items():
        cpu = [r[0] for r in runs]
        vs = vs_med = ""
        if ref:
            ratios = [a / b for a, b in zip(cpu, (r[0] for r in per_run[ref]), strict=True)]
            vs = ", ".join(f"{x:.2f}x" for x in ratios)
            vs_med = f"{statistics.median(ratios):.2f}x"
        lines.append(
            f"| {name} | {', '.join(f'{x:.0f}' for x in cpu)} | {statistics.median(cpu):.0f} | "
            f"{', '.join(f'{r[1]:.0f}' for r in runs)} | {', '.join(f'{r[2]:.2f}' for r in runs)} | "
            f"{vs} | {vs_med} |"
        )
    if "smgrl-baseline" in per_run:
        ratios = [a[0] / b[0] for a, b in zip(per_run["smgrl"], per_run["smgrl-baseline"], strict=True)]
        per = ", ".join(f"{x:.3f}" for x in ratios)
        lines += ["", f"smgrl / smgrl-baseline CPU per run: {per} (median {statistics.median(ratios):.3f})"]
    return "\n".join(lines)

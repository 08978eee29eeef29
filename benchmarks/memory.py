#!/usr/bin/env python3
"""The data plane's memory bound under its worst case: the gateway's RSS while every admitted
rollout request holds a body at its size limit, or a buffered answer at the answer cap.

Starts one scripted engine (a child process: SGLang's registration probe, then every
``/generate`` held ``--hold-secs`` before an answer of ``--answer-bytes``) and one gateway with
``--dataplane-memory-budget`` / ``--dataplane-max-body-size``, then sends ``--clients`` concurrent
``/generate`` requests at once and samples the gateway's RSS (``/proc/PID/status``) until they are
answered. Two scenarios: ``bodies`` (each request body at the body limit, small answers) and
``answers`` (small bodies, each answer ``--answer-bytes``). Reported: RSS before, peak RSS
(``VmHWM``), and how many requests were answered 200 / 503 ``memory_budget_exceeded``.

Every process started here is stopped by its PID; loopback only; every loop is bounded.

    python benchmarks/memory.py [--budget-mib 512] [--body-mib 64] [--answer-mib 64]
        [--clients 32] [--hold-secs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from smgrl.demo.procs import Child, free_port, start_gateway, wait_for_workers, wait_listening
from smgrl.upstream import EnginePool, UpstreamError

MIB = 1 << 20
ENGINE = """
import json, sys, trio
from smgrl.testing.dataplane import ScriptedEngine
hold, size = float(sys.argv[1]), int(sys.argv[2])
answer = json.dumps({"text": "a" * size}).encode()
small = json.dumps({"text": "ok"}).encode()

async def handle(stream):
    try:
        await serve(stream)
    except trio.BrokenResourceError:
        pass  # the gateway closed a connection whose answer it would not hold (its budget)

async def serve(stream):
    # A reader that stays linear on 64 MiB bodies (bytearray, not bytes +=).
    buf = bytearray()
    async with stream:
        while True:
            while (end := buf.find(b"\\r\\n\\r\\n")) < 0:
                data = await stream.receive_some(1 << 20)
                if not data:
                    return
                buf += data
            head = bytes(buf[:end]).decode("latin-1").split("\\r\\n")
            del buf[: end + 4]
            path = head[0].split(" ")[1].split("?")[0]
            length = 0
            for line in head[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            while len(buf) < length:
                data = await stream.receive_some(1 << 20)
                if not data:
                    return
                buf += data
            big = b'"big": true' in buf[:64]
            del buf[:length]
            if path in ScriptedEngine.PROBE:
                body = ScriptedEngine.PROBE[path]
            else:
                await trio.sleep(hold)
                body = answer if big else small
            await stream.send_all(b"HTTP/1.1 200 OK\\r\\ncontent-type: application/json\\r\\n"
                                  b"content-length: %d\\r\\n\\r\\n" % len(body) + body)

async def main():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(json.dumps({"url": f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"}), flush=True)
    await trio.serve_listeners(handle, listeners)

trio.run(main)
"""


def rss(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out["VmRSS"], out["VmHWM"]


def body_of(size: int, big_answer: bool) -> bytes:
    head = b'{"big": true, "text": "x", "pad": "' if big_answer else b'{"big": false, "text": "x", "pad": "'
    return head + b"p" * max(0, size - len(head) - 2) + b'"}'


async def load(base: str, clients: int, body: bytes, pid: int, seconds: float) -> dict:
    pool = EnginePool(base, max_idle=clients)
    statuses: dict[str, int] = {}
    peak_sampled = 0

    async def one() -> None:
        try:
            async with pool.stream(
                "POST", "/generate", headers=[(b"content-type", b"application/json")], body=body
            ) as resp:
                data, _ = await resp.read_bounded(1 << 30)
                key = str(resp.status)
                if resp.status == 503:
                    key += " " + json.loads(data)["error"]["code"]
        except UpstreamError as exc:
            key = f"error {exc}"
        statuses[key] = statuses.get(key, 0) + 1
        print("answered", key, file=sys.stderr)

    async def sample() -> None:
        nonlocal peak_sampled
        while True:
            peak_sampled = max(peak_sampled, rss(pid)[0])
            await trio.sleep(0.05)

    with trio.fail_after(seconds):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            async with trio.open_nursery() as senders:
                for _ in range(clients):
                    senders.start_soon(one)
            nursery.cancel_scope.cancel()
    await pool.aclose()
    return {"statuses": statuses, "peak_rss_sampled": peak_sampled}


# argparse flags shaped like the other benchmarks' (each benchmark its own knobs).
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget-mib", type=int, default=512)
    ap.add_argument("--body-mib", type=int, default=64)
    ap.add_argument("--answer-mib", type=int, default=64)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--hold-secs", type=float, default=3.0)
    ap.add_argument("--deadline-secs", type=float, default=120.0)
    args = ap.parse_args()
    engine_proc = subprocess.Popen(
        [sys.executable, "-c", ENGINE, str(args.hold_secs), str(args.answer_mib * MIB - 16)],
        stdout=subprocess.PIPE,
        text=True,
    )
    engine = Child(engine_proc, "engine")
    gateway = None
    try:
        url = json.loads(engine_proc.stdout.readline())["url"]
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        journal = os.path.join(tempfile.mkdtemp(prefix="smgrl-mem-"), "journal.db")
        gateway = start_gateway(
            [
                "--worker-urls", url, "--enable-rl", "--journal", journal,
                "--prometheus-port", str(free_port()), "--prometheus-host", "127.0.0.1",
                "--dataplane-memory-budget", str(args.budget_mib * MIB),
                "--dataplane-max-body-size", str(args.body_mib * MIB),
                "--request-timeout-secs", "120",
            ],
            port=port,
        )  # fmt: skip
        wait_listening(base, child=gateway)
        wait_for_workers(base, 1, child=gateway)
        report = {"budget_mib": args.budget_mib, "body_mib": args.body_mib, "answer_mib": args.answer_mib,
                  "clients": args.clients}  # fmt: skip
        for name, body in (
            ("bodies", body_of(args.body_mib * MIB, False)),
            ("answers", body_of(1024, True)),
        ):
            before = rss(gateway.pid)[0]
            started = time.monotonic()
            result = trio.run(load, base, args.clients, body, gateway.pid, args.deadline_secs)
            _, hwm = rss(gateway.pid)
            report[name] = {
                "rss_before_mib": round(before / MIB),
                "peak_rss_mib": round(hwm / MIB),
                "peak_rss_sampled_mib": round(result["peak_rss_sampled"] / MIB),
                "statuses": result["statuses"],
                "seconds": round(time.monotonic() - started, 1),
            }
        print(json.dumps(report, indent=1))
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A 64-engine disk refit: the gateway's refit saga vs the same steps driven by the client.

One fake SGLang process serves N engines (default 64) on loopback with a fixed load time
(``load_delay_ms`` knob, default 200 ms, so both sides wait for the same loads). One smgrl gateway
(SQLite journal) fronts them. Each round refits the whole fleet to a new checkpoint, alternating:

* ``saga``: ``POST /v1/rl/refits`` and wait for the result on the refit's event stream
  (``GET /v1/rl/refits/{id}/events``), i.e. pause, load, flush, verify (version read back) and
  resume, each phase journaled as intent and outcome;
* ``raw``: the client drives the same five phases itself with raw fan-outs
  (``POST /v1/rl/engine/<route>?selector=``), checking each answer and the read-back versions.

Prints a markdown table of wall times (median, min, max) and the saga's overhead. Every process
this starts is stopped by its PID; every loop is bounded.

    python benchmarks/refit.py [--engines 64] [--rounds 10] [--load-ms 200]
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from smgrl.demo.procs import free_port, start_fake_engines, start_gateway, wait_for_workers
from smgrl.fake.checkpoint import make_checkpoint

SELECTOR = "engine=sglang"


class Conn:
    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)

    def request(self, method: str, path: str, body=None) -> tuple[int, object]:
        data = None if body is None else json.dumps(body).encode()
        headers = {"content-type": "application/json"} if data is not None else {}
        self.conn.request(method, path, body=data, headers=headers)
        resp = self.conn.getresponse()
        raw = resp.read()
        return resp.status, (json.loads(raw) if raw else None)


def saga_round(c: Conn, ckpt: str, version: str, port: int) -> float:
    t0 = time.perf_counter()
    body = {"selector": SELECTOR, "source": {"disk": {"model_path": ckpt}}, "weight_version": version}
    status, rec = c.request("POST", "/v1/rl/refits", body)
    if status != 202:
        raise RuntimeError(f"refit refused: {status} {rec}")
    # Wait on the refit's event stream (the record on every change, the last one when it ends):
    # the end is seen as it is journaled, without a poll interval or a render per poll.
    stream = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        stream.request("GET", f"/v1/rl/refits/{rec['refit_id']}/events")
        resp = stream.getresponse()
        for _ in range(100_000):  # bounded: a refit sends a few dozen records
            line = resp.readline()
            if not line:
                raise RuntimeError("the refit's event stream ended before its result")
            if line.startswith(b"data: "):
                rec = json.loads(line[6:])
                if rec["result"] is not None:
                    break
    finally:
        stream.close()
    dt = time.perf_counter() - t0
    if rec["result"] != "succeeded":
        raise RuntimeError(f"saga ended {rec['result']}")
    return dt


def raw_round(c: Conn, ckpt: str, version: str, n: int) -> float:
    sel = urllib.parse.quote(SELECTOR)
    t0 = time.perf_counter()
    steps = [
        ("POST", "pause_generation", {"mode": "retract"}),
        (
            "POST",
            "update_weights_from_disk",
            {
                "model_path": ckpt,
                "weight_version": version,
                "flush_cache": False,
                "abort_all_requests": False,
            },
        ),
        ("GET", "flush_cache", None),
        ("GET", "model_info", None),
        ("POST", "continue_generation", {}),
    ]
    for method, route, body in steps:
        status, out = c.request(method, f"/v1/rl/engine/{route}?selector={sel}", body)
        if status != 200 or out["succeeded"] != n:
            raise RuntimeError(f"{route}: {status} {out.get('failed') if isinstance(out, dict) else out}")
        if route == "model_info":
            got = {r["body"].get("weight_version") for r in out["results"].values()}
            if got != {version}:
                raise RuntimeError(f"read back {got}")
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--load-ms", type=float, default=200.0)
    args = ap.parse_args()
    fakes, urls = start_fake_engines("sglang", args.engines)
    gw = None
    try:
        for url in urls:
            req = urllib.request.Request(
                url + "/_fake/knobs",
                data=json.dumps({"load_delay_ms": args.load_ms}).encode(),
                method="POST",
                headers={"content-type": "application/json"},
            )
            urllib.request.urlopen(req, timeout=10).read()
        tmp = tempfile.mkdtemp(prefix="smgrl-bench-refit-")
        port = free_port()
        gw = start_gateway(
            [
                "--enable-rl",
                "--disable-health-check",
                "--journal",
                f"{tmp}/journal.db",
                # A free port: the default metrics port may be another gateway's on this machine.
                "--prometheus-port",
                str(free_port()),
                "--worker-urls",
                *urls,
            ],
            port=port,
        )
        wait_for_workers(f"http://127.0.0.1:{port}", args.engines, child=gw)
        c = Conn(port)
        times: dict[str, list[float]] = {"saga": [], "raw": []}
        for i in range(args.rounds * 2 + 2):
            ckpt = str(make_checkpoint(f"{tmp}/ckpt-{i}", "fake/model", seed=i + 1))
            kind = "saga" if i % 2 == 0 else "raw"
            if kind == "saga":
                dt = saga_round(c, ckpt, f"v{i}", port)
            else:
                dt = raw_round(c, ckpt, f"v{i}", args.engines)
            if i >= 2:  # the first round of each kind warms up
                times[kind].append(dt)
        saga, raw = statistics.median(times["saga"]), statistics.median(times["raw"])
        print(f"{args.engines} engines, load time {args.load_ms:g} ms, {args.rounds} rounds each\n")
        print("| driver | median (s) | min (s) | max (s) |")
        print("|---|---|---|---|")
        for kind, label in (("raw", "client-driven raw fan-outs"), ("saga", "refit saga")):
            t = times[kind]
            print(f"| {label} | {statistics.median(t):.3f} | {min(t):.3f} | {max(t):.3f} |")
        print(f"\nsaga overhead: {100 * (saga - raw) / raw:+.1f}% (median)")
    finally:
        if gw is not None:
            gw.stop()
        fakes.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``smgrl journal events --follow --gateway URL``: a running gateway's journal read from its
server-sent stream (GET /v1/rl/journal/stream), with a key in a header: backfill then live,
bounded by --limit, Ctrl-C clean, a refused key one line and exit 2, the key never printed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from smgrl.demo.procs import free_port, wait_for_workers

pytestmark = pytest.mark.e2e

KEY = "follow-admin-key"
FANOUT = "/v1/rl/engine/flush_cache?selector=engine%3Dsglang"


def follow(base: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "smgrl", "journal", "events", "--follow", "--gateway", base, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def first_line(proc: subprocess.Popen) -> str:
    line = proc.stdout.readline()  # the follower prints a line per record at once (flushed)
    assert line, proc.stderr.read()
    return line


def test_follow_a_gateway_stream_backfill_then_live_then_ctrl_c(fakes, gateway):
    urls = fakes("sglang", 2)
    gw, anon, port = gateway(
        "--enable-rl", "--disable-health-check", "--control-plane-api-keys", f"adm:admin:admin:{KEY}",
        "--worker-urls", *urls,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    http = type(anon)(base, KEY)  # the fixture's client, with the key
    wait_for_workers(base, 2, token=KEY, child=gw)
    assert http.request("POST", FANOUT, b"")[0] == 200

    # From seq 0 (backfill), then live; --limit 2 ends it by itself.
    proc = follow(
        base, "--api-key", KEY, "--after", "0", "--type", "control.finished", "--limit", "2", "--json"
    )
    try:
        one = json.loads(first_line(proc))
        assert http.request("POST", FANOUT, b"")[0] == 200  # after the follower showed the first
        two = json.loads(first_line(proc))
        assert proc.wait(30) == 0
    finally:
        proc.kill()
    assert one["type"] == two["type"] == "control.finished" and two["seq"] > one["seq"]
    assert one["payload"]["op_id"] != two["payload"]["op_id"] and one["time"].endswith("Z")
    rest, err = proc.communicate(timeout=10)
    assert rest == "" and KEY not in err

    # A table, live from now (SMGRL_API_KEY), stopped by Ctrl-C: exit 0, no traceback.
    proc = subprocess.Popen(
        [sys.executable, "-m", "smgrl", "journal", "events", "-f", "--gateway", base, "--type", "control.*"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SMGRL_API_KEY": KEY},
    )
    stop = threading.Event()

    def fan_out() -> None:
        # Live from now: fan out (bounded) until the follower, connecting meanwhile, shows one.
        for _ in range(150):
            if stop.wait(0.2):
                return
            http.request("POST", FANOUT, b"")

    pusher = threading.Thread(target=fan_out)
    pusher.start()
    try:
        header = first_line(proc) + first_line(proc)
        stop.set()
        assert header.startswith("seq") and "control." in header, header
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        stop.set()
        pusher.join(10)
        proc.kill()
    assert proc.returncode == 0, err
    assert "Traceback" not in err and KEY not in out + err

    # No key: refused, one line, exit 2.
    refused = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "events", "--follow", "--gateway", base, "--follow-seconds", "5"],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "SMGRL_API_KEY"},
    )  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.startswith("error: the gateway refused"), refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    # Nothing answering: bounded retries, then one line and exit 3.
    gone = subprocess.run(
        [
            sys.executable,
            "-m",
            "smgrl",
            "journal",
            "events",
            "--follow",
            "--gateway",
            f"http://127.0.0.1:{free_port()}",
        ],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
    )
    assert gone.returncode == 3 and "lost the journal stream" in gone.stderr, gone.stderr

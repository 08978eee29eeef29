"""The event loop never waits on SQLite's lock, with real processes.

A second process takes the journal's write lock (`BEGIN IMMEDIATE`, as `smgrl journal compact` or
any SQLite tool may) and holds it until the test says so. Meanwhile a journal append
(`POST /workers`) waits, while `/health`, discovery and a rollout (`/generate` to a fake engine)
answer. The only time bound is a generous client timeout that separates "answered while the lock
was held" from "blocked until the lock was released" (the lock is held until every check passed,
and --journal-lock-wait-secs is far above the client timeout). Then the lock is released and the
append completes.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time
import urllib.request

from smgrl.demo.procs import free_port, wait_for_workers

# Far above any answer of a gateway that is not blocked; far below --journal-lock-wait-secs, so a
# gateway whose event loop waited for the lock could not answer within it.
CLIENT_TIMEOUT = 5.0
LOCK_WAIT = 60

HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.readline()  # hold the write lock until the test writes a line
    conn.execute("COMMIT")
    print("released", flush=True)
    """
)


def get(base: str, path: str, body: bytes | None = None) -> int:
    req = urllib.request.Request(
        base + path, data=body, method="POST" if body else "GET", headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=CLIENT_TIMEOUT) as r:
        r.read()
        return r.status


def lock_waits(metrics: str) -> float:
    with urllib.request.urlopen(metrics, timeout=CLIENT_TIMEOUT) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("smgrl_journal_lock_waits "):
                return float(line.split()[1])
    raise AssertionError("smgrl_journal_lock_waits is not exposed")


def test_a_held_write_lock_blocks_appends_only(fakes, gateway, tmp_path):
    engine, spare = fakes("sglang", 2)
    journal = str(tmp_path / "journal.db")
    metrics_port = free_port()
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    child, http, port = gateway(
        "--prometheus-port",
        str(metrics_port),
        "--enable-rl",
        "--disable-health-check",
        "--policy",
        "round_robin",
        "--journal-lock-wait-secs",
        str(LOCK_WAIT),
        "--worker-urls",
        engine,
        journal=journal,
    )
    base = f"http://127.0.0.1:{port}"
    wait_for_workers(base, 1, child=child)

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, journal], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        # A journal append: POST /workers waits for the lock, in the background.
        registered: list = []
        appender = threading.Thread(
            target=lambda: registered.append(http.request("POST", "/workers", {"url": spare})), daemon=True
        )
        appender.start()
        # Wait until the append has reached the journal and found the lock taken.
        deadline = time.monotonic() + 30
        while lock_waits(metrics) < 1:
            assert time.monotonic() < deadline, "the append never reached the journal"
            time.sleep(0.01)
        # Everything that does not append answers while the lock is held.
        for _ in range(3):
            assert get(base, "/health") == 200
            assert get(base, "/v1/rl/workers") == 200
            assert get(base, "/generate", b'{"text": "hi", "sampling_params": {"max_new_tokens": 2}}') == 200
        assert appender.is_alive() and registered == []  # the append still waits for the lock
        holder.stdin.write("release\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "released"
        appender.join(30)
        assert not appender.is_alive()
        (status, _headers, body) = registered[0]
        assert status == 202, body
        wait_for_workers(base, 2, child=child)  # the append resumed: the new engine is discovered
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(5)
    assert child.stop() == 0

"""`smgrl launch` as a real process: every startup failure is ONE line on stderr naming the port
or the path, exit 1, and the journal file unchanged; one owner per journal (a crashed owner does
not block a restart, readers work beside the owner); `--prometheus-port 0`; the second Ctrl-C
while an engine call hangs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from smgrl.demo.procs import free_port, launch_gateway, start_gateway, wait_for_workers, wait_listening

LAUNCH_TIMEOUT = 60


def launch(*args: str, journal: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "smgrl", "launch", "--port", "0", "--journal", journal, *args],
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
        check=False,
    )


def one_line(proc: subprocess.CompletedProcess) -> str:
    """The single stderr line of a refused start (log lines before it are on stderr too: none
    is written before the journal is open, so there are none here)."""
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def fingerprint(path: str) -> tuple:
    """Bytes and mtime of the journal and of its side files."""
    out = []
    for suffix in ("", "-wal", "-shm"):
        p = path + suffix
        if os.path.exists(p):
            with open(p, "rb") as f:
                out.append((suffix, hashlib.sha256(f.read()).hexdigest(), os.stat(p).st_mtime_ns))
    return tuple(out)


@pytest.fixture
def busy_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_main_port_in_use(tmp_path, busy_port):
    journal = str(tmp_path / "j.db")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "smgrl",
            "launch",
            "--port",
            str(busy_port),
            "--prometheus-port",
            str(free_port()),
        ]
        + ["--journal", journal],
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT,
        check=False,
    )
    assert one_line(proc) == f"error: cannot listen on 127.0.0.1:{busy_port} (--port): Address already in use"
    assert not os.path.exists(journal)  # ports are bound before the journal is touched


def test_metrics_port_in_use(tmp_path, busy_port):
    journal = str(tmp_path / "j.db")
    proc = launch("--prometheus-port", str(busy_port), journal=journal)
    line = one_line(proc)
    assert (
        line == f"error: cannot listen on 127.0.0.1:{busy_port} (--prometheus-port): Address already in use"
    )
    assert not os.path.exists(journal)


def test_missing_journal_directory(tmp_path):
    journal = str(tmp_path / "no" / "such" / "j.db")
    line = one_line(launch("--prometheus-port", str(free_port()), journal=journal))
    assert (
        line
        == f"error: cannot create the journal {journal}: the directory {tmp_path / 'no' / 'such'} does not exist"
    )


def test_a_corrupt_journal(tmp_path):
    journal = str(tmp_path / "j.db")
    with open(journal, "wb") as f:
        f.write(b"\x00garbage, not a database" * 100)
    before = fingerprint(journal)
    line = one_line(launch("--prometheus-port", str(free_port()), journal=journal))
    assert line.startswith(f"error: {journal} is not an smgrl journal: not a readable SQLite database")
    assert fingerprint(journal) == before


def test_another_applications_sqlite_file_is_refused_and_left_unchanged(tmp_path):
    journal = str(tmp_path / "app.db")
    conn = sqlite3.connect(journal)
    conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO accounts (name) VALUES ('alice')")
    conn.commit()
    conn.close()
    before = fingerprint(journal)
    line = one_line(launch("--prometheus-port", str(free_port()), journal=journal))
    assert line == (
        f"error: {journal} is not an smgrl journal: it is an SQLite database of another application"
        " (tables: accounts); it was not modified"
    )
    assert fingerprint(journal) == before
    tables = {r[0] for r in sqlite3.connect(journal).execute("SELECT name FROM sqlite_master")}
    assert tables == {"accounts"}


def _journal_with(tmp_path, sql: str) -> str:
    journal = str(tmp_path / "j.db")
    from journal import SqliteStore

    SqliteStore.open(journal).close()
    conn = sqlite3.connect(journal)
    conn.execute(sql)
    conn.commit()
    conn.close()
    return journal


def test_a_newer_format_version_is_one_line(tmp_path):
    journal = _journal_with(tmp_path, "UPDATE meta SET value = '7' WHERE key = 'format_version'")
    line = one_line(launch("--prometheus-port", str(free_port()), journal=journal))
    assert line.startswith(f"error: {journal} is an smgrl journal of format 7, written by a newer smgrl")


def test_a_newer_migration_is_one_line(tmp_path):
    journal = _journal_with(
        tmp_path,
        "INSERT INTO _sqlite_migrations (migration_set, name, applied_at)"
        " VALUES ('smgrl.journal', '0042_future', '2031-01-01')",
    )
    line = one_line(launch("--prometheus-port", str(free_port()), journal=journal))
    assert line.startswith(f"error: {journal} was migrated by a newer smgrl") and "0042_future" in line


def test_a_tampered_worker_url_in_a_real_journal_is_refused_naming_its_seq(fakes, gateway, tmp_path):
    urls = fakes("sglang", 1)
    journal = str(tmp_path / "fleet.db")
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", urls[0], journal=journal)
    wait_for_workers(http.base, 1, child=gw)
    assert gw.stop() == 0
    conn = sqlite3.connect(journal)
    seq, payload = conn.execute("SELECT seq, payload FROM events WHERE type = 'worker.registered'").fetchone()
    evil = json.loads(payload)
    evil["url"] = evil["base_url"] = "http://attacker.example:80"
    conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (json.dumps(evil), seq))
    conn.commit()
    conn.close()
    line = one_line(launch("--prometheus-port", str(free_port()), journal=journal))
    assert line == (
        f"error: {journal} fails its hash check at seq {seq} (hash mismatch: the row was modified);"
        " not serving it: run `smgrl journal verify` for details"
    )


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "smgrl", *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_one_owner_per_journal_and_a_crashed_owner_does_not_block(gateway, tmp_path):
    journal = str(tmp_path / "owned.db")
    owner, http, port = gateway("--disable-health-check", journal=journal)
    before = fingerprint(journal)
    proc = launch("--prometheus-port", str(free_port()), journal=journal)
    line = one_line(proc)
    m = re.fullmatch(
        rf"error: {re.escape(journal)} is in use by another smgrl gateway: pid (\d+) on (\S+), port (\d+),"
        r" since (\S+Z) \(exclusive\)",
        line,
    )
    assert m, line
    assert int(m.group(1)) == owner.pid and m.group(2) == socket.gethostname() and int(m.group(3)) == port
    assert fingerprint(journal) == before  # the refused launch did not write a byte
    wait_listening(http.base, child=owner)  # and the owner was not disturbed

    # Readers, verify and compact keep working beside the live owner.
    for args in (["events"], ["verify"], ["compact", "--before", "1"], ["stats"]):
        res = run_cli("journal", "--journal", journal, *args)
        assert res.returncode == 0, (args, res.stderr)

    owner.kill()  # SIGKILL: the kernel releases the lock with the process
    _restarted, http2, _ = gateway("--disable-health-check", journal=journal)
    wait_listening(http2.base)
    events = run_cli("journal", "--journal", journal, "events", "--json").stdout.splitlines()
    assert sum(json.loads(e)["type"] == "gateway.started" for e in events) == 2


def test_prometheus_port_0_picks_a_free_port_and_logs_it(children, tmp_path):
    log_path = tmp_path / "gw.log"
    port = free_port()
    with open(log_path, "w") as log:
        gw = start_gateway(
            ["--journal", str(tmp_path / "j.db"), "--prometheus-port", "0"], port=port, log=log
        )
    children.append(gw)
    wait_listening(f"http://127.0.0.1:{port}", child=gw)
    deadline = time.monotonic() + 30
    m = None
    while m is None and time.monotonic() < deadline:
        m = re.search(r"metrics=http://127\.0\.0\.1:(\d+)/metrics", log_path.read_text())
        if m is None:
            time.sleep(0.05)
    assert m, log_path.read_text()
    metrics_port = int(m.group(1))
    assert metrics_port not in (0, 29000)
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
        assert r.status == 200 and b"smgrl" in r.read()


def test_second_ctrl_c_while_an_engine_call_hangs_ends_quietly(fakes, children, tmp_path):
    urls = fakes("sglang", 1)
    journal = str(tmp_path / "j.db")
    args = ["--enable-rl", "--disable-health-check", "--journal", journal, "--worker-urls", urls[0]]
    gw, port = launch_gateway(args, log_dir=tmp_path)
    children.append(gw)
    log_path = gw.log_path
    base = f"http://127.0.0.1:{port}"
    worker_id = wait_for_workers(base, 1, child=gw)[0]["id"]
    knobs = urllib.request.Request(
        urls[0] + "/_fake/knobs",
        data=json.dumps({"hang": True}).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    urllib.request.urlopen(knobs, timeout=10).close()

    def call() -> None:
        req = urllib.request.Request(
            f"{base}/v1/rl/workers/{worker_id}/engine/flush_cache", data=b"", method="POST"
        )
        try:
            urllib.request.urlopen(req, timeout=60).close()
        except OSError:
            pass  # the gateway goes away under it: expected

    client = threading.Thread(target=call, daemon=True)
    client.start()

    def wait_log(pattern: str) -> re.Match:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = re.search(pattern, log_path.read_text())
            if m:
                return m
            assert gw.proc.poll() is None, log_path.read_text()
            time.sleep(0.05)
        raise AssertionError(f"{pattern!r} not logged:\n{log_path.read_text()}")

    # The engine got the call and hangs: the fake logs every call it receives.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with urllib.request.urlopen(urls[0] + "/_fake/calls?path=/flush_cache", timeout=10) as r:
            if json.loads(r.read())["calls"]:
                break
        time.sleep(0.05)
    os.kill(gw.pid, signal.SIGINT)
    waiting = wait_log(
        r"shutting down: waiting up to 180s for 1 control operation \[(\S+) \(POST flush_cache"
    )
    assert "press Ctrl-C again" in waiting.string
    op_id = waiting.group(1)
    os.kill(gw.pid, signal.SIGINT)
    assert gw.proc.wait(30) == 0
    client.join(30)
    text = log_path.read_text()
    assert "Traceback" not in text and "JournalClosedError" not in text, text
    assert "stopped clean=True" in text
    res = run_cli("journal", "--journal", journal, "events", "--json")
    events = [json.loads(line) for line in res.stdout.splitlines()]
    mine = [e for e in events if e["stream"] == f"op:{op_id}"]
    assert [e["type"] for e in mine] == ["control.started", "control.interrupted"]
    assert mine[1]["payload"]["reason"] == "shutdown" and mine[1]["payload"]["missing_targets"] == [worker_id]
    assert events[-1]["type"] == "gateway.stopped" and events[-1]["payload"]["clean"] is True
    assert not os.path.exists(journal + "-wal") or os.path.getsize(journal + "-wal") == 0  # closed

"""``smgrl launch --workers 2`` on one SQLite journal, with real processes (docs/scale-out.md).

* A registration through whichever process accepted the connection reaches both processes'
  projections (each worker's own ``smgrl_workers`` gauge, in the supervisor's aggregated metrics)
  and their discovery, and a concurrent duplicate is refused 409 exactly once per URL.
* SIGKILL the process running a fan-out (the journal's ``control.started`` names it): the other
  process records the operation interrupted (as startup recovery does for a lone gateway), every
  answered registration is in the journal, the chain verifies, the supervisor restarts the worker.
* SIGKILL the holder of the discovery lease: a new registration is still discovered (the lease is
  taken over), the lease's epoch grew.

Bounded: every wait has a deadline.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import smgrl.events  # noqa: F401 - registers the event catalogue: the journal is read below
from journal import SqliteStore
from smgrl.demo.procs import free_port, launch_gateway

pytestmark = pytest.mark.e2e

DEADLINE_SECS = 60.0
SELECTOR = urllib.parse.quote("engine=sglang")


def request(base: str, method: str, path: str, body=None, timeout: float = 30):
    data = None if body is None else json.dumps(body).encode()
    headers = {"content-type": "application/json"} if data is not None else {}
    req = urllib.request.Request(base + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            return r.status, dict(r.headers), json.loads(raw) if raw else None
    except urllib.error.HTTPError as e:
        raw = e.read()
        return e.code, dict(e.headers), json.loads(raw) if raw else None


def wait_until(what: str, check, timeout: float = DEADLINE_SECS):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def metrics(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def ready_per_worker(text: str) -> dict[str, float]:
    """The ``smgrl_workers{health="ready"}`` gauge of each gateway process (supervisor's merge)."""
    out = {}
    for m in re.finditer(
        r'^smgrl_workers\{gateway_worker="(\d+)",health="ready"\} (\S+)$', text, re.MULTILINE
    ):
        out[m.group(1)] = float(m.group(2))
    return out


def start_supervisor(children, tmp_path, journal: str, *args, env=None):
    mport = free_port()
    child, port = launch_gateway(
        ["--workers", "2", "--journal", journal, "--prometheus-port", str(mport), *args],
        log_dir=tmp_path,
        env=env,
    )
    children.append(child)
    log_path = child.log_path
    base = f"http://127.0.0.1:{port}"
    line = wait_until(
        "the supervisor's listening line",
        lambda: next(
            (ln for ln in log_path.read_text().splitlines() if "smgrl.supervisor: listening" in ln),
            None,
        ),
    )
    pids = [int(p) for p in re.search(r"pids=([\d,]+)", line).group(1).split(",")]
    return child, base, f"http://127.0.0.1:{mport}/metrics", pids, log_path


def journal_events(path: str):
    with SqliteStore.open(path, readonly=True) as store:
        return list(store.read())


def lease(path: str, name: str):
    with SqliteStore.open(path, readonly=True) as store:
        return store.lease(name)


def test_two_workers_share_registrations_and_refuse_duplicates_once(fakes, children, tmp_path):
    urls = fakes("sglang", 3)
    journal = str(tmp_path / "j.db")
    _, base, murl, pids, _ = start_supervisor(children, tmp_path, journal, "--enable-rl")
    assert len(set(pids)) == 2
    # Every URL registered from 4 concurrent clients: exactly one 202 per URL, the rest 409,
    # whichever process each connection landed on.
    answers: list[tuple[str, int]] = []

    def register(url: str) -> None:
        st, _, _ = request(base, "POST", "/workers", {"url": url})
        answers.append((url, st))

    threads = [threading.Thread(target=register, args=(u,)) for u in urls for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for url in urls:
        codes = sorted(st for u, st in answers if u == url)
        assert codes == [202, 409, 409, 409], (url, codes)
    registered = [e.event for e in journal_events(journal) if e.event.TYPE == "worker.registered"]
    assert sorted(e.url for e in registered) == sorted(urls)
    # Both processes' projections hold the three engines, discovered (by the lease holder).
    wait_until(
        "both processes to see 3 ready engines",
        lambda: ready_per_worker(metrics(murl)) == {"0": 3.0, "1": 3.0},
    )
    # Discovery answers the same from every connection (whichever process serves it).
    for _ in range(6):
        st, _, body = request(base, "GET", "/v1/rl/workers")
        assert st == 200 and len(body["workers"]) == 3, body


def test_sigkill_mid_fanout_other_worker_records_it_interrupted(fakes, children, tmp_path):
    fast = fakes("sglang", 2)
    slow = fakes("sglang", 1, "--latency-ms", "4000")
    journal = str(tmp_path / "j.db")
    supervisor, base, murl, pids, log_path = start_supervisor(
        children, tmp_path, journal, "--enable-rl", "--rl-control-timeout-secs", "30"
    )
    acknowledged = []
    for url in fast + slow:
        st, _, body = request(base, "POST", "/workers", {"url": url})
        assert st == 202, body
        acknowledged.append(body["worker_id"])
    wait_until(
        "both processes to see 3 ready engines",
        lambda: ready_per_worker(metrics(murl)) == {"0": 3.0, "1": 3.0},
    )

    # A fan-out that waits on the slow engine; find the process running it and SIGKILL it.
    client = threading.Thread(
        target=lambda: _ignore_errors(
            request, base, "POST", f"/v1/rl/engine/flush_cache?selector={SELECTOR}", {}, 60
        )
    )
    client.start()
    started = wait_until(
        "the fan-out's control.started",
        lambda: next((r.event for r in journal_events(journal) if r.event.TYPE == "control.started"), None),
    )
    owner_pid = int(started.gateway.split(":")[1])
    assert owner_pid in pids
    os.kill(owner_pid, signal.SIGKILL)
    client.join(timeout=60)
    assert not client.is_alive()

    # The other process (holding or taking over the recovery lease) records it interrupted.
    end = wait_until(
        "control.interrupted for the killed process's fan-out",
        lambda: next(
            (
                r.event
                for r in journal_events(journal)
                if r.event.TYPE == "control.interrupted" and r.event.op_id == started.op_id
            ),
            None,
        ),
    )
    assert end.reason == "gateway_restart"
    targets = {t["worker_id"] for t in started.targets}
    assert set(end.missing_targets) | set(end.recorded_targets) == targets
    st, _, body = request(base, "GET", f"/v1/rl/operations/{started.op_id}")
    assert st == 200 and body["result"] == "interrupted", body
    # Nothing answered is lost; the chain verifies.
    events = journal_events(journal)
    assert set(acknowledged) <= {r.event.worker_id for r in events if r.event.TYPE == "worker.registered"}
    with SqliteStore.open(journal, readonly=True) as store:
        assert store.verify().ok
    # The supervisor restarted the killed worker.
    wait_until("the restart", lambda: "gateway worker exited; restarting it" in log_path.read_text())
    wait_until("two workers again", lambda: len(ready_per_worker(metrics(murl))) == 2)
    assert supervisor.proc.poll() is None


def test_sigkill_discovery_lease_holder_lease_taken_over(fakes, children, tmp_path):
    urls = fakes("sglang", 2)
    journal = str(tmp_path / "j.db")
    # The killed worker stays down: the survivor must take the lease over.
    _, base, murl, pids, _ = start_supervisor(
        children, tmp_path, journal, env={"SMGRL_WORKER_RESTART_DELAY_SECS": "120"}
    )
    st, _, _ = request(base, "POST", "/workers", {"url": urls[0]})
    assert st == 202
    wait_until("the first engine discovered", lambda: ready_per_worker(metrics(murl)) == {"0": 1.0, "1": 1.0})
    before = lease(journal, "discovery")
    holder_pid = int(before.holder.split(":")[1])
    assert holder_pid in pids
    os.kill(holder_pid, signal.SIGKILL)
    # Registered right after the kill: discovered once another process took the lease over.
    st, _, body = wait_until("a registration answered", lambda: _retry_post(base, urls[1]))
    assert st == 202, body
    wait_until(
        "the second engine discovered after the takeover",
        lambda: ready_per_worker(metrics(murl)) == {"0" if holder_pid == pids[1] else "1": 2.0},
    )
    after = lease(journal, "discovery")
    survivor = next(p for p in pids if p != holder_pid)
    assert int(after.holder.split(":")[1]) == survivor and after.epoch > before.epoch


def _retry_post(base: str, url: str):
    try:
        return request(base, "POST", "/workers", {"url": url}, timeout=10)
    except OSError:
        return None  # a connection the killed process had accepted: try again


def _ignore_errors(fn, *args):
    try:
        fn(*args)
    except OSError:
        pass  # the process serving it was killed


def test_workers_refused_in_one_line_while_a_lone_gateway_owns_the_journal(gateway, tmp_path):
    """A lone gateway holds the journal exclusively: the first worker is refused (its own line),
    the supervisor says which worker did not start and exits 1; nothing else starts."""
    import subprocess
    import sys

    journal = str(tmp_path / "j.db")
    gateway(journal=journal)
    argv = ["--workers", "2", "--journal", journal, "--port", str(free_port()), "--log-level", "warn"]
    proc = subprocess.run(
        [sys.executable, "-m", "smgrl", "launch", *argv, "--prometheus-port", str(free_port())],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors[-1] == "error: gateway worker 0 did not start (exit code 1): its error is above", (
        proc.stderr
    )
    assert "is in use by another smgrl gateway" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr


def _free_pair() -> int:
    """A port P with P and P+1 free on 127.0.0.1 now (bounded tries)."""
    import socket

    for _ in range(50):
        port = free_port()
        if port >= 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


def test_pinned_per_worker_forward_and_metrics_ports(children, tmp_path):
    """--forward-port and --worker-metrics-port: worker i's private forward listener and its own
    metrics listener are on PORT+i (a firewall or a scrape config can name them), not free ports."""
    forward, wmetrics = _free_pair(), _free_pair()
    journal = str(tmp_path / "j.db")
    _, _, murl, pids, _ = start_supervisor(
        children, tmp_path, journal, "--forward-port", str(forward), "--worker-metrics-port", str(wmetrics)
    )
    assert len(set(pids)) == 2
    peers = wait_until(
        "both workers' gateway.peer events",
        lambda: (
            urls
            if len(urls := {e.event.url for e in journal_events(journal) if e.event.TYPE == "gateway.peer"})
            == 2
            else None
        ),
    )
    assert {urllib.parse.urlsplit(u).port for u in peers} == {forward, forward + 1}
    for port in (wmetrics, wmetrics + 1):  # each worker's own exposition, on the pinned port
        assert "smgrl_workers" in metrics(f"http://127.0.0.1:{port}/metrics")
    assert "gateway_worker=" in metrics(murl)  # the supervisor still merges them

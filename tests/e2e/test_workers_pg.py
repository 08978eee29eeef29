"""Two gateways as if on two hosts (separate ``smgrl launch`` processes, separate ports) on one
PostgreSQL journal, started with the store's harness (tests/journal/pg_harness.py; skipped when no
PostgreSQL binaries are installed). docs/scale-out.md.

* A registration through one appears in the other's discovery (bounded wait: the lag itself is
  measured in benchmarks, not asserted here).
* A fan-out through one is auditable from the other while it runs (``GET /v1/rl/operations/ID``).
* SIGKILL the one running it: the other takes over the recovery lease if it was not holding it,
  records the operation interrupted, and every answered registration is in the journal.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import signal
import threading
import urllib.parse

import pytest
from test_workers import _ignore_errors, request, wait_until

from journal.postgres import PgStore
from smgrl.demo.procs import launch_gateway

pytestmark = pytest.mark.e2e

SELECTOR = urllib.parse.quote("engine=sglang")


def _harness():
    path = pathlib.Path(__file__).resolve().parents[1] / "journal" / "pg_harness.py"
    spec = importlib.util.spec_from_file_location("pg_harness_e2e", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pg_url():
    harness = _harness()
    why = harness.unavailable()
    if why is not None:
        pytest.skip(f"PostgreSQL e2e tests need a server: {why}")
    server = harness.PgServer().start()
    try:
        yield server.url("multi")
    finally:
        server.stop()


def start(children, tmp_path, url: str, *args):
    # The URL (with its password) in the environment, not on the command line.
    child, port = launch_gateway(args, log_dir=tmp_path, env={"SMGRL_JOURNAL": url})
    children.append(child)
    base = f"http://127.0.0.1:{port}"
    return child, base


def control_started(url: str):
    store = PgStore.open(url, readonly=True)
    try:
        return next(iter(store.read(types=["control.started"])), None)
    finally:
        store.close()


def journal_types(url: str) -> list:
    store = PgStore.open(url, readonly=True)
    try:
        return [r.event for r in store.read()]
    finally:
        store.close()


def test_two_hosts_on_postgres_share_the_fleet_and_take_over(fakes, children, tmp_path, pg_url):
    fast = fakes("sglang", 2)
    slow = fakes("sglang", 1, "--latency-ms", "4000")
    a, base_a = start(children, tmp_path, pg_url, "--enable-rl", "--rl-control-timeout-secs", "30")
    b, base_b = start(children, tmp_path, pg_url, "--enable-rl", "--rl-control-timeout-secs", "30")
    acknowledged = []
    for url in fast + slow:
        st, _, body = request(base_a, "POST", "/workers", {"url": url})
        assert st == 202, body
        acknowledged.append(body["worker_id"])
    # Registered through A, discovered (by the discovery lease's holder) and served by B.
    wait_until(
        "B's discovery to list the 3 engines",
        lambda: len(request(base_b, "GET", "/v1/rl/workers")[2]["workers"]) == 3,
    )
    # The same URL through B: refused, decided on the shared journal.
    st, _, body = request(base_b, "POST", "/workers", {"url": fast[0]})
    assert st == 409, body

    client = threading.Thread(
        target=lambda: _ignore_errors(
            request, base_a, "POST", f"/v1/rl/engine/flush_cache?selector={SELECTOR}", {}, 60
        )
    )
    client.start()
    started = wait_until("the fan-out's control.started", lambda: control_started(pg_url))
    op_id = started.event.op_id
    assert int(started.event.gateway.split(":")[1]) == a.pid
    # Auditable from B while it runs.
    st, _, body = request(base_b, "GET", f"/v1/rl/operations/{op_id}")
    assert st == 200 and body["status"] == "open", body
    os.kill(a.pid, signal.SIGKILL)
    client.join(timeout=60)
    assert not client.is_alive()
    # B takes the recovery lease over (if A held it) and records the operation interrupted.
    body = wait_until(
        "B to record the fan-out interrupted",
        lambda: (
            (r := request(base_b, "GET", f"/v1/rl/operations/{op_id}"))[2].get("result") == "interrupted"
            and r[2]
        ),
    )
    assert set(body["missing_targets"]) <= {t["worker_id"] for t in started.event.targets}
    events = journal_types(pg_url)
    ends = [e for e in events if e.TYPE == "control.interrupted" and e.op_id == op_id]
    assert len(ends) == 1 and ends[0].reason == "gateway_restart"
    assert set(acknowledged) <= {e.worker_id for e in events if e.TYPE == "worker.registered"}
    store = PgStore.open(pg_url, readonly=True)
    try:
        assert store.verify().ok
        assert store.lease("recovery").holder.split(":")[1] == str(b.pid)
    finally:
        store.close()

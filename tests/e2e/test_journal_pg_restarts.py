"""PostgreSQL restarted in immediate mode (every backend ended at once, crash recovery at the
next start) 10 times while two gateways on it take registrations: both gateways stay up (their
tails retry the reads that failed), every registration they acknowledged is in the journal, the
journal verifies, and each gateway's registry ends up listing every acknowledged engine (the
other's included: the tail caught up after the last restart)."""

from __future__ import annotations

import itertools
import threading
import urllib.error
import urllib.request

import pytest
from test_workers import request, wait_until
from test_workers_pg import _harness, journal_types, start

from journal.postgres import PgStore

pytestmark = pytest.mark.e2e

RESTARTS = 10


@pytest.fixture
def pg_server():
    harness = _harness()
    why = harness.unavailable()
    if why is not None:
        pytest.skip(f"PostgreSQL e2e tests need a server: {why}")
    server = harness.PgServer().start()
    try:
        yield server
    finally:
        server.stop()


def test_postgres_restarted_ten_times_under_load_loses_nothing_acknowledged(children, tmp_path, pg_server):
    url = pg_server.url("restarts")
    gateways = [start(children, tmp_path, url)[1], start(children, tmp_path, url)[1]]
    # A new engine URL per registration: 127/8 loopback hosts, port 9, where nothing listens. Not
    # a counted port: counting up from 40000 once reached a gateway's own (free) port, and a
    # loopback URL on the listener's port is refused as the gateway registering itself (400).
    numbers = itertools.count()
    acknowledged: list[str] = []
    statuses: list[int] = []
    failures: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def load(base: str) -> None:
        while not stop.is_set():
            with lock:
                n = next(numbers)
            url = f"http://127.{n // 50_000 % 250 + 1}.{n // 200 % 250}.{n % 200 + 2}:9"
            try:
                st, _, body = request(base, "POST", "/workers", {"url": url}, 30)
            except (OSError, urllib.error.URLError) as exc:  # the gateway itself went away
                failures.append(exc)
                return
            statuses.append(st)
            if st not in (202, 503):
                failures.append(AssertionError(f"{url}: {st} {body}"))
            if st == 202:
                acknowledged.append(body["worker_id"])

    loaders = [threading.Thread(target=load, args=(base,)) for base in gateways for _ in range(2)]
    for t in loaders:
        t.start()
    try:
        for _ in range(RESTARTS):
            before = len(acknowledged)
            wait_until(
                "registrations acknowledged between restarts", lambda b=before: len(acknowledged) >= b + 5
            )
            pg_server.restart(immediate=True)
        before = len(acknowledged)
        wait_until(
            "registrations acknowledged after the last restart", lambda: len(acknowledged) >= before + 5
        )
    finally:
        stop.set()
        for t in loaders:
            t.join(60)
    assert not failures, failures
    assert all(c.proc.poll() is None for c in children), "a gateway exited"
    assert set(statuses) <= {202, 503}, sorted(set(statuses))
    for base in gateways:
        with urllib.request.urlopen(base + "/health", timeout=10) as r:
            assert r.status == 200
    journaled = {e.worker_id for e in journal_types(url) if e.TYPE == "worker.registered"}
    assert set(acknowledged) <= journaled
    for base in gateways:
        wait_until(
            "every acknowledged engine in each gateway's registry",
            lambda base=base: (
                set(acknowledged) <= {w["id"] for w in request(base, "GET", "/workers")[2]["workers"]}
            ),
        )
    store = PgStore.open(url, readonly=True)
    try:
        assert store.verify().ok
    finally:
        store.close()

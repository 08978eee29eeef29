"""D5: every control call and fan-out is journaled (control.started -> one control.outcome per
target -> control.finished), and a fan-out cut short by a client disconnect is recorded as
cancelled with the outcomes that did arrive."""

from __future__ import annotations

import hashlib
import sqlite3

import trio
import trio.testing
from rl_api_helpers import journal, op_events, rl_cfg, row_ids

from journal import MemoryStore, SqliteStore
from smgrl.control.call import ControlRequest
from smgrl.control.service import CallContext
from smgrl.core.config import HealthConfig
from smgrl.core.selector import parse_selector
from smgrl.fake import fake_fleet
from smgrl.registry.service import Registration
from smgrl.runtime.server import serve
from smgrl.testing import gateway_in_process


async def test_fanout_records_start_outcomes_and_finish(rl_config):
    async with fake_fleet("sglang", 3) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        ids = await row_ids(gw)
        body = b'{"model_path":"/m","weight_version":"v2"}'
        r = await gw.client.post(
            "/v1/rl/engine/flush_cache?selector=engine%3Dsglang&x=1",
            content=body,
            headers={"x-request-id": "rid-9"},
        )
        op_id = r.headers["x-smgrl-operation-id"]
        events = op_events(gw, op_id)
        started, *outcomes, finished = events
        assert type(started).__name__ == "ControlStarted" and type(finished).__name__ == "ControlFinished"
        assert (started.kind, started.method, started.path, started.query, started.selector) == (
            "fanout",
            "POST",
            "flush_cache",
            "x=1",
            "engine=sglang",
        )
        assert started.body == body.decode() and started.body_encoding == "utf8"
        assert started.body_size == len(body) and started.body_sha256 == hashlib.sha256(body).hexdigest()
        assert started.content_type == "application/json" and started.request_id == "rid-9"
        assert sorted(t["worker_id"] for t in started.targets) == sorted(ids)
        assert sorted(o.worker_id for o in outcomes) == sorted(ids)
        assert all(o.status == 200 and o.error is None and o.op_id == op_id for o in outcomes)
        assert (
            finished.result,
            finished.http_status,
            finished.total,
            finished.succeeded,
            finished.failed,
        ) == ("ok", 200, 3, 3, 0)


async def test_large_bodies_are_hashed_not_kept_and_failures_are_outcomes():
    async with (
        fake_fleet("sglang", 2) as fleet,
        gateway_in_process(rl_cfg(timeout=1), worker_urls=fleet.urls) as gw,
    ):
        rows = (await gw.client.get("/v1/rl/workers")).json()["workers"]
        down = next(e for e in fleet.engines if e.url == rows[1]["url"])
        down.go_down(30)
        body = b'"' + b"x" * (64 * 1024) + b'"'
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang", content=body)
        assert r.status_code == 207
        started, *outcomes, finished = op_events(gw, r.headers["x-smgrl-operation-id"])
        assert started.body is None and started.body_encoding == "none"
        assert started.body_size == len(body) and started.body_sha256 == hashlib.sha256(body).hexdigest()
        by_id = {o.worker_id: o for o in outcomes}
        assert by_id[rows[0]["id"]].status == 200
        failed = by_id[rows[1]["id"]]
        assert (failed.status, failed.error) == (None, "upstream_unreachable")
        assert failed.message.startswith(f"upstream `{rows[1]['url']}` unreachable")
        assert (
            finished.result,
            finished.http_status,
            finished.total,
            finished.succeeded,
            finished.failed,
        ) == ("partial", 207, 2, 1, 1)


async def test_no_match_and_validation_failures(rl_config):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        before = len(journal(gw, "control.started"))
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dvllm")
        started, finished = op_events(gw, r.headers["x-smgrl-operation-id"])
        assert started.selector == "engine=vllm" and started.targets == ()
        assert (finished.result, finished.http_status, finished.total) == ("no_match", 400, 0)
        # Refused before any operation exists: nothing journaled but the audit event.
        await gw.client.post("/v1/rl/engine/flush_cache")
        await gw.client.post("/v1/rl/workers/nope/engine/flush_cache")
        await gw.client.post("/v1/rl/engine/a/b/c/d/e?selector=engine%3Dsglang")
        assert len(journal(gw, "control.started")) == before + 1


async def test_client_disconnect_mid_fanout_is_recorded_as_cancelled():
    store = MemoryStore()
    cfg = rl_cfg(
        concurrency=1,
        timeout=30,
        port=0,
        prometheus_port=0,
        health=HealthConfig(enabled=False),
        shutdown_grace_period_secs=0,
    )
    async with fake_fleet("sglang", 3) as fleet, trio.open_nursery() as nursery:
        shutdown = trio.Event()
        running = await nursery.start(
            lambda task_status: serve(cfg, shutdown=shutdown, store=store, task_status=task_status)
        )
        for url in fleet.urls:
            await running.gateway.registry.register(Registration(url=url), "api")
        with trio.fail_after(10):
            while sum(w.is_visible for w in running.gateway.fleet.registry) < 3:
                await trio.sleep(0.01)
        rows = sorted(running.gateway.fleet.registry, key=lambda w: w.base_url)
        engines = {e.url: e for e in fleet.engines}
        fast, slow = engines[rows[0].base_url], [engines[w.base_url] for w in rows[1:]]
        for e in slow:
            e.set_knobs(hang=True)
        host, port = running.urls[0].removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(
            b"POST /v1/rl/engine/flush_cache?selector=engine%3Dsglang HTTP/1.1\r\n"
            b"host: x\r\ncontent-length: 0\r\n\r\n"
        )
        # Concurrency 1, targets in row order: the fast engine answers, then the next one hangs.
        with trio.fail_after(10):
            while not slow[0].calls_to("/flush_cache"):
                await trio.sleep(0.01)
        await stream.aclose()  # the client goes away mid-fan-out
        with trio.fail_after(10):
            while not list(store.read(types=["control.finished"])):
                await trio.sleep(0.01)
        (finished,) = [r.event for r in store.read(types=["control.finished"])]
        started = next(r.event for r in store.read(types=["control.started"]))
        outcomes = [r.event for r in store.read(types=["control.outcome"])]
        assert (finished.result, finished.total, finished.succeeded, finished.failed) == (
            "cancelled",
            3,
            1,
            2,
        )
        assert finished.op_id == started.op_id
        assert [(o.worker_id, o.status) for o in outcomes] == [(rows[0].id, 200)]
        assert fast.calls_to("/flush_cache") and not slow[1].calls_to("/flush_cache")
        shutdown.set()


class CountingSqlite:
    """A real SQLite journal that records each transaction's event types (one call = one commit)."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.transactions: list[list[str]] = []

    def append_batch(self, items, *, wait=None):
        recorded = self.inner.append_batch(items, wait=wait)
        self.transactions.append([r.event.TYPE for r in recorded])
        return recorded

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_a_fanout_costs_two_journal_transactions(tmp_path):
    """The intent (durable before any engine is called), then the 8 outcomes, the finish
    and the audit event together (durable before the answer)."""
    store = CountingSqlite(SqliteStore.open(tmp_path / "j.db"))
    async with fake_fleet("sglang", 8) as fleet, gateway_in_process(rl_cfg(), store=store) as gw:
        await gw.register(fleet.urls)
        await gw.writer.flush()
        metric = gw.gateway.metrics.registry.get_sample_value
        kinds = ("control.started", "control.outcome", "control.finished", "audit.control_plane")

        def events_by_type() -> list[float]:
            return [metric("smgrl_journal_events_total", {"type": kind}) or 0.0 for kind in kinds]

        for _ in range(3):  # every fan-out, not just the first
            before, commits = len(store.transactions), gw.writer.commits
            counted, transactions = events_by_type(), metric("smgrl_journal_transactions_total")
            r = await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
            assert r.status_code == 200
            assert gw.writer.commits - commits == 2
            first, second = store.transactions[before:]
            assert first == ["control.started"]
            assert second == ["control.outcome"] * 8 + ["control.finished", "audit.control_plane"]
            # The metrics count the same (per type, one increment per type and transaction).
            assert [b - a for a, b in zip(counted, events_by_type())] == [1, 8, 1, 1]
            assert metric("smgrl_journal_transactions_total") - transactions == 2
        # A per-worker call too.
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        before = len(store.transactions)
        r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache")
        assert r.status_code == 200
        assert store.transactions[before:] == [
            ["control.started"],
            ["control.outcome", "control.finished", "audit.control_plane"],
        ]
    store.inner.close()


async def test_cancelled_before_the_intent_is_durable_still_closes_the_operation(tmp_path):
    """ControlService: a cancellation after control.started is queued but before it commits
    (here: another process holds the journal's write lock) must not leave the operation open
    until a restart: it ends `cancelled`, and no engine was called."""
    path = tmp_path / "j.db"
    store = SqliteStore.open(path)
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), store=store) as gw:
        await gw.register(fleet.urls)
        fleet.clear_calls()
        other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        control = gw.gateway.control
        targets = control.targets(parse_selector("engine=sglang"))
        req = ControlRequest("POST", "flush_cache", None, b"", None, ())
        scope = trio.CancelScope()

        async def client() -> None:
            with scope:
                await control.fanout(parse_selector("engine=sglang"), targets, req, CallContext())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(client)
            with trio.fail_after(10):
                while gw.writer.lock_waits == 0:  # the intent is queued and waits for the lock
                    await trio.sleep(0.001)
            scope.cancel()  # the client goes away before the intent is durable
            await trio.testing.wait_all_tasks_blocked()
            other.execute("COMMIT")  # the other process lets go
        other.close()
        with trio.fail_after(10):
            while not list(store.read(types=["control.finished"])):
                await trio.sleep(0.001)
        (finished,) = [r.event for r in store.read(types=["control.finished"])]
        assert finished.result == "cancelled" and finished.succeeded == 0
        assert gw.gateway.fleet.operations.open == {}
        assert not any(e.calls_to("/flush_cache") for e in fleet.engines)
    store.close()

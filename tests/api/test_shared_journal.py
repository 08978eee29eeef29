"""Two gateways on one SQLite journal, in one process (as two ``--workers`` processes would be):
decisions made once through the conditional append, whatever each one's projection has seen.

Gateway B does not follow the journal here (no tail task), so its projection is stale on purpose:
the decision must still be made once (the conditional append refuses B's stale decision; B catches
up and decides again). With a follow task the window is milliseconds; tests/e2e/test_workers.py
drives real processes.
"""

from __future__ import annotations

import contextlib

import pytest
import trio

from journal import JournalWriter, SqliteStore
from smgrl.core.errors import WorkerApiError
from smgrl.history.replay import restore
from smgrl.registry.keys import KeyRing
from smgrl.registry.service import Registration
from smgrl.runtime.gateway import Gateway


@contextlib.asynccontextmanager
async def shared_gateway(path, cfg, nursery):
    store = SqliteStore.open(path)
    fleet, restored = restore(store)
    writer = JournalWriter(store)
    writer.position = restored.head  # several writers: on_commit gets every event in order
    gateway = Gateway.build(cfg, fleet=fleet, journal=writer, store=store, keys=KeyRing(store.secrets()))
    await nursery.start(writer.run)
    try:
        yield gateway
    finally:
        await writer.aclose()
        store.close()


async def test_a_url_is_registered_once_across_gateways_whose_views_lag(rl_config, tmp_path):
    path = str(tmp_path / "j.db")
    async with (
        trio.open_nursery() as nursery,
        shared_gateway(path, rl_config, nursery) as a,
        shared_gateway(path, rl_config, nursery) as b,
    ):
        first = await a.registry.register(Registration(url="http://127.0.0.1:9"), "api")
        assert b.fleet.registry.get(first.id) is None  # B has not seen it (no tail)
        with pytest.raises(WorkerApiError) as refused:
            await b.registry.register(Registration(url="http://127.0.0.1:9"), "api")
        assert refused.value.status == 409
        assert first.id in str(refused.value)
        # B caught up while deciding again: its projection now holds A's registration.
        assert b.fleet.registry.get(first.id) is not None
        # A different URL still registers through B, decided on its caught-up view.
        other = await b.registry.register(Registration(url="http://127.0.0.1:10"), "api")
        assert other.url == "http://127.0.0.1:10"
    with SqliteStore.open(path, readonly=True) as store:
        urls = [r.event.url for r in store.read(types=["worker.registered"])]
    assert sorted(urls) == ["http://127.0.0.1:10", "http://127.0.0.1:9"]


async def test_one_refit_at_a_time_across_gateways_whose_views_lag(tmp_path):
    """A starts a refit; B, whose view has not seen it, is refused (409 refit_in_progress) instead
    of starting a second saga on the same engines."""
    from rl_api_helpers import rl_cfg

    from smgrl.fake import fake_fleet
    from smgrl.fake.checkpoint import make_checkpoint
    from smgrl.testing import gateway_in_process

    ckpt = str(make_checkpoint(tmp_path / "step-7", "fake/model", seed=7))
    body = {"selector": "engine=sglang", "source": {"disk": {"model_path": ckpt}}, "weight_version": "7"}
    path = str(tmp_path / "j.db")
    with SqliteStore.open(path) as store_a, SqliteStore.open(path) as store_b:
        async with (
            fake_fleet("sglang", 2) as engines,
            gateway_in_process(rl_cfg(), store=store_a, worker_urls=engines.urls, shared=True) as a,
            gateway_in_process(rl_cfg(), store=store_b, shared=True) as b,
        ):
            await b.writer.catch_up()  # B sees the engines A registered and discovered
            assert len(b.gateway.fleet.registry) == 2
            for engine in engines:
                engine.set_knobs(hang=True)  # A's saga stays open (its pause never answers)
            r = await a.client.post("/v1/rl/refits", json=body)
            assert r.status_code == 202, r.text
            assert not b.gateway.fleet.sagas.open  # B has not seen it
            r = await b.client.post("/v1/rl/refits", json=body)
            assert r.status_code == 409, r.text
            assert "refit_in_progress" in r.text, r.text
            for engine in engines:
                engine.set_knobs(hang=False)
    with SqliteStore.open(path, readonly=True) as store:
        assert len(list(store.read(types=["refit.started"]))) == 1


async def test_the_journal_tail_of_one_gateway_carries_the_others_events(rl_config, tmp_path):
    """What the SSE stream and the fleet page read (``gateway.tail``): B, following the journal,
    publishes A's registration, in order, after its projection applied it."""
    from journal import ChangeWatcher

    path = str(tmp_path / "j.db")
    async with (
        trio.open_nursery() as nursery,
        shared_gateway(path, rl_config, nursery) as a,
        shared_gateway(path, rl_config, nursery) as b,
    ):
        nursery.start_soon(b.journal.follow, ChangeWatcher(b.store))
        sub = b.tail.subscribe()
        first = await a.registry.register(Registration(url="http://127.0.0.1:9"), "api")
        with trio.fail_after(10):
            while True:
                batch = await sub.next_batch()
                hit = [r for r in batch if getattr(r.event, "worker_id", None) == first.id]
                if hit:
                    break
        assert hit[0].event.TYPE == "worker.registered"
        assert b.fleet.registry.get(first.id) is not None
        nursery.cancel_scope.cancel()


async def test_a_saga_of_a_gone_process_is_resumed_by_the_recovery_holder(tmp_path):
    """A starts a refit and stops mid-saga (its engines hang; its task is cancelled, nothing is
    recorded, as after a SIGKILL). While A's presence lease is held, B leaves the saga alone; once
    A is gone, B's recovery round records A's operation interrupted and drives the saga to its end."""
    from rl_api_helpers import rl_cfg

    from smgrl.cluster.sharing import PRESENCE, Sharing, recover_dead
    from smgrl.fake import fake_fleet
    from smgrl.fake.checkpoint import make_checkpoint
    from smgrl.testing import gateway_in_process

    ckpt = str(make_checkpoint(tmp_path / "step-7", "fake/model", seed=7))
    body = {"selector": "engine=sglang", "source": {"disk": {"model_path": ckpt}}, "weight_version": "7"}
    path = str(tmp_path / "j.db")
    a_id = "host-a:1:aaaa"
    with SqliteStore.open(path) as store_a, SqliteStore.open(path) as store_b:
        async with (
            fake_fleet("sglang", 2) as engines,
            gateway_in_process(rl_cfg(), store=store_b, shared=True) as b,
        ):
            async with gateway_in_process(
                rl_cfg(), store=store_a, worker_urls=engines.urls, shared=True
            ) as a:
                a.gateway.control.identity = a_id
                store_a.take_lease(PRESENCE + a_id, a_id, 60)  # A is alive
                for engine in engines:
                    engine.set_knobs(hang=True)
                r = await a.client.post("/v1/rl/refits", json=body)
                assert r.status_code == 202, r.text
                refit_id = r.json()["refit_id"]
                with trio.fail_after(10):
                    while not a.gateway.fleet.operations.open:
                        await trio.sleep(0.01)
            # A is gone: its saga task was cancelled mid-step, its operation left open.
            for engine in engines:
                engine.set_knobs(hang=False)
            await b.writer.catch_up()
            saga = b.gateway.fleet.sagas.get(refit_id)
            assert saga is not None and saga.is_open
            sharing = Sharing(identity="host-b:2:bbbb")
            # A's presence lease still held (not expired): nothing is recovered.
            assert await recover_dead(store_b, b.writer, b.gateway.fleet, sharing, b.gateway.refits) == []
            assert b.gateway.fleet.sagas.get(refit_id).is_open
            store_a.release_lease(PRESENCE + a_id, a_id)  # (expired or released: gone)
            interrupted = await recover_dead(store_b, b.writer, b.gateway.fleet, sharing, b.gateway.refits)
            assert len(interrupted) == 1
            with trio.fail_after(30):
                while b.gateway.fleet.sagas.get(refit_id).is_open:
                    await b.gateway.refits.change_event().wait()
            assert b.gateway.fleet.sagas.get(refit_id).result == "succeeded"
    with SqliteStore.open(path, readonly=True) as store:
        (started,) = store.read(types=["refit.started"])
        assert started.event.gateway == a_id
        assert store.verify().ok

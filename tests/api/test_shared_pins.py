"""Prompt-group pins across gateways sharing one SQLite journal, in one process (as two
``--workers`` processes would be; docs/scale-out.md "Prompt-group pins").

Gateway B does not follow the journal (no tail task), so its view lags on purpose: the pin must
still be decided once (B's conditional append is refused; B catches up and selects again under
A's pin). The two gateways' round-robin turns differ (A served one plain request first), so
each would pick another instance on its own.
"""

from __future__ import annotations

import contextlib

import trio

from journal import SqliteStore
from smgrl.cluster.sharing import PRESENCE, Sharing, recover_dead
from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.fake import fake_fleet
from smgrl.state.group_pins import TYPES
from smgrl.testing import gateway_in_process

GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}


def cfg() -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        # Prompt-group pins are a switch (off by default, as in PSRL's fork): these tests are about them.
        dataplane=DataPlaneConfig(eligible_wait_secs=0, psrl_group_sticky=True),
    )


@contextlib.asynccontextmanager
async def two_gateways(path, engines):
    with SqliteStore.open(path) as store_a, SqliteStore.open(path) as store_b:
        async with (
            gateway_in_process(cfg(), store=store_a, worker_urls=engines.urls, shared=True) as a,
            gateway_in_process(cfg(), store=store_b, shared=True) as b,
        ):
            await b.writer.catch_up()  # B sees the engines A registered and discovered
            assert len(b.gateway.dataplane.served_models()) == 1
            yield a, b


def events(path, kind):
    with SqliteStore.open(path, readonly=True) as store:
        return list(store.read(types=[kind]))


async def until(predicate) -> None:
    with trio.fail_after(10):
        while not predicate():
            await trio.sleep(0.005)


def busy(gw) -> set[str]:
    """The instances (worker ids) this gateway has a request in flight at."""
    return {wid for wid, n in gw.gateway.dataplane.loads.items() if n}


async def flush_releases(gw) -> None:
    """The gateway's pending pin releases in the journal (they wait for the next pin decision
    or the periodic flush: take them now)."""
    gw.gateway.dataplane.pins.flush()
    await gw.writer.flush()


async def send(gw, headers, scope: trio.CancelScope | None = None) -> None:
    with scope or trio.CancelScope():
        await gw.client.post("/generate", json=GEN, headers=headers)


async def test_the_first_requests_of_a_group_on_two_gateways_whose_views_lag_share_one_instance(tmp_path):
    path = str(tmp_path / "j.db")
    async with fake_fleet("sglang", n=3) as engines, two_gateways(path, engines) as (a, b):
        r = await a.client.post("/generate", json=GEN)  # A's round robin moves on by one
        assert r.status_code == 200, r.text
        for engine in engines:
            engine.set_knobs(hang=True)  # the group's requests stay in flight
        group = {"x-prompt-id": "g-1"}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, a, group)
            await until(lambda: a.gateway.dataplane.in_flight == 1)
            assert not b.gateway.fleet.group_pins.pins  # B has not seen A's pin (no tail)
            nursery.start_soon(send, b, group)
            await until(lambda: b.gateway.dataplane.in_flight == 1)
            assert busy(a) == busy(b), (busy(a), busy(b))  # one instance for the group
            (where,) = busy(a)
            nursery.cancel_scope.cancel()
        assert b.gateway.dataplane.pins.conflicts == 1  # B lost the race and followed A's pin
    (pinned,) = events(path, "dataplane.group_pinned")
    assert (pinned.event.prompt_id, pinned.event.worker_id) == ("g-1", where)


async def test_concurrent_requests_of_a_group_in_one_gateway_append_one_pin(tmp_path):
    """Requests of one process that arrive while its decision is in the air wait for it: one
    conditional append for the group, no conflict with itself; the release follows the last."""
    path = str(tmp_path / "j.db")
    async with (
        fake_fleet("sglang", n=3, token_latency_ms=2) as engines,
        two_gateways(path, engines) as (a, _),
    ):
        served = set()

        async def one() -> None:
            r = await a.client.post("/generate", json=GEN, headers={"x-prompt-id": "g-2"})
            assert r.status_code == 200, r.text
            served.add(r.headers["x-base-worker-id"])

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(one)
        assert len(served) == 1, served
        pins = a.gateway.dataplane.pins
        assert (pins.decided, pins.conflicts) == (1, 0)
        await flush_releases(a)
        assert len(a.gateway.dataplane.groups) == 0
    (pinned,) = events(path, "dataplane.group_pinned")
    (released,) = events(path, "dataplane.group_released")
    assert (released.event.pin_seq, released.event.reason) == (pinned.seq, "ended")


async def test_the_deciding_gateway_releases_the_pin_and_the_others_keep_it_while_they_run(tmp_path):
    """A decided the pin and B joined it. A's request ends: A releases the pin in the journal,
    but B's next request of the group, while B's first one runs, still goes to the pinned
    instance (B's hold), not where B's own round robin would send it. Once B's requests end
    too, the next request of the group pins afresh, decided by B."""
    path = str(tmp_path / "j.db")
    async with fake_fleet("sglang", n=3) as engines, two_gateways(path, engines) as (a, b):
        group = {"x-prompt-id": "g-3"}
        r = await a.client.post("/generate", json=GEN)  # A's and B's turns differ
        assert r.status_code == 200, r.text
        for engine in engines:
            engine.set_knobs(hang=True)
        a_request = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(send, a, group, a_request)
            await until(lambda: a.gateway.dataplane.in_flight == 1)
            await b.writer.catch_up()  # B sees A's pin
            nursery.start_soon(send, b, group)
            await until(lambda: b.gateway.dataplane.in_flight == 1)
            (pinned_at,) = busy(b)
            assert busy(a) == {pinned_at}
            a_request.cancel()  # A's request ends (its client went away): A releases
            await until(lambda: a.gateway.dataplane.in_flight == 0)
            await flush_releases(a)
            await b.writer.catch_up()
            assert not b.gateway.fleet.group_pins.pins  # released in the journal
            nursery.start_soon(send, b, group)
            await until(lambda: b.gateway.dataplane.in_flight == 2)
            assert busy(b) == {pinned_at}  # B's hold
            nursery.cancel_scope.cancel()
        await until(lambda: b.gateway.dataplane.in_flight == 0)
        for engine in engines:
            engine.set_knobs(hang=False)
        r = await b.client.post("/generate", json=GEN, headers=group)
        assert r.status_code == 200, r.text
        await flush_releases(b)
    first, second = events(path, "dataplane.group_pinned")
    assert first.event.gateway == a.gateway.dataplane.pins.identity
    assert second.event.gateway == b.gateway.dataplane.pins.identity
    released = [(e.event.pin_seq, e.event.reason) for e in events(path, "dataplane.group_released")]
    assert released == [(first.seq, "ended"), (second.seq, "ended")]


async def test_the_recovery_holder_releases_the_pins_of_a_gone_gateway(tmp_path):
    from smgrl.events import GroupPinned

    path = str(tmp_path / "j.db")
    a_id = "host-a:1:aaaa"
    async with fake_fleet("sglang", n=1) as engines, two_gateways(path, engines) as (a, b):
        a.gateway.control.identity = a_id
        a.store.take_lease(PRESENCE + a_id, a_id, 60)  # A is alive
        # A's pin, left behind as a SIGKILL leaves it (its request never ended).
        worker = a.gateway.fleet.registry.id_for_url(engines.urls[0])
        event = GroupPinned(prompt_id="g-4", worker_id=worker, dp_rank=0, gateway=a_id)
        await a.writer.append("group:g-4", event)
        await b.writer.catch_up()
        sharing = Sharing(identity="host-b:2:bbbb")
        await recover_dead(b.store, b.writer, b.gateway.fleet, sharing)
        assert "g-4" in b.gateway.fleet.group_pins.pins  # A's presence is held: kept
        a.store.release_lease(PRESENCE + a_id, a_id)  # A is gone
        await recover_dead(b.store, b.writer, b.gateway.fleet, sharing)
        assert not b.gateway.fleet.group_pins.pins
    (released,) = events(path, "dataplane.group_released")
    assert released.event.reason == "gateway_gone"


async def test_a_release_rides_in_the_next_pin_decisions_transaction(tmp_path, monkeypatch):
    """One journal commit per group in steady state: a group's release waits and is committed
    with the next group's pin; a request of a group whose release is pending takes it back."""
    monkeypatch.setattr("smgrl.dataplane.pins.FLUSH_SECS", 3600)  # no periodic flush meanwhile
    path = str(tmp_path / "j.db")
    async with fake_fleet("sglang", n=2) as engines, two_gateways(path, engines) as (a, _):
        pins = a.gateway.dataplane.pins
        for group in ("g-5", "g-6"):
            r = await a.client.post("/generate", json=GEN, headers={"x-prompt-id": group})
            assert r.status_code == 200, r.text
        assert list(pins.pending) == ["group:g-6"]  # g-5's release rode with g-6's pin
        r = await a.client.post("/generate", json=GEN, headers={"x-prompt-id": "g-6"})
        assert r.status_code == 200, r.text
        assert list(pins.pending) == ["group:g-6"]  # taken back at the start, pending again at the end
        await flush_releases(a)
    with SqliteStore.open(path, readonly=True) as store:
        rows = [(r.seq, r.event.TYPE, r.event.prompt_id) for r in store.read(types=list(TYPES))]
    (g5, _, _), (g6, _, _) = [row for row in rows if row[1] == "dataplane.group_pinned"]
    assert rows == [
        (g5, "dataplane.group_pinned", "g-5"),
        (g6, "dataplane.group_pinned", "g-6"),
        (g6 + 1, "dataplane.group_released", "g-5"),  # the same transaction as g-6's pin
        (rows[-1][0], "dataplane.group_released", "g-6"),
    ]


async def test_a_release_no_decision_takes_along_is_flushed_by_the_pins_task(tmp_path):
    """No later pin decision on A: the pins task (woken by the release, not by a timer) writes
    the release within FLUSH_SECS, with no explicit flush."""
    path = str(tmp_path / "j.db")
    async with fake_fleet("sglang", n=2) as engines, two_gateways(path, engines) as (a, _):
        r = await a.client.post("/generate", json=GEN, headers={"x-prompt-id": "g-9"})
        assert r.status_code == 200, r.text
        await until(lambda: not a.gateway.dataplane.pins.pending)
        await a.writer.flush()
    (pinned,) = events(path, "dataplane.group_pinned")
    (released,) = events(path, "dataplane.group_released")
    assert (released.event.prompt_id, released.event.pin_seq) == ("g-9", pinned.seq)

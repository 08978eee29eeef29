"""PSRL's routing loop on a real fake engine (loopback): with ``max_concurrent_seqs_per_instance``
reached, requests wait in their model's queue and go out one by one in the fork's order
(validation, then version tag, then the sort key), woken the moment capacity frees; a client
that leaves while queued is taken out; /routing_loop/status reports the queue's partitions."""

from __future__ import annotations

import pytest
import trio

from smgrl.core.config import Config, DataPlaneConfig, RlConfig, RoutingLoopConfig
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process


def cfg(**loop) -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        dataplane=DataPlaneConfig(eligible_wait_secs=20),
        routing_loop=RoutingLoopConfig(**{"max_seqs_per_instance": 1, **loop}),
    )


def gen(n: int) -> dict:
    return {"input_ids": list(range(1, n + 1)), "sampling_params": {"max_new_tokens": 1}}


async def until(predicate, secs: float = 10.0) -> None:
    """Bounded wait for a condition the gateway reaches by itself (checked every 5 ms)."""
    with trio.fail_after(secs):
        while not predicate():
            await trio.sleep(0.005)


async def occupy(gw, engine, nursery) -> trio.CancelScope:
    """A request the engine holds (``hang``): the instance is full until it is cancelled."""
    engine.set_knobs(hang=True)
    scope = trio.CancelScope()

    async def held() -> None:
        with scope:
            await gw.client.post("/generate", json=gen(50))

    nursery.start_soon(held)
    await until(lambda: gw.app.dataplane.loads and max(gw.app.dataplane.loads.values()) == 1)
    await until(lambda: len(engine.calls_to("/generate")) == 1)
    return scope


async def release(engine, scope: trio.CancelScope) -> None:
    engine.set_knobs(hang=False)
    scope.cancel()  # the held request's client leaves: its instance has room again


def settled(dp, n: int) -> bool:
    """``n`` requests wait, each having looked for an instance (none holds a turn): the order
    they leave in is then the loop's alone (a request holding its turn when capacity frees
    takes it, as a popped entry does in the fork)."""
    return sum(len(q.tried) for q in dp.queues.models.values()) == n and len(dp.queues) == n


def lengths(engine) -> list[int]:
    return [len(c.json_body()["input_ids"]) for c in engine.calls_to("/generate")]


@pytest.mark.parametrize(
    ("sort_key", "expected"),
    [("short_length", [1, 3, 5]), ("long_length", [5, 3, 1])],
)
async def test_queued_requests_go_out_one_at_a_time_in_sort_key_order(sort_key, expected):
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(sort_key=sort_key), worker_urls=fleet.urls) as gw,
    ):
        engine, dp = fleet.engines[0], gw.app.dataplane
        answers = {}
        async with trio.open_nursery() as nursery:
            scope = await occupy(gw, engine, nursery)

            async def send(n: int) -> None:
                answers[n] = await gw.client.post("/generate", json=gen(n))

            for i, n in enumerate((5, 1, 3)):  # arrival order differs from both sort orders
                nursery.start_soon(send, n)
                await until(lambda i=i: settled(dp, i + 1))
            assert len(engine.calls_to("/generate")) == 1  # all three wait in the gateway
            await release(engine, scope)
        assert all(r.status_code == 200 for r in answers.values()), [r.text for r in answers.values()]
        assert lengths(engine)[1:] == expected
        assert len(dp.queues) == 0 and not dp.waiting


async def test_validation_first_then_versioned_continuations_before_fresh_requests():
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        r = await gw.client.post(f"/v1/rl/workers/{wid}/version", json={"weight_version": "3"})
        assert r.status_code == 200, r.text
        engine, dp = fleet.engines[0], gw.app.dataplane
        async with trio.open_nursery() as nursery:
            scope = await occupy(gw, engine, nursery)
            sends = [
                (2, {"x-request-id": "1", "x-prompt-id": "a"}),  # fresh, unversioned, shortest
                (6, {"x-request-id": "2", "x-prompt-id": "b", "x-version-tag": "3"}),  # a continuation's tag
                (8, {"x-request-id": "3", "x-prompt-id": "c", "x-is-validate": "1"}),  # validation
                (
                    4,
                    {"x-request-id": "4", "x-prompt-id": "d", "x-version-tag": "2"},
                ),  # older tag: first of the tagged
            ]
            for i, (n, headers) in enumerate(sends):
                nursery.start_soon(lambda n=n, h=headers: gw.client.post("/generate", json=gen(n), headers=h))
                await until(lambda i=i: settled(dp, i + 1))
            status = (await gw.client.get("/routing_loop/status")).json()
            assert status["queue_len"] == 4 and status["partition_queue_lens"] == {"0": 4}
            await release(engine, scope)
        assert lengths(engine)[1:] == [8, 4, 6, 2]


async def test_multi_priority_partitions_by_version_and_status_reports_them():
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(multi_priority=True), worker_urls=fleet.urls) as gw,
    ):
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        r = await gw.client.post(f"/v1/rl/workers/{wid}/version", json={"weight_version": "3"})
        assert r.status_code == 200, r.text
        engine, dp = fleet.engines[0], gw.app.dataplane
        async with trio.open_nursery() as nursery:
            scope = await occupy(gw, engine, nursery)
            sends = [
                (8, {"x-request-id": "3", "x-prompt-id": "c", "x-is-validate": "1"}),  # unversioned
                (6, {"x-request-id": "2", "x-prompt-id": "b", "x-version-tag": "3"}),
            ]
            for i, (n, headers) in enumerate(sends):
                nursery.start_soon(lambda n=n, h=headers: gw.client.post("/generate", json=gen(n), headers=h))
                await until(lambda i=i: settled(dp, i + 1))
            status = (await gw.client.get("/routing_loop/status")).json()
            assert status["queue_keys"] == [3, 2**31 - 1]
            assert status["partition_queue_lens"] == {"3": 1, str(2**31 - 1): 1}
            await release(engine, scope)
        # The version partition drains first, even before a validation request.
        assert lengths(engine)[1:] == [6, 8]


async def test_capacity_freed_wakes_the_loop_at_once_not_on_its_interval():
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(check_interval_secs=600.0), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet.engines[0]
        async with trio.open_nursery() as nursery:
            scope = await occupy(gw, engine, nursery)
            got = {}

            async def send() -> None:
                got["r"] = await gw.client.post("/generate", json=gen(2))

            nursery.start_soon(send)
            await until(lambda: len(gw.app.dataplane.queues) == 1)
            await release(engine, scope)
            with trio.fail_after(10):  # far below the 600 s interval: an event woke it
                while "r" not in got:
                    await trio.sleep(0.005)
        assert got["r"].status_code == 200


async def test_a_client_that_leaves_while_queued_is_taken_out_and_never_sent():
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        engine, dp = fleet.engines[0], gw.app.dataplane
        async with trio.open_nursery() as nursery:
            scope = await occupy(gw, engine, nursery)
            leaving = trio.CancelScope()
            got = {}

            async def impatient() -> None:
                with leaving:
                    await gw.client.post("/generate", json=gen(1))

            async def patient() -> None:
                got["r"] = await gw.client.post("/generate", json=gen(7))

            nursery.start_soon(impatient)
            await until(lambda: len(dp.queues) == 1)
            nursery.start_soon(patient)
            await until(lambda: len(dp.queues) == 2)
            leaving.cancel()
            await until(lambda: len(dp.queues) == 1)
            assert not dp.waiting_requests or len(dp.waiting_requests) == 1
            await release(engine, scope)
        assert got["r"].status_code == 200
        assert lengths(engine)[1:] == [7]  # the one that left never reached the engine
        assert len(dp.queues) == 0


async def test_a_queued_request_runs_out_of_its_wait_with_a_503_naming_the_queue():
    config = cfg()
    config = Config(
        rl=config.rl,
        policy=config.policy,
        dataplane=DataPlaneConfig(eligible_wait_secs=0.3),
        routing_loop=config.routing_loop,
    )
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(config, worker_urls=fleet.urls) as gw:
        engine = fleet.engines[0]
        async with trio.open_nursery() as nursery:
            scope = await occupy(gw, engine, nursery)
            r = await gw.client.post("/generate", json=gen(2))
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "no_eligible_workers"
            assert len(gw.app.dataplane.queues) == 0
            await release(engine, scope)


async def test_without_the_routing_loop_nothing_is_capped():
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(Config(), worker_urls=fleet.urls) as gw:
        assert gw.app.dataplane.queues is None
        engine = fleet.engines[0]
        engine.set_knobs(latency_ms=200)
        async with trio.open_nursery() as nursery:
            for n in (1, 2, 3):
                nursery.start_soon(lambda n=n: gw.client.post("/generate", json=gen(n)))
            await until(lambda: len(engine.calls_to("/generate")) == 3)  # all at once


async def test_paused_dispatch_queues_every_request_and_the_resume_sends_them_in_order():
    """PSRL's sync: pause, the rollouts wait (listed by /routing_loop/filter), resume: they go
    out in the loop's order (lowest version tag first, unversioned last)."""
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        r = await gw.client.post(f"/v1/rl/workers/{wid}/version", json={"weight_version": "5"})
        assert r.status_code == 200, r.text
        engine, dp = fleet.engines[0], gw.app.dataplane
        assert (await gw.client.post("/routing_loop/pause")).json()["paused"] is True
        answers = []
        sends = [(3, "5"), (7, None), (5, "3")]  # (prompt length, x-version-tag)
        async with trio.open_nursery() as nursery:
            for i, (n, tag) in enumerate(sends):
                headers = {"x-request-id": str(10 + i), "x-prompt-id": str(i)}
                if tag is not None:
                    headers["x-version-tag"] = tag

                async def one(n=n, headers=headers) -> None:
                    answers.append(
                        (await gw.client.post("/generate", json=gen(n), headers=headers)).status_code
                    )

                nursery.start_soon(one)
                await until(lambda i=i: settled(dp, i + 1))
            listed = (await gw.client.get("/routing_loop/filter?version_tag=4")).json()
            assert sorted(x["request_id"] for x in listed) == [11, 12]  # tag 3 and unversioned
            assert not engine.calls_to("/generate")
            await gw.client.post("/routing_loop/resume")
        assert answers == [200, 200, 200]
        assert lengths(engine) == [5, 3, 7]

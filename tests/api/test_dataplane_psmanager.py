"""PSManager admission over gRPC, in process against the grpcio fake: each RPC's effect on where a
rollout goes (CanReserveRequest filters, GetReserveIndicator orders, ReserveRolloutInstanceRequests
/ UpdateRequestInstanceId commit, CheckAbortedRequests drops), a loopback continuation dropped when
PSManager reports it aborted, and a slow or absent PSManager bounded without blocking the loop."""

from __future__ import annotations

import grpc
import pytest
import trio
from test_dataplane_loopback import body, produced, rl

from smgrl.core.config import Config, DataPlaneConfig, PsrlConfig, RlConfig, RoutingLoopConfig
from smgrl.dataplane.instance_stats import InstanceStats
from smgrl.fake import fake_fleet
from smgrl.fake.psmanager import FakePSManager
from smgrl.testing import gateway_in_process

GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}


def cfg(wait: float = 0.3, loop: RoutingLoopConfig | None = None) -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        dataplane=DataPlaneConfig(eligible_wait_secs=wait, max_loopbacks=4),
        routing_loop=loop,
    )


@pytest.fixture
def psm():
    fake = FakePSManager().start()
    yield fake
    fake.stop()


def use(gw, psm, **kw) -> None:
    settings = {"ps_manager_addr": psm.addr, "ps_manager_timeout_secs": 0.3, "recheck_secs": 0.02, **kw}
    gw.app.dataplane.use_psrl(PsrlConfig(**settings))


async def versioned(gw, fleet) -> list[str]:
    """Two engines at versions 1 and 2; their registry ids."""
    ids = [gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls]
    for wid, version in zip(ids, ("1", "2"), strict=True):
        r = await gw.client.post(f"/v1/rl/workers/{wid}/version", json={"weight_version": version})
        assert r.status_code == 200, r.text
    return ids


def meta(rid: int, prompt: str = "p", **extra) -> dict:
    return {"x-request-id": str(rid), "x-prompt-id": prompt, **extra}


async def test_can_reserve_keeps_only_reservable_versions_and_reserve_records_the_choice(psm):
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        ids = await versioned(gw, fleet)
        use(gw, psm)
        r = await gw.client.post("/generate", json=GEN, headers=meta(11, "a"))
        assert r.headers["x-base-worker-id"] == ids[1]  # newest first, all reservable
        psm.script.reservable = {1}
        r = await gw.client.post("/generate", json=GEN, headers=meta(12, "b", **{"x-is-validate": "1"}))
        assert r.status_code == 200, r.text
        assert r.headers["x-base-worker-id"] == ids[0]  # only version 1 has room
        asked = psm.calls("CanReserveRequest")[-1]
        assert (list(asked.request_ids), list(asked.model_versions), list(asked.is_validate)) == (
            [12],
            [1, 2],
            [True],
        )
        reserved = psm.calls("ReserveRolloutInstanceRequests")[-1]
        assert (reserved.rollout_instance_ids[0].worker_id, reserved.rollout_instance_ids[0].dp_rank) == (
            ids[0],
            0,
        )
        assert (list(reserved.request_ids), list(reserved.model_versions), reserved.is_validate) == (
            [12],
            [1],
            True,
        )
        # A versioned request is not asked about (the fork: pre-routed by its tag).
        before = len(psm.calls("CanReserveRequest"))
        r = await gw.client.post("/generate", json=GEN, headers=meta(13, "c", **{"x-version-tag": "2"}))
        assert r.headers["x-base-worker-id"] == ids[1] and len(psm.calls("CanReserveRequest")) == before


async def test_reserve_indicators_order_the_candidates(psm):
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        ids = await versioned(gw, fleet)
        use(gw, psm, candidate_sort_key="reserve_capability")
        psm.script.indicators = {1: 0.1, 2: 0.9}  # lower is better
        r = await gw.client.post("/generate", json=GEN, headers=meta(21, "a"))
        assert r.headers["x-base-worker-id"] == ids[0]
        psm.script.indicators = {1: 0.9, 2: 0.1}
        r = await gw.client.post("/generate", json=GEN, headers=meta(22, "b"))
        assert r.headers["x-base-worker-id"] == ids[1]
        (asked, _) = psm.calls("GetReserveIndicator")
        assert (asked.request_id, list(asked.model_versions)) == (21, [1, 2])


@pytest.mark.parametrize(
    "loop", [None, RoutingLoopConfig(check_interval_secs=0.02)], ids=["own-task", "routing-loop"]
)
async def test_nothing_reservable_waits_and_asks_again_until_room_appears(psm, loop):
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg(wait=10, loop=loop), worker_urls=fleet.urls) as gw,
    ):
        await versioned(gw, fleet)
        use(gw, psm)
        psm.script.reservable = set()
        result = {}

        async def rollout():
            result["r"] = await gw.client.post("/generate", json=GEN, headers=meta(31))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            with trio.fail_after(10):
                while len(psm.calls("CanReserveRequest")) < 3:  # it keeps asking
                    await trio.sleep(0.01)
            assert "r" not in result and not any(e.calls_to("/generate") for e in fleet.engines)
            psm.script.reservable = {1}
        assert result["r"].status_code == 200, result["r"].text


async def test_never_reservable_ends_as_a_held_out_503(psm):
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg(wait=0.2), worker_urls=fleet.urls) as gw,
    ):
        await versioned(gw, fleet)
        use(gw, psm)
        psm.script.reservable = set()
        r = await gw.client.post("/generate", json=GEN, headers=meta(32))
        assert r.status_code == 503 and r.json()["error"]["reasons"] == {"ps_manager_refused": 2}


@pytest.mark.parametrize("failure", ["status", "slow", "down"])
async def test_a_failing_slow_or_absent_psmanager_holds_the_request_within_bounds_only(psm, failure):
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg(wait=0.5), worker_urls=fleet.urls) as gw,
    ):
        await versioned(gw, fleet)
        use(gw, psm)
        if failure == "status":
            psm.script.fail, psm.script.fail_only = (
                grpc.StatusCode.UNAVAILABLE,
                frozenset({"CanReserveRequest"}),
            )
        elif failure == "slow":
            psm.script.delay_secs = 30.0
        else:
            psm.stop()
        result, plain_done = {}, {}

        async def staged_rollout():
            started = trio.current_time()
            result["r"] = await gw.client.post("/generate", json=GEN, headers=meta(41))
            result["secs"] = trio.current_time() - started

        async def plain_rollout():
            r = await gw.client.post("/generate", json=GEN)  # no routing metadata: PSManager not asked
            plain_done["at"] = trio.current_time()
            plain_done["status"] = r.status_code

        async with trio.open_nursery() as nursery:
            nursery.start_soon(staged_rollout)
            await trio.sleep(0.05)
            nursery.start_soon(plain_rollout)
        r = result["r"]
        assert r.status_code == 503 and r.json()["error"]["reasons"] == {"ps_manager_unavailable": 2}, r.text
        # Bounded: the wait (0.5 s) plus at most one call's bound (0.3 s), with slack for the machine.
        assert result["secs"] < 3.0
        assert plain_done["status"] == 200  # the loop kept serving meanwhile


async def test_a_request_psmanager_reports_aborted_is_dropped_before_dispatch(psm):
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        await versioned(gw, fleet)
        use(gw, psm)
        psm.script.aborted = {51}
        r = await gw.client.post("/generate", json=GEN, headers=meta(51))
        assert r.status_code == 400 and r.json()["error"]["code"] == "request_aborted", r.text
        assert not any(e.calls_to("/generate") for e in fleet.engines)
        asked = psm.calls("CheckAbortedRequests")[-1]
        assert (list(asked.request_ids), asked.remove) == ([51], True)
        # A failing abort check dispatches (the fork: "continuing dispatch").
        psm.script.fail, psm.script.fail_only = grpc.StatusCode.INTERNAL, frozenset({"CheckAbortedRequests"})
        assert (await gw.client.post("/generate", json=GEN, headers=meta(52))).status_code == 200


async def test_a_rejected_commit_is_not_dispatched(psm):
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        await versioned(gw, fleet)
        use(gw, psm)
        psm.script.reserve_ok, psm.script.reserve_error = False, "buffer full"
        r = await gw.client.post("/generate", json=GEN, headers=meta(61))
        assert r.status_code == 503 and r.json()["error"]["code"] == "psrl_selection_commit_rejected", r.text
        assert "buffer full" in r.json()["error"]["message"]
        assert not any(e.calls_to("/generate") for e in fleet.engines)


async def test_a_hinted_request_updates_its_instance_instead_of_reserving(psm):
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        ids = await versioned(gw, fleet)
        use(gw, psm)
        hint = {"x-base-worker-id": ids[0], "x-target-dp-rank": "0", "x-is-sticky": "1"}
        r = await gw.client.post("/generate", json=GEN, headers=meta(71, **hint))
        assert r.status_code == 200 and r.headers["x-base-worker-id"] == ids[0]
        (update,) = psm.calls("UpdateRequestInstanceId")
        assert (update.request_id, update.new_instance_id.worker_id, update.new_instance_id.dp_rank) == (
            71,
            ids[0],
            0,
        )
        assert not psm.calls("ReserveRolloutInstanceRequests")


async def test_a_request_without_an_int64_id_is_not_psmanagers(psm):
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        await versioned(gw, fleet)
        use(gw, psm)
        assert (await gw.client.post("/generate", json=GEN, headers=meta("roll-x"))).status_code == 200
        assert not psm.calls()


@pytest.mark.parametrize("aborted", [False, True])
async def test_a_loopback_continuation_psmanager_reports_aborted_is_dropped(psm, tmp_path, aborted):
    async with (
        fake_fleet("sglang", n=1, token_latency_ms=3) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet.engines[0]
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        use(gw, psm)
        result = {}

        async def rollout():
            result["r"] = await gw.client.post("/generate", json=body(), headers=meta(81))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            await produced(engine, 8)
            if aborted:
                psm.script.aborted = {81}  # PSRL aborted it (its coordinator) while it ran
            await rl(gw, wid, "pause_generation", {"mode": "abort"})
            await rl(gw, wid, "continue_generation", {})
        r = result["r"]
        checks = psm.calls("CheckAbortedRequests")
        # The first dispatch, then each selection pass of the continuation (it may wait for the
        # engine to come back first): as the fork asks at each hand-out from its queue.
        assert len(checks) >= 2
        if aborted:
            assert r.status_code == 400 and r.json()["error"]["code"] == "request_aborted", r.text
            assert len(engine.calls_to("/generate")) == 1  # no continuation sent
        else:
            assert r.status_code == 200, r.text
            assert len(engine.calls_to("/generate")) == 2
            (update,) = psm.calls("UpdateRequestInstanceId")  # the continuation moved, not reserved
            assert update.request_id == 81 and len(psm.calls("ReserveRolloutInstanceRequests")) == 1


async def test_the_kv_gate_holds_out_instances_by_their_engine_reports():
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg(wait=0.2), worker_urls=fleet.urls) as gw,
    ):
        ids = await versioned(gw, fleet)
        dp = gw.app.dataplane
        dp.use_psrl(PsrlConfig(reject_on_waiting=True, kv_capacity_threshold=0.8, recheck_secs=0.02))
        dp.instance_stats.put(ids[1], 0, InstanceStats(running=3, waiting=2, kv_usage=0.1))
        r = await gw.client.post("/generate", json=GEN, headers=meta(91, "a"))
        assert r.headers["x-base-worker-id"] == ids[0]  # the newer one has requests waiting
        dp.instance_stats.put(ids[0], 0, InstanceStats(running=1, waiting=0, kv_usage=0.9))
        r = await gw.client.post("/generate", json=GEN, headers=meta(92, "b"))
        assert r.status_code == 503 and r.json()["error"]["reasons"] == {"engine_waiting": 1, "kv_full": 1}
        dp.instance_stats.put(ids[1], 0, InstanceStats(running=3, waiting=0, kv_usage=0.5))
        r = await gw.client.post("/generate", json=GEN, headers=meta(93, "c"))
        assert r.headers["x-base-worker-id"] == ids[1]


async def test_prompt_groups_are_pinned_only_when_group_stickiness_is_on():
    async with (
        fake_fleet("sglang", n=2, token_latency_ms=5) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        dp = gw.app.dataplane

        async def group(base: int, prompt: str) -> set:
            served = set()

            async def one(i: int) -> None:
                r = await gw.client.post("/generate", json=GEN, headers=meta(base + i, prompt))
                served.add(r.headers["x-base-worker-id"])

            async with trio.open_nursery() as nursery:  # the group's requests run together
                for i in range(6):
                    nursery.start_soon(one, i)
            return served

        dp.group_sticky = False  # --psrl-group-sticky off: the fork's default
        assert len(await group(100, "g")) == 2  # round robin
        dp.group_sticky = True  # PSRL's launch turns it on
        assert len(await group(200, "h")) == 1  # pinned while the group runs

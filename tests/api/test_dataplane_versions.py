"""Version-aware routing (docs/data-plane.md, "Version policies"): --rl-version-policy, the
x-smg-version-policy header, and PSRL's x-version-tag floor."""

from __future__ import annotations

import logging
from collections import Counter

import attrs
import pytest
import trio

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.core.errors import ConfigError
from smgrl.fake import fake_fleet
from smgrl.runtime.startup import validate
from smgrl.testing import gateway_in_process

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}


def cfg(policy: str = "any", rl: bool = True, wait: float | None = 0) -> Config:
    return Config(
        rl=RlConfig(enabled=rl, control_timeout_secs=5, version_policy=policy),
        policy="round_robin",
        dataplane=DataPlaneConfig(eligible_wait_secs=wait),
    )


async def routed(gw, n: int = 6, headers=None) -> Counter:
    out = Counter()
    for _ in range(n):
        r = await gw.client.post("/generate", json=GEN, headers=headers or {})
        assert r.status_code == 200, r.text
        out[r.headers["x-smgrl-worker-id"]] += 1
    return out


async def set_version(gw, wid: str, version: str) -> None:
    r = await gw.client.post(f"/v1/rl/workers/{wid}/version", json={"weight_version": version})
    assert r.status_code == 200, r.text


async def test_rolling_update_under_latest_only_never_dispatches_to_a_stale_worker():
    async with (
        fake_fleet("sglang", n=3) as fleet,
        gateway_in_process(cfg("latest-only"), worker_urls=fleet.urls) as gw,
    ):
        a, b, c = (gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls)
        assert set(await routed(gw)) == {a, b, c}  # nothing versioned: all eligible
        r = await gw.client.post(
            "/v1/rl/version", params={"selector": "engine=sglang"}, json={"weight_version": "1"}
        )
        assert r.status_code == 200
        assert set(await routed(gw)) == {a, b, c}
        await set_version(gw, a, "2")  # a is ahead: b and c are stale now
        assert set(await routed(gw)) == {a}
        # A proxied update_weight_version (passthrough observation) brings b up.
        r = await gw.client.post(
            f"/v1/rl/workers/{b}/engine/update_weight_version", json={"new_version": "2"}
        )
        assert r.status_code == 200, r.text
        assert set(await routed(gw)) == {a, b}
        r = await gw.client.post(
            "/v1/rl/version", params={"selector": "engine=sglang"}, json={"weight_version": "2"}
        )
        assert set(await routed(gw)) == {a, b, c}
        sources = {w["version_source"] for w in (await gw.client.get("/v1/rl/workers")).json()["workers"]}
        assert sources == {"api"}


async def test_header_override_and_invalid_header():
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        a, b = (gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls)
        await set_version(gw, a, "5")
        await set_version(gw, b, "4")
        assert set(await routed(gw)) == {a, b}  # default policy any
        assert set(await routed(gw, headers={"x-smg-version-policy": " latest-only "})) == {a}
        assert set(await routed(gw, headers={"x-smg-version-policy": "max-staleness:1"})) == {a, b}
        assert set(await routed(gw, headers={"x-smg-version-policy": "min-version:5"})) == {a}
        r = await gw.client.post("/generate", json=GEN, headers={"x-smg-version-policy": "newest"})
        assert r.status_code == 400
        assert r.json()["error"] == "invalid_version_policy" and "newest" in r.json()["message"]
        assert fleet[0].calls_to("/generate") or fleet[1].calls_to("/generate")


async def test_flag_off_ignores_the_policy_header():
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(rl=False), worker_urls=fleet.urls) as gw,
    ):
        r = await gw.client.post("/generate", json=GEN, headers={"x-smg-version-policy": "newest"})
        assert r.status_code == 200


async def test_all_workers_ineligible_is_a_503_naming_stale_and_unversioned():
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg("min-version:10"), worker_urls=fleet.urls) as gw,
    ):
        a, _ = (gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls)
        await set_version(gw, a, "9")
        r = await gw.client.post("/generate", json=GEN)
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["code"] == "no_eligible_workers" and error["reasons"] == {"stale": 1, "unversioned": 1}
        await set_version(gw, a, "10")
        assert set(await routed(gw, 2)) == {a}


async def test_psrl_version_tag_is_a_floor_and_is_echoed():
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        a, b = (gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls)
        await set_version(gw, a, "3")
        await set_version(gw, b, "5")
        assert set(await routed(gw, headers={"x-version-tag": "4"})) == {b}
        assert set(await routed(gw, headers={"x-version-tag": "-1"})) == {a, b}
        for _ in range(4):
            r = await gw.client.post(
                "/generate", json={**GEN, "stream": True}, headers={"x-version-tag": "-1"}
            )
            expected = "3" if r.headers["x-smgrl-worker-id"] == a else "5"
            assert r.headers["x-version-tag"] == expected
        # A floor above every engine while no sync is in progress: answered at once, named.
        r = await gw.client.post("/generate", json=GEN, headers={"x-version-tag": "6"})
        error = r.json()["error"]
        assert r.status_code == 503 and error["code"] == "version_floor_unmet", error
        assert error["reasons"] == {"stale": 2} and {e["reason"] for e in error["engines"]} == {"stale"}
        r = await gw.client.post("/generate", json=GEN, headers={"x-version-tag": "bad tag"})
        assert r.status_code == 400 and r.json()["error"] == "invalid_version_policy"


async def test_a_request_waits_for_an_engine_at_the_latest_version():
    """latest-only during a refit: the newest engine is paused, so the request waits for it."""
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg("latest-only", wait=None), worker_urls=fleet.urls) as gw,
    ):
        a, b = (gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls)
        await set_version(gw, b, "1")
        await set_version(gw, a, "2")
        await gw.client.post(f"/v1/rl/workers/{a}/state", json={"control": "paused"})
        result = []

        async def rollout():
            result.append(await gw.client.post("/generate", json=GEN))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(rollout)
                while gw.app.dataplane.waiting < 1:
                    await trio.sleep(0.001)
                await gw.client.post(f"/v1/rl/workers/{a}/state", json={"control": "active"})
        assert result[0].status_code == 200 and result[0].headers["x-smgrl-worker-id"] == a


@pytest.mark.parametrize("policy", ["newest", "min-version:", "max-staleness:x"])
def test_an_invalid_launch_policy_is_refused(policy):
    with pytest.raises(ConfigError, match="--rl-version-policy"):
        validate(attrs.evolve(cfg(), rl=RlConfig(enabled=True, version_policy=policy)))


async def test_a_request_waiting_for_a_version_floor_is_visible_and_its_503_names_why(caplog):
    # While a sync is in progress (one engine paused) a floor no engine meets yet waits (PSRL's
    # loops rely on it), counted by reason, logged when it starts; its 503 names the floor, the
    # versions the fleet has and why each engine was held out.
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg(wait=1), worker_urls=fleet.urls) as gw,
    ):
        a, b = (gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls)
        await set_version(gw, a, "3")
        await set_version(gw, b, "5")
        await gw.client.post(f"/v1/rl/workers/{b}/state", json={"control": "paused"})
        dp = gw.app.dataplane
        result = []

        async def rollout():
            result.append(await gw.client.post("/generate", json=GEN, headers={"x-version-tag": "6"}))

        with caplog.at_level(logging.INFO, logger="smgrl.dataplane"), trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(rollout)
                while dp.waiting < 1:
                    await trio.sleep(0.001)
                text = gw.gateway.metrics.render().decode()
                assert 'smgrl_dataplane_waiting_requests_by_reason{reason="paused"} 1.0' in text
                logged = [r.getMessage() for r in caplog.records if "waits for an eligible" in r.getMessage()]
                assert len(logged) == 1 and "1 stale" in logged[0] and "3, 5" in logged[0]
        r = result[0]
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["code"] == "no_eligible_workers"
        assert error["reasons"] == {"paused": 1, "stale": 1} and error["versions"] == ["3", "5"]
        assert "x-version-tag 6" in error["message"] and "versions 3, 5" in error["message"]
        held = {e["worker_id"]: e["reason"] for e in error["engines"]}
        assert held == {a: "stale", b: "paused"}
        assert dp.waiting == 0 and "waiting_requests_by_reason{" not in gw.gateway.metrics.render().decode()

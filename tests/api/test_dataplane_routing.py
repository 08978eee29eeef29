"""Policies through the gateway: --policy, x-smg-routing-key, --dp-aware."""

from __future__ import annotations

from collections import Counter

import attrs
import pytest

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}


def cfg(policy: str, **kw) -> Config:
    return Config(rl=RlConfig(enabled=True), policy=policy, **kw)


async def routed(gw, body=GEN, headers=None) -> str:
    r = await gw.client.post("/generate", json=body, headers=headers or {})
    assert r.status_code == 200, r.text
    return r.headers["x-smgrl-worker-id"]


async def test_round_robin_visits_every_engine_in_turn():
    async with (
        fake_fleet("sglang", n=3) as fleet,
        gateway_in_process(cfg("round_robin"), worker_urls=fleet.urls) as gw,
    ):
        picks = [await routed(gw) for _ in range(6)]
        assert picks[:3] == picks[3:] and len(set(picks)) == 3
        assert [len(e.calls_to("/generate")) for e in fleet] == [2, 2, 2]


@pytest.mark.parametrize("policy", ["random", "power_of_two", "cache_aware"])
async def test_policies_spread_load(policy):
    async with (
        fake_fleet("sglang", n=3) as fleet,
        gateway_in_process(cfg(policy), worker_urls=fleet.urls) as gw,
    ):
        picks = Counter()
        for i in range(30):
            picks[await routed(gw, {**GEN, "text": f"{i} distinct prompt {i * 7919}"})] += 1
        assert len(picks) == 3
        assert gw.app.dataplane.loads == dict.fromkeys(picks, 0)  # every in-flight count went back


async def test_cache_aware_keeps_a_shared_prefix_together():
    async with (
        fake_fleet("sglang", n=3) as fleet,
        gateway_in_process(cfg("cache_aware"), worker_urls=fleet.urls) as gw,
    ):
        system = "You are a careful math tutor. Think step by step and show your work. " * 3
        picks = {await routed(gw, {**GEN, "text": system + f"Problem {i}"}) for i in range(10)}
        assert len(picks) == 1
        chat = {
            "model": "fake/Qwen3-0.6B",
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
            "max_tokens": 1,
        }
        r1 = await gw.client.post("/v1/chat/completions", json=chat)
        r2 = await gw.client.post(
            "/v1/chat/completions",
            json={**chat, "messages": [*chat["messages"][:1], {"role": "user", "content": "yo"}]},
        )
        assert r1.headers["x-smg-routed-worker-id"] == r2.headers["x-smg-routed-worker-id"]


async def test_routing_key_is_sticky_on_any_policy():
    async with (
        fake_fleet("sglang", n=4) as fleet,
        gateway_in_process(cfg("round_robin"), worker_urls=fleet.urls) as gw,
    ):
        for key in ("trajectory-1", "trajectory-2", "trajectory-3"):
            picks = {await routed(gw, headers={"x-smg-routing-key": key}) for _ in range(5)}
            assert len(picks) == 1
        keyed = {await routed(gw, headers={"x-smg-routing-key": f"k{i}"}) for i in range(40)}
        assert len(keyed) > 1  # different keys still spread


async def test_dp_aware_routes_to_worker_and_rank():
    config = cfg("round_robin", dp_aware=True)
    async with (
        fake_fleet("sglang", n=2, dp_size=2) as fleet,
        gateway_in_process(config, worker_urls=fleet.urls) as gw,
    ):
        await gw.wait_visible(4)
        registry = gw.gateway.fleet.registry
        by_id = {w.id: w for w in registry}
        picks = [await routed(gw) for _ in range(4)]
        assert len(set(picks)) == 4  # four (worker, rank) instances
        ranks = Counter()
        for engine in fleet:
            for call in engine.calls_to("/generate"):
                ranks[(engine.url, call.json_body()["data_parallel_rank"])] += 1
        assert ranks == {(url, rank): 1 for url in fleet.urls for rank in (0, 1)}
        # The routed worker id names the rank's registry record, the SMG header its URL.
        assert {by_id[p].dp_rank for p in picks} == {0, 1}
        r = await gw.client.post("/generate", json=GEN)
        assert r.headers["x-smg-routed-worker-id"] == by_id[r.headers["x-smgrl-worker-id"]].url
        assert "@" in r.headers["x-smg-routed-worker-id"]


async def test_cache_aware_tuning_flags_reach_the_policy():
    dp = DataPlaneConfig(
        cache_threshold=0.9, balance_abs_threshold=3, balance_rel_threshold=2.0, max_tree_size=1000
    )
    async with gateway_in_process(attrs.evolve(cfg("cache_aware"), dataplane=dp)) as gw:
        policy = gw.app.dataplane.policy
        assert (policy.config.cache_threshold, policy.config.balance_abs_threshold) == (0.9, 3)
        assert (policy.config.balance_rel_threshold, policy.config.max_tree_size) == (2.0, 1000)

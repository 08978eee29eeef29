"""PSRL routing headers, in process: each header's effect on where a rollout goes
and what the answer echoes (docs/data-plane.md, "PSRL routing")."""

from __future__ import annotations

from collections import Counter

import trio

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}


def cfg(dp_aware: bool = False) -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        dp_aware=dp_aware,
        # Prompt-group pins are a switch (off by default, as in PSRL's fork): these tests are about them.
        dataplane=DataPlaneConfig(eligible_wait_secs=0, psrl_group_sticky=True),
    )


async def post(gw, headers=None, body=GEN):
    r = await gw.client.post("/generate", json=body, headers=headers or {})
    assert r.status_code == 200, r.text
    return r


async def where(gw, n: int, headers=None) -> Counter:
    out = Counter()
    for _ in range(n):
        out[(await post(gw, headers)).headers["x-base-worker-id"]] += 1
    return out


async def test_prompt_group_pins_while_the_group_runs_and_releases_after():
    async with (
        fake_fleet("sglang", n=3, token_latency_ms=2) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        served: dict[str, Counter] = {"g": Counter(), "plain": Counter()}

        async def one(group: str) -> None:
            headers = {"x-prompt-id": group} if group == "g" else {}
            served[group][(await post(gw, headers)).headers["x-base-worker-id"]] += 1

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(one, "g")
                nursery.start_soon(one, "plain")
        assert len(served["g"]) == 1, served  # the whole group on one instance
        assert len(served["plain"]) == 3, served  # round robin without a group
        groups = gw.app.dataplane.groups
        assert len(groups) == 0 and groups.running("g") == 0  # released with the last request


async def test_sticky_hint_pins_to_the_instance_and_a_bare_hint_does_not():
    async with (
        fake_fleet("sglang", n=3) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        target = gw.gateway.fleet.registry.id_for_url(fleet.urls[1])
        hint = {"x-base-worker-id": target, "x-target-dp-rank": "0"}
        assert await where(gw, 6, {**hint, "x-is-sticky": "true"}) == {target: 6}
        assert await where(gw, 6, {**hint, "x-force-pin-once": "1"}) == {target: 6}
        assert len(await where(gw, 6, hint)) == 3  # not opted in: the policy decides
        # The hint by body field, and by the engine's URL.
        body = {**GEN, "rollout_instance_id": [fleet.urls[1], 0], "is_sticky": True}
        assert (await post(gw, body=body)).headers["x-base-worker-id"] == target


async def test_version_tag_sorts_and_the_first_commit_pins_the_version():
    async with (
        fake_fleet("sglang", n=3) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        ids = [gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls]
        for wid, version in zip(ids, ("1", "2", "3"), strict=True):
            r = await gw.client.post(f"/v1/rl/workers/{wid}/version", json={"weight_version": version})
            assert r.status_code == 200, r.text
        r = await post(gw, {"x-prompt-id": "p"})  # unversioned: newest first, pinned and echoed
        assert (r.headers["x-base-worker-id"], r.headers["x-target-dp-rank"]) == (ids[2], "0")
        assert r.headers["x-version-tag"] == "3"
        r = await post(gw, {"x-prompt-id": "q", "x-version-tag": "2"})  # lowest acceptable first
        assert r.headers["x-base-worker-id"] == ids[1] and r.headers["x-version-tag"] == "2"
        r = await post(gw, body={**GEN, "prompt_id": "q", "version_tag": 1})
        assert r.headers["x-base-worker-id"] == ids[0] and r.headers["x-version-tag"] == "1"
        # Without routing metadata the plain path is unchanged: the floor, then round robin,
        # echoing the serving engine's version.
        plain = await where(gw, 6, {"x-version-tag": "2"})
        assert set(plain) == {ids[1], ids[2]}


async def test_dp_aware_hint_names_worker_and_rank():
    async with (
        fake_fleet("sglang", n=2, dp_size=2) as fleet,
        gateway_in_process(cfg(dp_aware=True), worker_urls=fleet.urls) as gw,
    ):
        await gw.wait_visible(4)
        (base,) = {w.group or w.id for w in gw.gateway.fleet.registry if w.base_url == fleet.urls[0]}
        for rank in (0, 1):
            headers = {"x-base-worker-id": base, "x-target-dp-rank": str(rank), "x-is-sticky": "1"}
            for _ in range(3):
                r = await post(gw, headers)
                assert r.headers["x-smg-routed-worker-id"] == f"{fleet.urls[0]}@{rank}"
                assert (r.headers["x-base-worker-id"], r.headers["x-target-dp-rank"]) == (base, str(rank))


async def test_bad_routing_metadata_is_a_400_with_a_stable_code():
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        for headers, body in [
            ({"x-is-sticky": "sometimes"}, GEN),
            ({"x-base-worker-id": "w"}, GEN),
            ({}, {**GEN, "rollout_instance_id": "w"}),
        ]:
            r = await gw.client.post("/generate", json=body, headers=headers)
            assert r.status_code == 400, r.text
            assert r.headers["x-smg-error-code"] == "invalid_routing_metadata"
            assert r.json()["error"]["code"] == "invalid_routing_metadata"
        assert not fleet.engines[0].calls_to("/generate")


async def test_a_repeated_routing_header_is_read_by_its_first_occurrence():
    # As every other header of a raw scope (smgrl/http/fronts/asgi.py, ``header``) and Quart's headers.get.
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        bad_first = [("x-is-sticky", "sometimes"), ("x-is-sticky", "1")]
        r = await gw.client.post("/generate", json=GEN, headers=bad_first)
        assert r.status_code == 400, r.text
        assert r.headers["x-smg-error-code"] == "invalid_routing_metadata"
        r = await gw.client.post("/generate", json=GEN, headers=list(reversed(bad_first)))
        assert r.status_code == 200, r.text


async def test_an_x_request_id_smg_accepts_is_never_refused():
    # Found by smg-diff against SMG 1.13.0: a rollout whose x-request-id was over 128 characters,
    # held a tab or a non-ASCII byte got 400 invalid_routing_metadata; SMG serves it (an id over
    # 128 characters replaced by a generated one, any other echoed). The request id names the
    # request; it never routes it, so it is never a reason to refuse one.
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        for rid, echoed in [
            ("r" * 200, None),
            ("a\tb", "a\tb"),
            ("\xe9t\xe9", "\xe9t\xe9"),
            ("ok-1", "ok-1"),
        ]:
            r = await gw.client.post("/generate", json=GEN, headers={"x-request-id": rid.encode("latin-1")})
            assert r.status_code == 200, (rid, r.text)
            got = r.headers.raw[[k.lower() for k, _ in r.headers.raw].index(b"x-request-id")][1]
            if echoed is None:
                assert got.startswith(b"gnt-") and len(got) == 28
            else:
                assert got == echoed.encode("latin-1")
        r = await gw.client.post("/generate", json={**GEN, "request_id": {"not": "an id"}})
        assert r.status_code == 200, r.text

"""The fan-out `GET|POST|HEAD /v1/rl/engine/{path}?selector=` (docs/rl-control-plane.md,
"Fan-out", "Selectors"; SMG 1.13.0's observed answers, DP-aware included)."""

from __future__ import annotations

import pytest
import trio
from rl_api_helpers import (
    MS,
    assert_json,
    assert_text,
    engine_for,
    rl_cfg,
    rl_error,
    row_ids,
    sent_headers,
)

from smgrl.core.config import Config, RlConfig
from smgrl.fake import fake_fleet
from smgrl.registry.service import Registration
from smgrl.testing import gateway_in_process

OP_HEADERS = {"content-type", "content-length", "x-request-id", "x-smgrl-operation-id"}
ERR_HEADERS = {"content-type", "content-length", "x-request-id"}
PAUSED = {"message": "Generation paused successfully.", "status": "ok"}


def outcome(wid, url, status, body):
    return {"worker_id": wid, "url": url, "status": status, "latency_ms": MS, "body": body}


async def rows(gw) -> list[dict]:
    return (await gw.client.get("/v1/rl/workers")).json()["workers"]


async def test_all_success_is_200_and_each_engine_is_called_once_with_the_same_request(rl_config):
    async with fake_fleet("sglang", 3) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        listed = await rows(gw)
        fleet.clear_calls()
        r = await gw.client.post(
            "/v1/rl/engine/pause_generation?mode=x&selector=engine%3Dsglang&&y=%7E",
            content=b'{"mode":"abort"}',
            headers={"x-request-id": "rid", "traceparent": "tp"},
        )
        results = {
            w["id"]: outcome(w["id"], w["url"], 200, PAUSED) for w in sorted(listed, key=lambda w: w["id"])
        }
        assert_json(r, 200, {"results": results, "failed": [], "total": 3, "succeeded": 3}, OP_HEADERS)
        for e in fleet.engines:
            (call,) = list(e.calls)
            assert (call.method, call.path, call.query, call.body) == (
                "POST",
                "/pause_generation",
                "mode=x&y=%7E",
                b'{"mode":"abort"}',
            )
            assert sent_headers(call) == {
                "accept": "*/*",
                "content-length": "16",
                "content-type": "application/json",
                "x-request-id": "rid",
                "traceparent": "tp",
            }
        for e in fleet.engines:
            e.paused = None


async def test_partial_failure_is_207_with_sorted_results_and_failed():
    async with (
        fake_fleet("sglang", 4) as fleet,
        gateway_in_process(rl_cfg(timeout=1), worker_urls=fleet.urls) as gw,
    ):
        listed = sorted(await rows(gw), key=lambda w: w["id"])
        ok, err500, down, slow = listed
        engine_for(fleet, err500["url"]).set_knobs(force_status=500, force_body='{"x":1}')
        engine_for(fleet, down["url"]).go_down(30)
        engine_for(fleet, slow["url"]).set_knobs(hang=True)
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
        flushed = (
            "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
            "waiting requests, the operation will not be performed.)\n"
        )
        expected = {
            "results": {
                ok["id"]: outcome(ok["id"], ok["url"], 200, flushed),
                err500["id"]: outcome(err500["id"], err500["url"], 500, {"x": 1}),
            },
            "failed": [
                {
                    "worker_id": err500["id"],
                    "url": err500["url"],
                    "error": "upstream_error",
                    "message": "HTTP 500",
                    "status": 500,
                },
                {
                    "worker_id": down["id"],
                    "url": down["url"],
                    "error": "upstream_unreachable",
                    "message": f"upstream `{down['url']}` unreachable: error sending request for url "
                    f"({down['url']}/flush_cache)",
                },
                {
                    "worker_id": slow["id"],
                    "url": slow["url"],
                    "error": "upstream_timeout",
                    "message": f"upstream `{slow['url']}` timed out after 1s",
                },
            ],
            "total": 4,
            "succeeded": 1,
        }
        assert_json(r, 207, expected, OP_HEADERS)


async def test_concurrency_is_capped():
    async with (
        fake_fleet("sglang", 6) as fleet,
        gateway_in_process(rl_cfg(concurrency=2), worker_urls=fleet.urls) as gw,
    ):
        for e in fleet.engines:
            e.set_knobs(latency_ms=50)  # after registration: the probe is not slowed down
        fleet.clear_calls()
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
        assert r.status_code == 200 and r.json()["succeeded"] == 6
        assert fleet.peak_concurrency == 2


async def test_each_call_has_its_own_deadline():
    # One call at a time under a 1 s per-call timeout. Every engine would hang; the first one
    # called does, and the test frees the others the moment that call arrives. So the later calls
    # wait in the queue for the first one's whole deadline, then answer at once: they succeed
    # only if each deadline starts with its own call (a deadline shared by the fan-out would have
    # expired before they began).
    async with (
        fake_fleet("sglang", 3) as fleet,
        gateway_in_process(rl_cfg(timeout=1, concurrency=1), worker_urls=fleet.urls) as gw,
    ):
        fleet.clear_calls()
        for e in fleet.engines:
            e.set_knobs(hang=True)
        answers = []

        async def fan_out():
            answers.append(await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang"))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fan_out)
            with trio.fail_after(30):
                while not any(e.calls_to("/flush_cache") for e in fleet.engines):
                    await trio.sleep(0.005)
            (first,) = [e for e in fleet.engines if e.calls_to("/flush_cache")]
            for e in fleet.engines:
                if e is not first:
                    e.set_knobs(hang=False)
        (r,) = answers
        body = r.json()
        assert r.status_code == 207 and body["succeeded"] == 2, body
        assert [(f["url"], f["error"]) for f in body["failed"]] == [(first.url, "upstream_timeout")]


SELECTOR_ERRORS = [
    # (path, query) -> (status, body) ; precedence selector -> path -> match
    (
        "a/b/c/d/e",
        "",
        400,
        rl_error("selector_required", "a non-empty `selector` query parameter is required"),
    ),
    (
        "a/b/c/d/e",
        "selector=",
        400,
        rl_error("selector_required", "a non-empty `selector` query parameter is required"),
    ),
    (
        "a/b/c/d/e",
        "selector=+%09%0A",
        400,
        rl_error("selector_required", "a non-empty `selector` query parameter is required"),
    ),
    (
        "a/b/c/d/e",
        "selector",
        400,
        rl_error("selector_required", "a non-empty `selector` query parameter is required"),
    ),
    (
        "a/b/c/d/e",
        "selector=engine%3D%3D",
        400,
        rl_error("invalid_selector", "invalid selector at byte 7: expected value after `=`", offset=7),
    ),
    (
        "a/b/c/d/e",
        "selector=engine%3Dsglang",
        400,
        rl_error("invalid_engine_path", "invalid engine path: path has more than 4 segments"),
    ),
    (
        "flush_cache",
        "selector=engine%3Dvllm",
        400,
        rl_error("no_workers_match", "no workers match selector `engine=vllm`", selector="engine=vllm"),
    ),
    (
        "flush_cache",
        "selector=++engine",
        400,
        rl_error(
            "invalid_selector",
            "invalid selector at byte 6: expected operator (`=`, `!=`, `in`, `notin`)",
            offset=6,
        ),
    ),
    (
        "flush_cache",
        "selector=%ZZ",
        400,
        rl_error("invalid_selector", "invalid selector at byte 0: expected key", offset=0),
    ),
    (
        "flush_cache",
        "selector=engine%3D%FF",
        400,
        rl_error("no_workers_match", "no workers match selector `engine=\ufffd`", selector="engine=\ufffd"),
    ),
    (
        "flush_cache",
        "selector=engine+in+(vllm,+trtllm)",
        400,
        rl_error(
            "no_workers_match",
            "no workers match selector `engine in (vllm, trtllm)`",
            selector="engine in (vllm, trtllm)",
        ),
    ),
    (
        "flush_cache",
        "selector=engine%3Dsglang,engine%3Dvllm",
        400,
        rl_error(
            "no_workers_match",
            "no workers match selector `engine=sglang,engine=vllm`",
            selector="engine=sglang,engine=vllm",
        ),
    ),
    (
        "flush_cache",
        "selector=control_url%3Dx",
        400,
        rl_error("no_workers_match", "no workers match selector `control_url=x`", selector="control_url=x"),
    ),
]


@pytest.mark.parametrize("path,query,status,body", SELECTOR_ERRORS)
async def test_fanout_errors_and_their_precedence(rl_config, path, query, status, body):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        fleet.clear_calls()
        r = await gw.client.post(f"/v1/rl/engine/{path}?{query}")
        headers = OP_HEADERS if body["error"] == "no_workers_match" else ERR_HEADERS
        assert_json(r, status, body, headers)
        assert list(fleet.engines[0].calls) == []


async def test_duplicate_selector_is_a_plain_400(rl_config):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        for query in ("selector=a&selector=b", "selector=engine%3Dsglang&sel%65ctor=x", "selector&selector"):
            r = await gw.client.post(f"/v1/rl/engine/a/b/c/d/e?{query}")
            assert_text(r, 400, "Failed to deserialize query string: duplicate field `selector`", ERR_HEADERS)


async def test_selector_plus_is_a_space_and_matches(rl_config):
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        for query in (
            "selector=engine+%3D+sglang",
            "selector=%20engine%3Dsglang%20",
            "sel%65ctor=engine%3Dsglang",
            "selector=engine+in+(sglang,vllm),health%3Dready",
        ):
            r = await gw.client.post(f"/v1/rl/engine/flush_cache?{query}")
            assert r.status_code == 200 and r.json()["total"] == 2, query


async def test_head_fanout(rl_config):
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        fleet.clear_calls()
        r = await gw.client.head("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
        assert r.status_code == 200 and r.content == b""
        assert r.headers["content-type"] == "application/json" and int(r.headers["content-length"]) > 0
        assert sorted(c.method for e in fleet.engines for c in e.calls) == ["HEAD", "HEAD"]


async def test_no_implicit_health_or_type_filter(rl_config):
    async with (
        fake_fleet("sglang", 3) as fleet,
        gateway_in_process(rl_config, worker_urls=fleet.urls[:2]) as gw,
    ):
        a, b = await row_ids(gw)
        await gw.gateway.registry.set_health(gw.gateway.fleet.registry.get(a), "not_ready", "test")
        prefill = await gw.gateway.registry.register(
            Registration(url=fleet.urls[2], worker_type="prefill"), "api"
        )
        await gw.wait_visible(3)
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
        assert r.status_code == 200 and sorted(r.json()["results"]) == sorted([a, b, prefill.id])
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=health%3Dready,worker_type%3Dregular")
        assert sorted(r.json()["results"]) == [b]
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=health!%3Dready")
        assert sorted(r.json()["results"]) == [a]


async def test_the_same_selector_follows_every_change_of_the_fleet(rl_config):
    """Targets are kept per selector and projection revision (ControlService.targets): a health
    change, a new worker and a removal each change what the same selector text matches."""
    path = "/v1/rl/engine/flush_cache?selector=health%3Dready"
    async with (
        fake_fleet("sglang", 3) as fleet,
        gateway_in_process(rl_config, worker_urls=fleet.urls[:2]) as gw,
    ):
        a, b = await row_ids(gw)
        assert sorted((await gw.client.post(path)).json()["results"]) == sorted([a, b])
        await gw.gateway.registry.set_health(gw.gateway.fleet.registry.get(a), "not_ready", "test")
        assert sorted((await gw.client.post(path)).json()["results"]) == [b]
        c = await gw.gateway.registry.register(Registration(url=fleet.urls[2]), "api")
        await gw.wait_visible(3)
        await gw.gateway.registry.set_health(gw.gateway.fleet.registry.get(c.id), "ready", "test")
        assert sorted((await gw.client.post(path)).json()["results"]) == sorted([b, c.id])
        assert (await gw.client.delete(f"/workers/{b}")).status_code in (200, 202, 204)
        assert sorted((await gw.client.post(path)).json()["results"]) == [c.id]


async def test_dp_ranks_are_one_target_per_engine():
    cfg = Config(rl=RlConfig(enabled=True), dp_aware=True)
    async with fake_fleet("sglang", 2, dp_size=2) as fleet, gateway_in_process(cfg) as gw:
        await gw.register(fleet.urls)
        rank = {w.url: w.id for w in gw.gateway.fleet.registry}
        listed = await rows(gw)
        fleet.clear_calls()
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
        assert r.status_code == 200 and sorted(r.json()["results"]) == sorted(w["id"] for w in listed)
        assert [len(e.calls_to("/flush_cache")) for e in fleet.engines] == [1, 1]
        base = fleet.engines[0].url
        for selector, matched in (
            (f"url={base}@0", [rank[f"{base}@0"]]),
            (f"base_url={base}", [rank[f"{base}@0"]]),
            (f"id={rank[base + '@0']}", [rank[f"{base}@0"]]),
            (f"url={base}@1", []),
            (f"id={rank[base + '@1']}", []),
            (f"url={base}", []),
            ("dp_size=2", None),
        ):
            r = await gw.client.post("/v1/rl/engine/flush_cache", params={"selector": selector})
            if matched == []:
                assert_json(
                    r,
                    400,
                    rl_error(
                        "no_workers_match", f"no workers match selector `{selector}`", selector=selector
                    ),
                )
            else:
                got = sorted(r.json()["results"])
                assert got == (matched if matched is not None else sorted(w["id"] for w in listed))
        # A per-worker call with a rank-1 id answers as rank 1 and reaches the shared engine once.
        fleet.clear_calls()
        r = await gw.client.post(f"/v1/rl/workers/{rank[base + '@1']}/engine/flush_cache")
        assert r.json()["worker_id"] == rank[f"{base}@1"] and r.json()["url"] == f"{base}@1"
        assert len(fleet.engines[0].calls_to("/flush_cache")) == 1

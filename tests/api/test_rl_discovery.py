"""Discovery (`GET /v1/rl/workers`, `GET /v1/rl/workers/{id}`) and the routing envelopes around
`/v1/rl` (docs/rl-control-plane.md, "Discovery"; SMG 1.13.0's observed rows, DP-aware included)."""

from __future__ import annotations

import pytest
import trio
from rl_api_helpers import (
    assert_generated_id,
    assert_json,
    assert_text,
    openai_error,
    rl_cfg,
    rl_error,
    row_ids,
)

from smgrl.core.config import Config, RlConfig
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

SGLANG_CAPS = {
    "source": "static",
    "pause_modes": ["abort", "retract", "in_place"],
    "update_from": ["disk", "tensor", "distributed"],
    "abort": True,
    "flush_cache": True,
    "sleep_wake": True,
    "reports_weight_version": True,
}
# smgrl's additions (new fields only, after SMG's): the journal's view of the engine.
SMGRL_EXTRA = {"version_source": None, "control": "active", "version_status": "consistent"}
ROW_HEADERS = {"content-type", "content-length", "x-request-id"}


def labels_of(engine, dp: int = 1) -> dict:
    """The labels SMG 1.13.0 derives from a fake SGLang 0.5.23 engine, in smgrl's order."""
    return {
        "model_path": engine.model_path,
        "tokenizer_path": engine.model_path,
        "served_model_name": "fake/Qwen3-0.6B",
        "tp_size": "1",
        "dp_size": str(dp),
        "pp_size": "1",
        "attn_dp_size": "1",
        "load_balance_method": "round_robin",
        "version": "0.5.23",
        "weight_version": "default",
        "is_embedding": "false",
        "enable_dp_attention": "false",
        "has_image_understanding": "false",
        "has_audio_understanding": "false",
        "is_generation": "true",
        "architectures": '["Qwen3ForCausalLM"]',
        "model_type": "qwen3",
        "max_model_len": "40960",
    }


def expected_row(wid: str, engine, *, url: str | None = None, dp: int = 1, dp_ranks: int = 1) -> dict:
    return {
        "id": wid,
        "url": url or engine.url,
        "base_url": engine.url,
        "engine": "sglang",
        "engine_version": "0.5.23",
        "model_id": "fake/Qwen3-0.6B",
        "worker_type": "regular",
        "connection_mode": "http",
        "control_url": engine.url,
        "tp_size": 1,
        "dp_size": dp,
        "pp_size": 1,
        "dp_ranks": dp_ranks,
        "role": None,
        "health": "ready",
        "weight_version": "default",
        "labels": labels_of(engine, dp),
        "capabilities": SGLANG_CAPS,
        **SMGRL_EXTRA,
    }


async def test_list_rows_every_field_sorted_by_base_url(rl_config):
    async with fake_fleet("sglang", 3) as fleet, gateway_in_process(rl_config) as gw:
        ids = await gw.register(fleet.urls)
        by_url = dict(zip(fleet.urls, ids))
        engines = sorted(fleet.engines, key=lambda e: e.url)
        r = await gw.client.get("/v1/rl/workers")
        rows = [expected_row(by_url[e.url], e) for e in engines]
        assert_json(r, 200, {"protocol_version": 1, "workers": rows, "total": 3}, ROW_HEADERS)
        assert_generated_id(r)
        # One row = exactly that registry entry; the query is ignored on discovery.
        for e in engines:
            one = await gw.client.get(f"/v1/rl/workers/{by_url[e.url]}?selector=engine%3Dvllm")
            assert_json(one, 200, expected_row(by_url[e.url], e), ROW_HEADERS)
        filtered = await gw.client.get("/v1/rl/workers?selector=engine%3Dvllm")
        assert filtered.content == r.content


async def test_empty_registry_lists_nothing(rl_config):
    async with gateway_in_process(rl_config) as gw:
        r = await gw.client.get("/v1/rl/workers")
        assert_json(r, 200, {"protocol_version": 1, "workers": [], "total": 0}, ROW_HEADERS)


async def test_dp_aware_collapses_ranks_and_a_rank_id_returns_its_own_row():
    # SMG 1.13.0 makes dp_size x attn_dp_size ranks of an SGLang engine (observed); the fake
    # reports attn_dp_size 1 without DP attention, as SGLang does: 2 ranks per engine.
    cfg = Config(rl=RlConfig(enabled=True), dp_aware=True)
    async with fake_fleet("sglang", 2, dp_size=2) as fleet, gateway_in_process(cfg) as gw:
        await gw.register(fleet.urls)
        workers = list(gw.gateway.fleet.registry)
        assert len(workers) == 4
        rank = {w.url: w.id for w in workers}
        engines = sorted(fleet.engines, key=lambda e: e.url)
        r = await gw.client.get("/v1/rl/workers")
        rows = [expected_row(rank[f"{e.url}@0"], e, url=f"{e.url}@0", dp=2, dp_ranks=2) for e in engines]
        assert_json(r, 200, {"protocol_version": 1, "workers": rows, "total": 2}, ROW_HEADERS)
        e = engines[0]
        for n in range(2):
            one = await gw.client.get(f"/v1/rl/workers/{rank[f'{e.url}@{n}']}")
            expected = expected_row(rank[f"{e.url}@{n}"], e, url=f"{e.url}@{n}", dp=2, dp_ranks=2)
            assert_json(one, 200, expected, ROW_HEADERS)


async def test_without_dp_aware_a_dp_engine_is_one_row_with_one_rank(rl_config):
    async with fake_fleet("sglang", 1, dp_size=2) as fleet, gateway_in_process(rl_config) as gw:
        (wid,) = await gw.register(fleet.urls)
        r = await gw.client.get("/v1/rl/workers")
        row = expected_row(wid, fleet.engines[0], dp=2, dp_ranks=1)
        assert_json(r, 200, {"protocol_version": 1, "workers": [row], "total": 1})


async def test_pending_worker_is_invisible(rl_config):
    # A registered URL nobody listens on stays pending: not listed, 404 by id, never selected.
    with trio.socket.socket() as s:
        await s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config) as gw:
        (ready,) = await gw.register(fleet.urls)
        (pending,) = await gw.register([dead], wait=False)
        assert gw.gateway.fleet.registry.get(pending).status == "pending"
        assert await row_ids(gw) == [ready]
        r = await gw.client.get(f"/v1/rl/workers/{pending}")
        assert_json(r, 404, rl_error("worker_not_found", f"worker `{pending}` not found", id=pending))
        r = await gw.client.post(f"/v1/rl/workers/{pending}/engine/flush_cache")
        assert_json(r, 404, rl_error("worker_not_found", f"worker `{pending}` not found", id=pending))
        r = await gw.client.post(f"/v1/rl/engine/flush_cache?selector=id%3D{pending}")
        sel = f"id={pending}"
        assert_json(r, 400, rl_error("no_workers_match", f"no workers match selector `{sel}`", selector=sel))
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=health%3Dpending")
        sel = "health=pending"
        assert_json(r, 400, rl_error("no_workers_match", f"no workers match selector `{sel}`", selector=sel))


async def test_unknown_worker_id(rl_config):
    async with gateway_in_process(rl_config) as gw:
        for raw, shown in (("nope", "nope"), ("a%20b", "a b"), ("%C3%A9", "é")):
            r = await gw.client.get(f"/v1/rl/workers/{raw}")
            assert_json(r, 404, rl_error("worker_not_found", f"worker `{shown}` not found", id=shown))


async def test_head_is_the_get_without_a_body(rl_config):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw)
        for path in ("/v1/rl/workers", f"/v1/rl/workers/{wid}"):
            get = await gw.client.get(path)
            head = await gw.client.head(path)
            assert head.status_code == 200 and head.content == b""
            assert head.headers["content-type"] == "application/json"
            assert head.headers["content-length"] == str(len(get.content))
        head = await gw.client.head("/v1/rl/workers/nope")
        assert head.status_code == 404 and head.content == b""
        assert head.headers["content-length"] == "76"


UNKNOWN = [
    "/v1/rl/workers/",
    "/v1/rl/",
    "/v1/rl",
    "/v1/rl/foo",
    "/v1/rl/engine/",
    "/v1/rl/workers/x/engine/",
    "/v1/rl/workers/x/engine",
    "/v1/rl/workers/x/other/y",
    "/v1/rl/Workers",
]


@pytest.mark.parametrize("path", UNKNOWN)
async def test_unknown_routes_are_the_unknown_url_envelope(rl_config, path):
    async with gateway_in_process(rl_config) as gw:
        for method in ("GET", "POST", "DELETE"):
            r = await gw.client.request(method, path + "?q=1")
            assert_json(
                r,
                404,
                openai_error("unknown_url", f"Invalid URL ({method} {path})"),
                {"content-type", "content-length", "x-request-id", "x-smg-error-code"},
            )
            assert r.headers["x-smg-error-code"] == "unknown_url"
            assert_generated_id(r)


METHODS_405 = [
    ("/v1/rl/workers", "GET,HEAD", ("POST", "PUT", "PATCH", "DELETE", "OPTIONS")),
    ("/v1/rl/workers/abc", "GET,HEAD", ("POST", "PUT", "DELETE")),
    ("/v1/rl/workers/abc/engine/flush_cache", "GET,HEAD,POST", ("PUT", "PATCH", "DELETE", "OPTIONS")),
    ("/v1/rl/engine/flush_cache", "GET,HEAD,POST", ("PUT", "PATCH", "DELETE", "OPTIONS")),
]


@pytest.mark.parametrize("path,allow,methods", METHODS_405)
async def test_wrong_method_is_405_with_allow_and_nothing_forwarded(rl_config, path, allow, methods):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        fleet.clear_calls()
        for method in methods:
            r = await gw.client.request(method, path + "?selector=engine%3Dsglang", content=b"{}")
            assert_json(
                r,
                405,
                openai_error("method_not_allowed", f"Invalid URL ({method} {path})"),
                {"content-type", "content-length", "x-request-id", "x-smg-error-code", "allow"},
            )
            assert r.headers["allow"] == allow
            assert r.headers["x-smg-error-code"] == "method_not_allowed"
        assert list(fleet.engines[0].calls) == []


async def test_payload_limit_is_checked_before_routing():
    cfg = rl_cfg(max_payload_size=100)
    async with gateway_in_process(cfg) as gw:
        big = b"x" * 101
        expected = openai_error(
            "request_body_too_large", "Request body exceeded the payload limit (max_payload_size)"
        )
        for method, path in (
            ("POST", "/v1/rl/workers/nope/engine/x"),
            ("POST", "/v1/rl/engine/a/b/c/d/e"),
            ("POST", "/v1/rl/foo"),
            ("GET", "/v1/rl/workers"),
        ):
            r = await gw.client.request(method, path, content=big)
            assert_json(
                r, 413, expected, {"content-type", "content-length", "x-request-id", "x-smg-error-code"}
            )
            assert r.headers["x-smg-error-code"] == "request_body_too_large"
        # A 405 route keeps its allow header on the 413 (as SMG's layers do).
        r = await gw.client.post("/v1/rl/workers", content=big)
        assert_json(r, 413, expected)
        assert r.headers["allow"] == "GET,HEAD"
        # Exactly the limit is fine.
        r = await gw.client.post("/v1/rl/workers/nope/engine/x", content=b"x" * 100)
        assert r.status_code == 404


async def test_chunked_body_over_the_limit_is_refused_when_read():
    cfg = rl_cfg(max_payload_size=100)

    async def chunks():
        for _ in range(3):
            yield b"x" * 50

    async with gateway_in_process(cfg) as gw:
        r = await gw.client.post("/v1/rl/workers/nope/engine/x", content=chunks())
        assert_text(r, 413, "Failed to buffer the request body: length limit exceeded")
        r = await gw.client.post("/v1/rl/engine/x", content=chunks())
        assert_text(r, 413, "Failed to buffer the request body: length limit exceeded")
        # The query is deserialised before the body is buffered; discovery never reads it.
        r = await gw.client.post("/v1/rl/engine/x?selector=a&selector=b", content=chunks())
        assert_text(r, 400, "Failed to deserialize query string: duplicate field `selector`")
        r = await gw.client.request("GET", "/v1/rl/workers", content=chunks())
        assert r.status_code == 200


async def test_disabled_rl_is_an_empty_404_and_workers_still_work():
    # D1: smgrl answers 404 with an EMPTY body (SMG 1.13.0: the unknown_url envelope).
    cfg = Config(rl=RlConfig(enabled=False))
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(cfg, worker_urls=fleet.urls) as gw:
        for method, path in (
            ("GET", "/v1/rl/workers"),
            ("POST", "/v1/rl/engine/flush_cache?selector=x"),
            ("DELETE", "/v1/rl/workers"),
            ("GET", "/v1/rl"),
            ("GET", "/v1/rl/foo"),
            ("HEAD", "/v1/rl/workers"),
        ):
            r = await gw.client.request(method, path)
            assert r.status_code == 404 and r.content == b"", (method, path)
            assert r.headers["content-length"] == "0"
            assert_generated_id(r)
        r = await gw.client.get("/workers")
        assert r.status_code == 200 and r.json()["total"] == 1
        assert b"smg_rl_" not in gw.gateway.metrics.render()
        assert list(fleet.engines[0].calls_to("/flush_cache")) == []

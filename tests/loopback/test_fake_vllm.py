"""The fake vLLM 0.33.0 engine (dev mode) against docs/engines.md (vLLM, checklist item 7)."""

from __future__ import annotations

import httpx
import pytest
import trio
import trio.testing

from smgrl.fake import fake_fleet, make_checkpoint

LONG = {"prompt": "a long story please", "max_tokens": 40_000, "ignore_eos": True}
SHORT = {"prompt": "hello world", "max_tokens": 6}


@pytest.fixture
async def vl():
    async with fake_fleet("vllm") as fleet, httpx.AsyncClient(base_url=fleet.urls[0], timeout=30) as client:
        yield fleet.engines[0], client


def start(nursery, client, path, body):
    box: dict = {}

    async def go():
        box["r"] = await client.post(path, json=body)

    nursery.start_soon(go)
    return box


async def generating(engine, n=1):
    with trio.fail_after(10):
        await engine.wait_until(lambda: sum(1 for j in engine.scheduler.jobs.values() if j.output_ids) >= n)


@pytest.mark.parametrize(
    ("method", "path", "status", "body"),
    [
        ("GET", "/health", 200, None),
        ("GET", "/version", 200, {"version": "0.33.0"}),
        ("GET", "/is_paused", 200, {"is_paused": False}),
        ("GET", "/is_sleeping", 200, {"is_sleeping": False}),
        ("GET", "/weight_info", 200, {"weight_version": "default"}),
        ("GET", "/get_world_size", 200, {"world_size": 1}),
        ("GET", "/load", 200, {"server_load": 0}),
        ("GET", "/server_info", 404, {"detail": "Not Found"}),
        ("GET", "/model_info", 404, {"detail": "Not Found"}),
        ("POST", "/reset_prefix_cache", 200, {"success": True}),
        ("GET", "/pause", 405, {"detail": "Method Not Allowed"}),
    ],
)
async def test_simple_routes(vl, method, path, status, body):
    _engine, c = vl
    r = await c.request(method, path)
    assert r.status_code == status
    if body is None:
        assert r.content == b""
    else:
        assert r.json() == body


async def test_world_size_counts_dp_unless_excluded():
    async with (
        fake_fleet("vllm", tp_size=2, dp_size=3) as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0]) as c,
    ):
        assert (await c.get("/get_world_size")).json() == {"world_size": 6}
        assert (await c.get("/get_world_size", params={"include_dp": "false"})).json() == {"world_size": 2}


async def test_dev_routes_need_dev_mode():
    async with fake_fleet("vllm", dev_mode=False) as fleet, httpx.AsyncClient(base_url=fleet.urls[0]) as c:
        assert (await c.post("/pause")).status_code == 404
        assert (await c.get("/weight_info")).status_code == 404
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/v1/models")).json()["data"][0]["owned_by"] == "vllm"


@pytest.mark.parametrize("query", ["mode=retract", "mode=in_place", "mode=abort&clear_cache=maybe"])
async def test_pause_validation(vl, query):
    engine, c = vl
    r = await c.post(f"/pause?{query}")
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == ("Bad Request", 400, None)
    assert engine.paused is None


@pytest.mark.parametrize("mode", ["abort", "wait"])
async def test_abort_and_wait_pauses_reject_new_requests_503(vl, mode):
    engine, c = vl
    engine.set_knobs(token_latency_ms=1)
    body = LONG if mode == "abort" else {**SHORT, "max_tokens": 40, "ignore_eos": True}
    async with trio.open_nursery() as nursery:
        gen = start(nursery, c, "/v1/completions", body)
        await generating(engine)
        r = await c.post(f"/pause?mode={mode}")
        assert r.json() == {"status": "paused"}
        assert engine.inflight == 0  # returns once drained
    finish = gen["r"].json()["choices"][0]["finish_reason"]
    assert finish == ("abort" if mode == "abort" else "length")
    for path, payload in [
        ("/v1/completions", SHORT),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ]:
        r = await c.post(path, json=payload)
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "ServiceUnavailableError"
    assert (await c.get("/is_paused")).json() == {"is_paused": True}
    assert (await c.get("/is_sleeping")).json() == {"is_sleeping": True}  # true when merely paused
    assert (await c.get("/health")).status_code == 200
    assert (await c.post("/resume")).json() == {"status": "resumed"}
    assert (await c.post("/v1/completions", json=SHORT)).status_code == 200


async def test_keep_pause_freezes_and_queues(vl):
    engine, c = vl
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        running = start(nursery, c, "/v1/completions", {**SHORT, "max_tokens": 30, "ignore_eos": True})
        await generating(engine)
        assert (await c.post("/pause", params={"mode": "keep"})).json() == {"status": "paused"}
        queued = start(nursery, c, "/v1/completions", SHORT)
        with trio.fail_after(10):
            await engine.wait_until(lambda: len(engine.calls_to("/v1/completions")) == 2)
        await trio.testing.wait_all_tasks_blocked(cushion=0.01)
        assert "r" not in running and "r" not in queued
        # Frozen requests hold their KV blocks: the prefix cache cannot be reset.
        assert (await c.post("/reset_prefix_cache")).json() == {"success": False}
        await c.post("/resume")
    assert running["r"].json()["choices"][0]["finish_reason"] == "length"
    assert queued["r"].status_code == 200


async def test_abort_requests(vl):
    engine, c = vl
    r = await c.post("/abort_requests")
    assert (r.status_code, r.json()) == (400, {"error": "Invalid JSON format"})
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        a = start(nursery, c, "/v1/completions", LONG)
        b = start(nursery, c, "/v1/completions", LONG)
        await generating(engine, 2)
        first = next(iter(engine.scheduler.jobs))
        r = await c.post("/abort_requests", json={"request_ids": [first]})
        assert r.json() == {"status": "aborted", "aborted": 1}
        with trio.fail_after(10):
            await engine.wait_until(lambda: engine.inflight == 1)
        assert (await c.post("/abort_requests", json={})).json() == {"status": "aborted", "aborted": 1}
    assert [x["r"].json()["choices"][0]["finish_reason"] for x in (a, b)] == ["abort", "abort"]


async def test_weight_transfer_session_misuse_is_500(vl):
    engine, c = vl
    init = {
        "init_info": {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 2}
    }
    update = {"update_info": {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[4]]}}
    steps = [
        ("/start_weight_update", None, 500),  # not initialised
        ("/init_weight_transfer_engine", {}, 400),  # init_info required
        ("/init_weight_transfer_engine", init, 200),
        ("/update_weights", update, 500),  # without start
        ("/finish_weight_update", None, 500),  # without start
        ("/start_weight_update", None, 200),
        ("/start_weight_update", None, 500),  # already active
        ("/shutdown_weight_transfer_engine", None, 500),  # during an active update
        ("/update_weights", update, 200),
        ("/update_weights", {"update_info": {"names": [], "dtype_names": [], "shapes": []}}, 200),  # reuse
        ("/finish_weight_update", {"weight_version": "w7"}, 200),
        ("/shutdown_weight_transfer_engine", None, 200),
    ]
    before = engine.weights_digest
    for path, body, status in steps:
        r = await c.post(path, json=body) if body is not None else await c.post(path)
        assert r.status_code == status, (path, r.text)
        if status == 500:
            assert r.json()["error"]["type"] == "InternalServerError"
    assert (await c.get("/weight_info")).json() == {"weight_version": "w7"}
    assert engine.weights_digest != before
    assert [u["names"] for u in engine.transfers.updates] == [["w"], ["w"]]


async def test_weight_transfer_not_configured():
    async with (
        fake_fleet("vllm", weight_transfer_backend=None) as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0]) as c,
    ):
        r = await c.post(
            "/init_weight_transfer_engine", json={"init_info": {"rank_offset": 1, "world_size": 2}}
        )
        assert r.status_code == 500
        assert r.json()["error"]["message"] == "Weight transfer not configured"


async def test_reload_weights_via_collective_rpc(vl, tmp_path):
    _engine, c = vl
    models = (await c.get("/v1/models")).json()
    old = (await c.post("/v1/completions", json=SHORT)).json()["choices"][0]["text"]
    ckpt = make_checkpoint(tmp_path / "ck", "m", seed=3)
    r = await c.post(
        "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(ckpt)}}
    )
    assert (r.status_code, r.json()) == (200, {"results": [None]})
    assert (await c.post("/v1/completions", json=SHORT)).json()["choices"][0]["text"] != old
    assert (await c.post("/update_weight_version", json={"new_version": "s3"})).json() == {
        "success": True,
        "new_version": "s3",
    }
    assert (await c.post("/update_weight_version", json={})).status_code == 400
    assert (await c.get("/weight_info")).json() == {"weight_version": "s3"}
    missing = await c.post(
        "/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(tmp_path / "x")}}
    )
    assert missing.status_code == 500
    assert (await c.post("/collective_rpc", json={"args": []})).status_code == 400
    after = (await c.get("/v1/models")).json()
    assert [m["id"] for m in after["data"]] == [m["id"] for m in models["data"]]  # never changes
    assert after["data"][0]["root"] == models["data"][0]["root"]


async def test_sleep_and_wake(vl):
    _engine, c = vl
    assert (await c.post("/sleep", params={"level": "3"})).status_code == 400
    assert (await c.post("/sleep", params={"level": "1"})).json() == {"status": "sleeping", "level": 1}
    assert (await c.get("/is_sleeping")).json() == {"is_sleeping": True}
    assert (await c.post("/v1/completions", json=SHORT)).status_code == 503
    r = await c.post("/wake_up", params={"tags": "weights"})
    assert r.json() == {"status": "sleeping", "tags": ["weights"]}
    assert (await c.get("/is_paused")).json() == {"is_paused": True}  # partial wake stays paused
    r = await c.post("/wake_up")
    assert r.json() == {"status": "awake", "tags": None}
    assert (await c.get("/is_paused")).json() == {"is_paused": False}
    assert (await c.get("/is_sleeping")).json() == {"is_sleeping": False}


async def test_level2_sleep_loses_weights_until_reload(vl):
    _engine, c = vl
    old = (await c.post("/v1/completions", json=SHORT)).json()["choices"][0]["text"]
    await c.post("/sleep", params={"level": "2"})
    await c.post("/wake_up", params=[("tags", "weights"), ("tags", "kv_cache")])
    assert (await c.post("/v1/completions", json=SHORT)).json()["choices"][0]["text"] != old
    await c.post("/collective_rpc", json={"method": "reload_weights"})
    assert (await c.post("/v1/completions", json=SHORT)).json()["choices"][0]["text"] == old


async def test_api_key_guards_only_v1_paths():
    async with fake_fleet("vllm", api_key="k") as fleet, httpx.AsyncClient(base_url=fleet.urls[0]) as c:
        assert (await c.get("/v1/models")).status_code == 401
        assert (await c.get("/v1/models", headers={"authorization": "Bearer k"})).status_code == 200
        assert (await c.post("/pause")).status_code == 200  # control routes are open


async def test_inference_generate_reports_spans(vl):
    _engine, c = vl
    r = await c.post(
        "/inference/v1/generate", json={"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 3}}
    )
    choice = r.json()["choices"][0]
    assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": len(choice["token_ids"])}]


async def test_server_info_can_be_enabled():
    async with (
        fake_fleet("vllm", vllm_server_info=True, tp_size=2) as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0]) as c,
    ):
        info = (await c.get("/server_info", params={"config_format": "json"})).json()
        assert info["vllm_config"]["parallel_config"]["tensor_parallel_size"] == 2

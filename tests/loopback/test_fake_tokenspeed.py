"""The fake TokenSpeed 0.1.1 control app (+ sidecar discovery) against docs/engines.md (TokenSpeed, checklist item 8)."""

from __future__ import annotations

import httpx
import pytest
import trio

from smgrl.fake import fake_fleet

LONG = {"text": "a long story please", "sampling_params": {"max_new_tokens": 40_000, "ignore_eos": True}}
GROUP = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 2}
NOT_IMPLEMENTED = "{} is not implemented by this build's scheduler; supported sources: distributed"


@pytest.fixture
async def ts():
    async with (
        fake_fleet("tokenspeed") as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0], timeout=30) as client,
    ):
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
    ("body", "status", "mode"),
    [
        (None, 200, "wait"),  # no body: default mode wait
        ({}, 200, "wait"),
        ({"mode": "abort"}, 200, "abort"),
        ({"mode": "keep"}, 200, "keep"),
        ({"mode": "retract"}, 400, None),
        ({"mode": "in_place"}, 400, None),
    ],
)
async def test_pause_modes(ts, body, status, mode):
    engine, c = ts
    r = (
        await c.post("/pause_generation", json=body)
        if body is not None
        else await c.post("/pause_generation")
    )
    assert r.status_code == status
    if status == 200:
        assert r.json() == {"success": True, "message": "Paused generation.", "mode": mode}
    else:
        assert r.json()["success"] is False and "invalid pause mode" in r.json()["message"]
    assert engine.paused == mode
    assert (await c.post("/continue_generation")).json() == {
        "success": True,
        "message": "Continued generation.",
    }


@pytest.mark.parametrize("route", ["update_weights_from_disk", "update_weights_from_tensor"])
@pytest.mark.parametrize("content", [b"", b"{not json", b'{"model_path": "/x"}'])
async def test_disk_and_tensor_are_501_before_the_body(ts, route, content):
    _engine, c = ts
    r = await c.post(f"/{route}", content=content)
    assert (r.status_code, r.json()) == (501, {"success": False, "message": NOT_IMPLEMENTED.format(route)})


async def test_wait_pause_lets_running_finish_and_blocks_new(ts):
    engine, c = ts
    engine.set_knobs(token_latency_ms=1)
    body = {"text": "x", "sampling_params": {"max_new_tokens": 30, "ignore_eos": True}}
    async with trio.open_nursery() as nursery:
        running = start(nursery, c, "/generate", body)
        await generating(engine)
        assert (await c.post("/pause_generation")).json()["mode"] == "wait"
        assert engine.inflight == 0  # returned after the drain
        blocked = start(nursery, c, "/generate", body)
        with trio.fail_after(10):
            await engine.wait_until(lambda: len(engine.calls_to("/generate")) == 2)
        assert "r" not in blocked
        await c.post("/continue_generation")
    assert running["r"].json()["meta_info"]["finish_reason"] == {"type": "length", "length": 30}
    assert blocked["r"].status_code == 200


async def test_flush_cache_always_reports_success(ts):
    engine, c = ts
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        start(nursery, c, "/generate", LONG)
        await generating(engine)
        for method in ("GET", "POST"):
            r = await c.request(method, "/flush_cache")
            assert r.json() == {"success": True, "message": "Cache flushed."}
        assert (await c.post("/abort_request", json={"abort_all": True})).json() == {"success": True}


async def test_distributed_update_defaults_to_no_flush(ts):
    _engine, c = ts
    prompt = {"text": "the same prompt every time", "sampling_params": {"max_new_tokens": 2}}
    await c.post("/generate", json=prompt)
    assert (await c.post("/init_weights_update_group", json=GROUP)).json()["success"] is True
    update = {"names": ["w"], "dtypes": ["bfloat16"], "shapes": [[2]], "weight_version": 7}
    r = await c.post("/update_weights_from_distributed", json=update)
    assert r.json() == {
        "success": True,
        "message": "Succeeded to update parameter online. Weight version updated to 7.",
    }
    assert (await c.post("/generate", json=prompt)).json()["meta_info"]["cached_tokens"] > 0  # not flushed
    await c.post("/update_weights_from_distributed", json={**update, "flush_cache": True})
    out = (await c.post("/generate", json=prompt)).json()
    assert out["meta_info"]["cached_tokens"] == 0
    assert out["meta_info"]["weight_version"] == "7"
    assert (await c.get("/get_weight_version")).json() == {"weight_version": "7"}


@pytest.mark.parametrize(
    ("path", "body", "message"),
    [
        ("/update_weights_from_distributed", {"names": ["a"], "dtypes": [], "shapes": [[1]]}, "same length"),
        ("/update_weights_from_distributed", {"names": ["a"], "shapes": [[1]]}, "Invalid request: 'dtypes'"),
        ("/init_weights_update_group", {"master_port": 1}, "Invalid request: 'master_address'"),
        ("/update_weight_version", {}, "Invalid request: 'new_version'"),
        ("/abort_request", None, "Invalid request"),
    ],
)
async def test_bad_requests(ts, path, body, message):
    _engine, c = ts
    r = await c.post(path, json=body) if body is not None else await c.post(path)
    assert r.status_code == 400
    assert r.json()["success"] is False and message in r.json()["message"]


async def test_weight_version_and_model_info(ts):
    engine, c = ts
    assert (await c.get("/get_weight_version")).json() == {"weight_version": "default"}
    r = await c.post("/update_weight_version", json={"new_version": 8})
    assert r.json() == {"success": True, "message": "Weight version updated to 8", "new_version": "8"}
    assert (await c.get("/model_info")).json() == {"model_path": engine.model_path, "weight_version": "8"}
    assert (await c.get("/health_generate")).json() == {"status": "ok"}
    assert (await c.get("/v1/loads")).json() == {
        "loads": [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_pages": 0}]
    }


async def test_server_info_advertises_rl_labels(ts):
    engine, c = ts
    assert (await c.get("/server_info")).status_code == 404  # the gateway falls back to /get_server_info
    info = (await c.get("/get_server_info")).json()
    assert info["rl.control_url"] == engine.url
    assert {k: v for k, v in info.items() if k.startswith("rl.") and k != "rl.control_url"} == {
        "rl.pause_modes": "wait,abort,keep",
        "rl.update_from": "distributed",
        "rl.abort": "true",
        "rl.flush_cache": "true",
        "rl.sleep_wake": "true",
        "rl.reports_weight_version": "true",
    }
    assert info["attn_tp_size"] == 1 and "tp_size" not in info
    assert info["server_args"]["attn_tp_size"] == 1
    assert (info["is_paused"], info["tokenspeed_version"]) == (False, "0.1.1")
    await c.post("/pause_generation", json={"mode": "keep"})
    assert (await c.get("/get_server_info")).json()["is_paused"] is True


async def test_wildcard_bind_host_omits_control_url():
    async with (
        fake_fleet("tokenspeed", advertised_host="0.0.0.0") as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0]) as c,
    ):
        info = (await c.get("/get_server_info")).json()
        assert "rl.control_url" not in info and info["rl.abort"] == "true"


async def test_control_key_guards_control_routes_only():
    async with (
        fake_fleet("tokenspeed", api_key="ctl") as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0]) as c,
    ):
        r = await c.post("/pause_generation")
        assert (r.status_code, r.json()) == (401, {"success": False, "message": "unauthorized"})
        assert (await c.get("/get_weight_version")).status_code == 401
        assert (await c.get("/get_server_info")).status_code == 200
        assert "ctl" not in (await c.get("/get_server_info")).text  # the key is never shown
        assert (await c.get("/health")).status_code == 200
        ok = await c.post("/pause_generation", headers={"authorization": "Bearer ctl"})
        assert ok.status_code == 200


async def test_abort_all_aborts_and_resumes(ts):
    engine, c = ts
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        gen = start(nursery, c, "/generate", LONG)
        await generating(engine)
        await c.post("/pause_generation", json={"mode": "keep"})
        assert (await c.post("/abort_request", json={"abort_all": True})).json() == {"success": True}
    assert gen["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert engine.paused is None  # pause(abort) + resume un-pauses


async def test_release_and_resume_memory(ts):
    engine, c = ts
    r = await c.post("/release_memory_occupation", json={"tags": ["kv_cache"]})
    assert (r.status_code, r.json()["success"]) == (200, True)
    assert (await c.post("/release_memory_occupation", json={"tags": ["kv_cache"]})).status_code == 400
    assert (await c.post("/resume_memory_occupation", json={"tags": ["weights"]})).status_code == 400
    assert (await c.post("/resume_memory_occupation", json={"tags": ["kv_cache"]})).json()["success"] is True
    assert engine.paused is None and engine.released_tags == set()

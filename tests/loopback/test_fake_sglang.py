"""The fake SGLang 0.5.23 engine against docs/engines.md (SGLang, and checklist items 1-6).

Everything runs over real loopback sockets; blocking behaviour is observed through the
engine's state (``wait_until``), never through wall-clock measurements.
"""

from __future__ import annotations

import json

import httpx
import pytest
import trio
import trio.testing

from smgrl.fake import fake_fleet, make_checkpoint

LONG = {
    "text": "tell me a very long story",
    "sampling_params": {"max_new_tokens": 40_000, "ignore_eos": True},
}
SHORT = {"text": "hello world", "sampling_params": {"max_new_tokens": 8}}
FLUSH_OK = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
STRUCT_ROUTES = [
    "/pause_generation",
    "/continue_generation",
    "/abort_request",
    "/release_memory_occupation",
    "/resume_memory_occupation",
    "/destroy_weights_update_group",
    "/update_weight_version",
    "/update_weights_from_disk",
    "/begin_weight_update",
    "/end_weight_update",
    "/init_weights_update_group",
    "/update_weights_from_distributed",
]


@pytest.fixture
async def sg():
    async with (
        fake_fleet("sglang", n=1, token_latency_ms=0) as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0], timeout=30) as client,
    ):
        yield fleet.engines[0], client


def start(nursery: trio.Nursery, client: httpx.AsyncClient, path: str, body: dict) -> dict:
    """Fire a request in the background; its response lands in the returned box."""
    box: dict = {}

    async def go() -> None:
        box["r"] = await client.post(path, json=body)

    nursery.start_soon(go)
    return box


async def generating(engine, n: int = 1) -> None:
    """Wait until ``n`` generations have produced at least one token."""
    with trio.fail_after(10):
        await engine.wait_until(lambda: sum(1 for j in engine.scheduler.jobs.values() if j.output_ids) >= n)


def envelope_ok(r: httpx.Response) -> None:
    body = r.json()
    assert r.status_code == 400
    assert set(body) == {"object", "message", "type", "param", "code"}
    assert (body["object"], body["type"], body["param"], body["code"]) == ("error", "Bad Request", None, 400)


# -- checklist 1: request validation and routing ---------------------------------------------------
@pytest.mark.parametrize("path", STRUCT_ROUTES)
async def test_bodyless_post_to_struct_route_is_400_envelope(sg, path):
    _engine, c = sg
    r = await c.post(path)
    envelope_ok(r)
    assert "Field required" in r.json()["message"]


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        ({"mode": "keep"}, None),  # not an SGLang mode
        ({"mode": 3}, None),  # wrong type
        ("not json", {"content-type": "application/json"}),
        ('{"mode":"abort"}', {"content-type": "text/plain"}),  # non-JSON content type
        ("[1,2]", {"content-type": "application/json"}),
    ],
)
async def test_pause_validation_errors(sg, body, headers):
    engine, c = sg
    content = body if isinstance(body, str) else json.dumps(body)
    r = await c.post(
        "/pause_generation", content=content, headers=headers or {"content-type": "application/json"}
    )
    envelope_ok(r)
    assert engine.paused is None


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/pause_generation", {}),
        ("/pause_generation", {"mode": "abort", "unknown_key": 1, "rid": "x", "http_worker_ipc": None}),
        ("/continue_generation", {}),
        ("/continue_generation", {"torch_empty_cache": False}),
    ],
)
async def test_empty_object_and_unknown_keys_accepted(sg, path, body):
    _engine, c = sg
    r = await c.post(path, json=body)
    assert r.status_code == 200


async def test_pause_continue_messages_and_idempotency(sg):
    engine, c = sg
    for _ in range(2):
        r = await c.post("/pause_generation", json={"mode": "in_place"})
        assert r.json() == {"message": "Generation paused successfully.", "status": "ok"}
        assert engine.paused == "in_place"
    for _ in range(2):
        r = await c.post("/continue_generation", json={})
        assert r.json() == {"message": "Generation continued successfully.", "status": "ok"}
        assert engine.paused is None


@pytest.mark.parametrize(
    ("method", "path", "status", "body"),
    [
        ("GET", "/pause_generation", 405, {"detail": "Method Not Allowed"}),
        ("GET", "/update_weights_from_disk", 405, {"detail": "Method Not Allowed"}),
        ("DELETE", "/flush_cache", 405, {"detail": "Method Not Allowed"}),
        ("GET", "/get_weight_version", 404, {"detail": "Not Found"}),
        ("GET", "/weight_version", 404, {"detail": "Not Found"}),
        ("POST", "/no/such/route", 404, {"detail": "Not Found"}),
    ],
)
async def test_routing_errors(sg, method, path, status, body):
    _engine, c = sg
    r = await c.request(method, path)
    assert (r.status_code, r.json()) == (status, body)


async def test_head_answers_like_get_without_body(sg):
    _engine, c = sg
    get = await c.get("/model_info")
    head = await c.head("/model_info")
    assert head.status_code == 200
    assert head.content == b""
    assert head.headers["content-length"] == str(len(get.content))


# -- checklist 2: flush_cache ----------------------------------------------------------------------
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_flush_cache_idle_is_text_200(sg, method):
    _engine, c = sg
    r = await c.request(method, "/flush_cache")
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert r.text == FLUSH_OK


@pytest.mark.parametrize(
    ("pause_mode", "status"),
    [(None, 400), ("in_place", 400), ("retract", 200), ("abort", 200)],
)
async def test_flush_cache_refused_while_running(sg, pause_mode, status):
    engine, c = sg
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        box = start(nursery, c, "/generate", LONG)
        await generating(engine)
        if pause_mode:
            assert (await c.post("/pause_generation", json={"mode": pause_mode})).status_code == 200
        r = await c.get("/flush_cache")
        assert r.status_code == status
        assert r.headers["content-type"].startswith("text/plain")
        assert r.text == (FLUSH_OK if status == 200 else "Flush cache failed.\n")
        await c.post("/abort_request", json={"abort_all": True})
        await c.post("/continue_generation", json={})
    assert box["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"


async def test_flush_cache_timeout_defers_until_idle_and_only_once(sg):
    engine, c = sg
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        gen = start(nursery, c, "/generate", LONG)
        await generating(engine)
        flush: dict = {}

        async def deferred() -> None:
            flush["r"] = await c.get("/flush_cache", params={"timeout": "30"})

        nursery.start_soon(deferred)
        with trio.fail_after(10):
            await engine.wait_until(lambda: engine._flush_pending)
        second = await c.get("/flush_cache", params={"timeout": "5"})
        assert (second.status_code, second.text) == (400, "Another flush_cache is already in progress.")
        await c.post("/abort_request", json={"abort_all": True})
    assert gen["r"].status_code == 200
    assert (flush["r"].status_code, flush["r"].text) == (200, FLUSH_OK)


async def test_flush_cache_timeout_expires(sg):
    engine, c = sg
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        start(nursery, c, "/generate", LONG)
        await generating(engine)
        r = await c.get("/flush_cache", params={"timeout": "0.05"})
        assert (r.status_code, r.text) == (400, "Timed out waiting for idle state.")
        await c.post("/abort_request", json={"abort_all": True})


@pytest.mark.parametrize("value", ["-1", "abc"])
async def test_flush_cache_bad_timeout_is_validation_error(sg, value):
    _engine, c = sg
    envelope_ok(await c.get("/flush_cache", params={"timeout": value}))


async def test_refit_with_flush_can_fail_after_replacing_weights(sg, tmp_path):
    engine, c = sg
    engine.set_knobs(token_latency_ms=1)
    ckpt = make_checkpoint(tmp_path / "v2", "fake/Qwen3-0.6B", seed=2)
    before = engine.weights_digest
    async with trio.open_nursery() as nursery:
        start(nursery, c, "/generate", LONG)
        await generating(engine)
        await c.post("/pause_generation", json={"mode": "in_place"})
        r = await c.post("/update_weights_from_disk", json={"model_path": str(ckpt), "weight_version": "v2"})
        assert r.status_code == 400
        body = r.json()
        assert body["success"] is False and body["num_paused_requests"] == 0
        assert "Weights were updated, but the cache was not flushed" in body["message"]
        assert engine.weights_digest != before  # the weights did change ...
        assert engine.weight_version == "default"  # ... but the version was not recorded
        assert engine.model_path != str(ckpt)
        await c.post("/abort_request", json={"abort_all": True})
        await c.post("/continue_generation", json={})


# -- checklist 5: refit from disk ------------------------------------------------------------------
async def test_refit_from_disk_changes_text_paths_and_version(sg, tmp_path):
    engine, c = sg
    ckpt = make_checkpoint(tmp_path / "step1", "fake/Qwen3-0.6B", seed=1)
    old_text = (await c.post("/generate", json=SHORT)).json()["text"]
    r = await c.post("/update_weights_from_disk", json={"model_path": str(ckpt), "weight_version": "step-1"})
    assert r.status_code == 200
    assert r.json() == {
        "success": True,
        "message": "Succeeded to update model weights. Weight version updated to step-1.",
        "num_paused_requests": 0,
    }
    out = (await c.post("/generate", json=SHORT)).json()
    assert out["text"] != old_text
    assert out["meta_info"]["weight_version"] == "step-1"
    info = (await c.get("/model_info")).json()
    assert (info["model_path"], info["served_model_name"], info["weight_version"]) == (
        str(ckpt),
        str(ckpt),
        "step-1",
    )
    assert [m["id"] for m in (await c.get("/v1/models")).json()["data"]] == [str(ckpt)]
    server = (await c.get("/server_info")).json()
    assert server["weight_version"] == "default"  # startup value
    assert server["internal_states"][0]["weight_version"] == "step-1"  # live value
    # The same checkpoint content elsewhere generates the same text.
    twin = make_checkpoint(tmp_path / "twin", "fake/Qwen3-0.6B", seed=1)
    await c.post("/update_weights_from_disk", json={"model_path": str(twin)})
    assert (await c.post("/generate", json=SHORT)).json()["text"] == out["text"]
    assert engine.weight_version == "step-1"  # no weight_version given: unchanged


async def test_refit_from_missing_path_is_400(sg, tmp_path):
    engine, c = sg
    before = (engine.weights_digest, engine.model_path)
    r = await c.post(
        "/update_weights_from_disk", json={"model_path": str(tmp_path / "nope"), "weight_version": "x"}
    )
    assert r.status_code == 400
    body = r.json()
    assert (body["success"], body["num_paused_requests"]) == (False, 0)
    assert "Failed to get weights iterator" in body["message"]
    assert (engine.weights_digest, engine.model_path, engine.weight_version) == (*before, "default")


async def test_unpaused_refit_waits_for_inflight_generation(sg, tmp_path):
    engine, c = sg
    engine.set_knobs(token_latency_ms=1)
    ckpt = make_checkpoint(tmp_path / "w", "m", seed=5)
    async with trio.open_nursery() as nursery:
        gen = start(nursery, c, "/generate", LONG)
        await generating(engine)
        refit = start(nursery, c, "/update_weights_from_disk", {"model_path": str(ckpt)})
        with trio.fail_after(10):
            await engine.wait_until(lambda: engine.lock.waiting_writers == 1)
        assert "r" not in refit  # blocked behind the reader lock
        await c.post("/abort_request", json={"abort_all": True})
    assert refit["r"].status_code == 200
    assert gen["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"


@pytest.mark.parametrize(
    ("body", "aborted"),
    [({"new_version": "v9"}, True), ({"new_version": "v9", "abort_all_requests": False}, False)],
)
async def test_update_weight_version_aborts_by_default(sg, body, aborted):
    engine, c = sg
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        gen = start(nursery, c, "/generate", LONG)
        await generating(engine)
        r = await c.post("/update_weight_version", json=body)
        assert r.json() == {"success": True, "message": "Weight version updated to v9", "new_version": "v9"}
        if not aborted:
            # Let a few tokens come out under the new version, then stop it.
            await engine.wait_until(
                lambda: any(j.weight_version == "v9" for j in engine.scheduler.jobs.values())
            )
            await c.post("/abort_request", json={"abort_all": True})
    meta = gen["r"].json()["meta_info"]
    assert gen["r"].status_code == 200
    assert meta["finish_reason"]["type"] == "abort"
    assert meta["weight_version"] == ("default" if aborted else "v9")
    if not aborted:
        spans = meta["weight_versions"]
        assert [s["version"] for s in spans] == ["default", "v9"]
        assert spans[0]["start"] == 0 and spans[0]["end"] == spans[1]["start"]
        assert spans[1]["end"] == meta["completion_tokens"]
    else:
        assert "weight_versions" not in meta


# -- checklist 3: pause semantics ------------------------------------------------------------------
async def test_generate_blocks_while_paused_and_ready_is_503(sg):
    engine, c = sg
    assert (await c.get("/ready")).status_code == 200
    await c.post("/pause_generation", json={"mode": "abort"})
    assert (await c.get("/ready")).status_code == 503
    async with trio.open_nursery() as nursery:
        gen = start(nursery, c, "/generate", SHORT)
        with trio.fail_after(10):
            await engine.wait_until(lambda: engine.calls_to("/generate"))
        await trio.testing.wait_all_tasks_blocked(cushion=0.01)
        assert "r" not in gen and engine.inflight == 0
        await c.post("/continue_generation", json={})
    assert gen["r"].status_code == 200
    assert gen["r"].json()["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    assert (await c.get("/ready")).status_code == 200


async def test_health_503_after_timeout_while_paused():
    async with (
        fake_fleet("sglang", health_check_timeout_s=0.05) as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0]) as c,
    ):
        assert (await c.get("/health")).status_code == 200
        await c.post("/pause_generation", json={"mode": "in_place"})
        r = await c.get("/health_generate")
        assert (r.status_code, r.content) == (503, b"")
        assert (await c.get("/ready")).status_code == 503
        await c.post("/continue_generation", json={})
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/ready")).status_code == 200


async def test_pause_abort_aborts_inflight_and_returns_when_drained(sg):
    engine, c = sg
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        gens = [start(nursery, c, "/generate", {**LONG, "rid": f"req-{i}"}) for i in range(3)]
        await generating(engine, 3)
        r = await c.post("/pause_generation", json={})
        assert r.status_code == 200
        assert engine.inflight == 0 and engine.lock.readers == 0
    for box in gens:
        assert box["r"].status_code == 200
        reason = box["r"].json()["meta_info"]["finish_reason"]
        assert reason == {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    await c.post("/continue_generation", json={})


async def test_retract_then_refit_reports_version_spans(sg, tmp_path):
    engine, c = sg
    engine.set_knobs(token_latency_ms=1)
    ckpt = make_checkpoint(tmp_path / "v2", "m", seed=2)
    body = {"text": "x y z", "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}}
    async with trio.open_nursery() as nursery:
        gen = start(nursery, c, "/generate", body)
        await generating(engine)
        await c.post("/pause_generation", json={"mode": "retract"})
        assert [j.retracted for j in engine.scheduler.jobs.values()] == [True]
        r = await c.post("/update_weights_from_disk", json={"model_path": str(ckpt), "weight_version": "v2"})
        assert r.status_code == 200  # retracted requests do not block the flush
        assert r.json()["num_paused_requests"] == 1
        await c.post("/continue_generation", json={})
    meta = gen["r"].json()["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 60}
    assert meta["num_retractions"] == 1
    assert meta["weight_version"] == "v2"
    assert [s["version"] for s in meta["weight_versions"]] == ["default", "v2"]


async def test_abort_request_by_rid_prefix_empty_body(sg):
    engine, c = sg
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        a = start(nursery, c, "/generate", {**LONG, "rid": "group-a-1"})
        b = start(
            nursery, c, "/generate", {**LONG, "rid": "group-b-1", "sampling_params": {"max_new_tokens": 30}}
        )
        await generating(engine, 2)
        r = await c.post("/abort_request", json={"rid": "group-a"})
        assert (r.status_code, r.content) == (200, b"")
    assert a["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"
    assert b["r"].json()["meta_info"]["finish_reason"]["type"] in ("length", "stop")


# -- checklist 4: weight-update sessions -----------------------------------------------------------
GROUP = {"master_address": "127.0.0.1", "master_port": 29500, "rank_offset": 1, "world_size": 2}
DIST = {
    "names": ["w"],
    "dtypes": ["bfloat16"],
    "shapes": [[2, 2]],
    "weight_version": "d1",
    "flush_cache": False,
}


async def test_distributed_update_needs_a_session(sg):
    engine, c = sg
    assert (await c.post("/init_weights_update_group", json=GROUP)).json() == {
        "success": True,
        "message": "Succeeded to initialize custom process group.",
    }
    r = await c.post("/update_weights_from_distributed", json=DIST)
    assert r.status_code == 400
    assert r.json()["success"] is False
    assert "must run between begin_weight_update() and end_weight_update()" in r.json()["message"]
    assert (await c.post("/end_weight_update", json={})).status_code == 400
    assert (await c.post("/begin_weight_update", json={})).json() == {"success": True, "message": "Success"}
    assert (await c.post("/begin_weight_update", json={})).status_code == 400
    before = engine.weights_digest
    r = await c.post("/update_weights_from_distributed", json=DIST)
    assert r.json() == {
        "success": True,
        "message": "Succeeded to update parameter online. Weight version updated to d1.",
    }
    assert engine.weights_digest != before
    assert (await c.post("/end_weight_update", json={})).json() == {"success": True, "message": "Success"}
    assert engine.transfers.updates[0]["names"] == ["w"]
    assert (await c.post("/destroy_weights_update_group", json={})).json()["success"] is True
    assert (await c.post("/destroy_weights_update_group", json={})).status_code == 400


async def test_session_requirement_is_switchable():
    async with (
        fake_fleet("sglang", require_weight_session=False) as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0]) as c,
    ):
        await c.post("/init_weights_update_group", json=GROUP)
        r = await c.post("/update_weights_from_distributed", json=DIST)
        assert (r.status_code, r.json()["success"]) == (200, True)
        r = await c.post("/update_weights_from_tensor", json={"serialized_named_tensors": ["AAAA"]})
        assert (r.status_code, r.json()["success"]) == (200, True)


async def test_distributed_update_without_group_fails(sg):
    _engine, c = sg
    await c.post("/begin_weight_update", json={})
    r = await c.post("/update_weights_from_distributed", json=DIST)
    assert (r.status_code, r.json()["success"]) == (400, False)


async def test_dp2_asserts_on_distributed_routes():
    async with fake_fleet("sglang", dp_size=2) as fleet, httpx.AsyncClient(base_url=fleet.urls[0]) as c:
        r = await c.post("/init_weights_update_group", json=GROUP)
        assert (r.status_code, r.text) == (500, "Internal Server Error")
        info = (await c.get("/server_info")).json()
        assert info["dp_size"] == 2 and len(info["internal_states"]) == 2
        loads = (await c.get("/v1/loads")).json()["loads"]
        assert [row["dp_rank"] for row in loads] == [0, 1]


# -- memory occupation -----------------------------------------------------------------------------
async def test_release_resume_memory(sg):
    engine, c = sg
    r = await c.post("/release_memory_occupation", json={})
    assert (r.status_code, r.content, r.headers["content-type"]) == (200, b"null", "application/json")
    assert engine.released_tags == {"weights", "kv_cache", "cuda_graph"}
    assert (await c.post("/release_memory_occupation", json={"tags": ["weights"]})).status_code == 500
    r = await c.post("/resume_memory_occupation", json={"tags": ["kv_cache", "cuda_graph"]})
    assert (r.status_code, r.content) == (200, b"null")
    assert (await c.post("/resume_memory_occupation", json={"tags": ["kv_cache"]})).status_code == 500
    assert (
        await c.request("GET", "/resume_memory_occupation", json={"tags": ["weights"]})
    ).status_code == 200
    assert engine.released_tags == set()


async def test_release_while_busy_is_500(sg):
    engine, c = sg
    engine.set_knobs(token_latency_ms=1)
    async with trio.open_nursery() as nursery:
        start(nursery, c, "/generate", LONG)
        await generating(engine)
        assert (await c.post("/release_memory_occupation", json={})).status_code == 500
        await c.post("/abort_request", json={"abort_all": True})


# -- discovery and auth ----------------------------------------------------------------------------
async def test_discovery_documents(sg):
    _engine, c = sg
    info = (await c.get("/server_info")).json()
    for key in ("tp_size", "dp_size", "pp_size", "ep_size", "model_path", "served_model_name", "weight_version",
                "version", "internal_states", "load_balance_method", "context_length", "max_running_requests"):  # fmt: skip
        assert key in info
    assert info["version"] == "0.5.23" and "attn_tp_size" not in info
    assert (await c.get("/get_server_info")).json().keys() == info.keys()
    model = (await c.get("/model_info")).json()
    assert model == (await c.get("/get_model_info")).json()
    assert model["served_model_name"] == "fake/Qwen3-0.6B"
    card = (await c.get("/v1/models")).json()["data"][0]
    assert (card["owned_by"], card["id"], card["root"]) == ("sglang", "fake/Qwen3-0.6B", "fake/Qwen3-0.6B")
    assert (await c.get("/v1/models/fake/Qwen3-0.6B")).json()["id"] == "fake/Qwen3-0.6B"
    missing = await c.get("/v1/models/other")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "model_not_found")


async def test_api_key_guards_everything_but_health():
    async with (
        fake_fleet("sglang", api_key="sekret") as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0]) as c,
    ):
        assert (await c.get("/health")).status_code == 200
        r = await c.post("/pause_generation", json={})
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"})
        ok = await c.post("/pause_generation", json={}, headers={"authorization": "Bearer sekret"})
        assert ok.status_code == 200


# -- checklist 6: generation shapes ----------------------------------------------------------------
async def test_generate_single_batch_logprobs(sg):
    _engine, c = sg
    one = (await c.post("/generate", json={**SHORT, "return_logprob": True, "rid": "r1"})).json()
    meta = one["meta_info"]
    assert meta["id"] == "r1"
    assert len(one["output_ids"]) == meta["completion_tokens"] == len(meta["output_token_logprobs"])
    assert [t for _, t, _ in meta["output_token_logprobs"]] == one["output_ids"]
    for key in ("prompt_tokens", "cached_tokens", "weight_version", "finish_reason", "num_retractions"):
        assert key in meta
    batch = (
        await c.post("/generate", json={"text": ["a b", "c d"], "sampling_params": {"max_new_tokens": 4}})
    ).json()
    assert isinstance(batch, list) and len(batch) == 2
    ids = (
        await c.post("/generate", json={"input_ids": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 2}})
    ).json()
    assert [len(x["output_ids"]) <= 2 for x in ids] == [True, True]
    again = (await c.post("/generate", json=SHORT)).json()
    assert again["meta_info"]["cached_tokens"] == 1  # prefix cache hit (all but the last token)
    await c.get("/flush_cache")
    assert (await c.post("/generate", json=SHORT)).json()["meta_info"]["cached_tokens"] == 0
    bad = await c.post("/generate", json={"sampling_params": {}})
    assert bad.status_code == 400 and "error" in bad.json()


async def test_generate_stream_ends_with_done(sg):
    _engine, c = sg
    r = await c.post("/generate", json={**SHORT, "stream": True})
    assert r.headers["content-type"] == "text/event-stream"
    events = [e for e in r.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert all(ch["meta_info"]["finish_reason"] is None for ch in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"] is not None
    final = (await c.post("/generate", json=SHORT)).json()
    assert chunks[-1]["text"] == final["text"]  # cumulative text


async def test_openai_routes(sg):
    _engine, c = sg
    r = (await c.post("/v1/completions", json={"model": "x", "prompt": "hi there", "max_tokens": 5})).json()
    assert (r["object"], r["model"]) == ("text_completion", "fake/Qwen3-0.6B")
    choice = r["choices"][0]
    assert choice["finish_reason"] in ("stop", "length")
    assert 1 <= r["usage"]["completion_tokens"] <= 5
    assert r["usage"]["prompt_tokens"] == 2
    assert r["metadata"] == {"weight_version": "default"}
    chat = (
        await c.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        )
    ).json()
    assert chat["choices"][0]["message"]["role"] == "assistant"
    assert (
        chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + chat["usage"]["completion_tokens"]
    )
    stream = await c.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True},
    )
    events = [e for e in stream.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    deltas = [json.loads(e.removeprefix("data: "))["choices"][0] for e in events[:-1]]
    assert deltas[0]["delta"]["role"] == "assistant"
    assert deltas[-1]["finish_reason"] in ("stop", "length")
    text = "".join(d["delta"].get("content", "") for d in deltas)
    assert text == chat["choices"][0]["message"]["content"]


async def test_weights_checker_hashes_all_weights_into_one_value(sg, tmp_path):
    """/weights_checker (docs/engines.md): one checksum per engine, kept for ``compare``; a load
    changes it; ``reset`` forgets it; a bad action is a 400."""
    _engine, c = sg
    first = (await c.post("/weights_checker", json={"action": "checksum"})).json()
    assert first["success"] is True and len(first["per_engine_checksum"]) == 1
    same = (await c.request("GET", "/weights_checker", json={"action": "compare"})).json()
    assert same["success"] is True and same["per_engine_checksum"] == first["per_engine_checksum"]
    ckpt = make_checkpoint(tmp_path / "next", "fake/model", seed=11)
    r = await c.post("/update_weights_from_disk", json={"model_path": str(ckpt), "weight_version": "v2"})
    assert r.status_code == 200, r.text
    moved = (await c.post("/weights_checker", json={"action": "compare"})).json()
    assert moved["success"] is False and moved["per_engine_checksum"] != first["per_engine_checksum"]
    assert (await c.post("/weights_checker", json={"action": "reset"})).json()["success"] is True
    assert (await c.post("/weights_checker", json={"action": "compare"})).status_code == 400
    assert (await c.post("/weights_checker", json={"action": "nope"})).status_code == 400
    envelope_ok(await c.post("/weights_checker"))

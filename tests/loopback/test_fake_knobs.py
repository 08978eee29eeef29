"""The fake-only surface (/_fake/*), knobs, the call log, the fleet API and the HTTP core."""

from __future__ import annotations

import base64

import httpx
import pytest
import trio

from smgrl.fake import checkpoint_digest, fake_fleet, make_checkpoint, start_engine
from smgrl.fake.http import HttpServer, Response, json_response


@pytest.fixture
async def one():
    async with fake_fleet("sglang") as fleet, httpx.AsyncClient(base_url=fleet.urls[0], timeout=10) as client:
        yield fleet.engines[0], client


# -- knobs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("knobs", "status", "content", "ctype"),
    [
        ({"force_status": 503}, 503, b"", None),
        ({"force_status": 500, "force_body": '{"boom":1}'}, 500, b'{"boom":1}', "application/json"),
        ({"force_status": 418, "force_body": "teapot"}, 418, b"teapot", "text/plain; charset=utf-8"),
        ({"force_status": 204}, 204, b"", None),
    ],
)
async def test_force_status_and_body(one, knobs, status, content, ctype):
    _engine, c = one
    r = await c.post("/_fake/knobs", json=knobs)
    assert r.status_code == 200 and r.json()["force_status"] == knobs["force_status"]
    r = await c.get("/health")
    assert (r.status_code, r.content, r.headers.get("content-type")) == (status, content, ctype)
    assert (await c.get("/_fake/state")).status_code == 200  # fake routes are never forced
    await c.post("/_fake/knobs", json={"force_status": None, "force_body": None})
    assert (await c.get("/health")).status_code == 200


@pytest.mark.parametrize(
    "knobs",
    [{"nope": 1}, {"hang": "yes"}, {"force_status": 99}, {"latency_ms": "fast"}, [1]],
)
async def test_bad_knobs_are_400(one, knobs):
    _engine, c = one
    r = await c.post("/_fake/knobs", json=knobs)
    assert r.status_code == 400 and "error" in r.json()


async def test_hang_never_answers(one):
    engine, c = one
    await c.post("/_fake/knobs", json={"hang": True})
    with pytest.raises(httpx.ReadTimeout):
        await c.get("/health", timeout=0.2)
    engine.set_knobs(hang=False)
    assert (await c.get("/health")).status_code == 200


async def test_down_for_s_refuses_connections_then_comes_back(one):
    engine, c = one
    r = await c.post("/_fake/knobs", json={"down_for_s": 60})
    assert r.status_code == 200  # the answer is sent before going down
    with pytest.raises(httpx.ConnectError):
        async with httpx.AsyncClient() as fresh:
            await fresh.get(engine.url + "/health")
    assert engine.server.is_down
    engine.come_up()
    with trio.fail_after(10):
        while engine.server.is_down:  # bounded by fail_after; a few scheduler passes at most
            await trio.sleep(0.01)
    async with httpx.AsyncClient() as fresh:
        assert (await fresh.get(engine.url + "/health")).status_code == 200


async def test_down_then_up_by_itself():
    async with fake_fleet("vllm") as fleet:
        engine = fleet.engines[0]
        port = engine.port
        engine.go_down(0.05)
        with trio.fail_after(10):
            while engine.server.is_down or engine.port != port:
                await trio.sleep(0.01)
        async with httpx.AsyncClient() as c:
            assert (await c.get(engine.url + "/version")).json() == {"version": "0.33.0"}


@pytest.mark.parametrize("size", [5, 10, 1_048_577])
async def test_huge_body_is_one_shot_and_exact(one, size):
    _engine, c = one
    await c.post("/_fake/knobs", json={"huge_body_bytes": size})
    assert len((await c.get("/health")).content) == 0  # probes are not control calls
    r = await c.get("/flush_cache")
    assert len(r.content) == size
    if size >= 10:
        assert r.json()["pad"] == "x" * (size - 10)
    assert (await c.get("/flush_cache")).text.startswith("Cache flushed.")


async def test_redirect(one):
    engine, c = one
    await c.post("/_fake/knobs", json={"redirect_to": "http://127.0.0.1:1/base"})
    r = await c.post("/pause_generation?x=1", json={})
    assert (r.status_code, r.headers["location"]) == (307, "http://127.0.0.1:1/base/pause_generation?x=1")
    assert engine.paused is None


# -- call log and state --------------------------------------------------------------------------
async def test_calls_are_recorded_and_cleared(one):
    engine, c = one
    await c.post("/pause_generation?a=1", json={"mode": "in_place"}, headers={"x-request-id": "abc"})
    await c.post(
        "/update_weights_from_disk", content=b"\xff\xfe", headers={"content-type": "application/json"}
    )
    calls = (await c.get("/_fake/calls")).json()["calls"]
    assert [(x["method"], x["path"]) for x in calls] == [
        ("POST", "/pause_generation"),
        ("POST", "/update_weights_from_disk"),
    ]
    first, second = calls
    assert (first["query"], first["body"], first["body_encoding"]) == ("a=1", '{"mode":"in_place"}', "utf-8")
    assert first["headers"]["x-request-id"] == "abc"
    assert second["body_encoding"] == "base64" and base64.b64decode(second["body"]) == b"\xff\xfe"
    only = (await c.get("/_fake/calls", params={"path": "/pause_generation"})).json()["calls"]
    assert len(only) == 1
    assert engine.calls_to("/pause_generation")[0].json_body() == {"mode": "in_place"}
    state = (await c.get("/_fake/state")).json()
    assert (state["paused"], state["weight_version"], state["inflight"]) == ("in_place", "default", 0)
    assert state["connections"] == {"accepted": 1, "open": 1}  # one kept-alive client connection
    assert state["memory"] == {"released": []}
    assert (await c.delete("/_fake/calls")).json() == {"cleared": True}
    assert (await c.get("/_fake/calls")).json() == {"calls": []}


async def test_peak_concurrency_counts_control_calls_across_the_fleet():
    async with (
        fake_fleet("sglang", n=4, health_check_timeout_s=60) as fleet,
        httpx.AsyncClient(timeout=30) as c,
    ):
        for url in fleet.urls:
            await c.post(url + "/pause_generation", json={"mode": "in_place"})
        fleet.clear_calls()
        async with trio.open_nursery() as nursery:
            for i in range(8):  # /health blocks while paused: 8 calls in flight at once
                nursery.start_soon(c.get, fleet.urls[i % 4] + "/health")
            with trio.fail_after(10):
                await fleet.engines[0].wait_until(lambda: fleet.gauge.current == 8)
            for url in fleet.urls:
                await c.post(url + "/continue_generation", json={})
        assert fleet.peak_concurrency == 9  # 8 health probes + the first continue
        # per engine: its 2 blocked probes + its own continue
        assert [e.peak_concurrency for e in fleet.engines] == [3, 3, 3, 3]
        state = (await c.get(fleet.urls[1] + "/_fake/state")).json()
        assert (state["peak_concurrency"], state["process_peak_concurrency"]) == (3, 9)


# -- fleet and checkpoints -----------------------------------------------------------------------
async def test_fleet_replicas_share_weights(tmp_path):
    async with fake_fleet("sglang", n=3) as fleet:
        assert len(set(fleet.urls)) == 3 and all(u.startswith("http://127.0.0.1:") for u in fleet.urls)
        assert len({e.weights_digest for e in fleet.engines}) == 1
        async with httpx.AsyncClient() as c:
            texts = set()
            for url in fleet.urls:
                r = await c.post(
                    url + "/generate", json={"text": "same", "sampling_params": {"max_new_tokens": 4}}
                )
                texts.add(r.json()["text"])
            assert len(texts) == 1


async def test_start_engine_in_own_nursery(tmp_path):
    ckpt = make_checkpoint(tmp_path / "m", "org/model", seed=1)
    async with trio.open_nursery() as nursery:
        engine = await start_engine(nursery, "tokenspeed", model_path=str(ckpt))
        assert engine.weights_digest == checkpoint_digest(ckpt)
        assert engine.served_model_name == str(ckpt)  # SGLang's rule: defaults to the path
        async with httpx.AsyncClient() as c:
            assert (await c.get(engine.url + "/model_info")).json()["model_path"] == str(ckpt)
        nursery.cancel_scope.cancel()


def test_checkpoint_digest_is_content_based(tmp_path):
    a = make_checkpoint(tmp_path / "a", "m", seed=1)
    b = make_checkpoint(tmp_path / "b", "m", seed=1)
    c = make_checkpoint(tmp_path / "c", "m", seed=2)
    assert checkpoint_digest(a) == checkpoint_digest(b) != checkpoint_digest(c)
    (b / "extra.bin").write_bytes(b"\0")
    assert checkpoint_digest(a) != checkpoint_digest(b)


# -- HTTP core -----------------------------------------------------------------------------------
async def _echo(req) -> Response:
    if req.path == "/boom":
        raise RuntimeError("handler bug")
    if req.path == "/stream":

        async def chunks():
            for i in range(3):
                yield f"part{i};".encode()

        return Response(200, content_type="text/plain", stream=chunks())
    return json_response(
        {"method": req.method, "path": req.path, "query": req.query, "body": req.body.decode()}
    )


async def test_http_core_keepalive_chunked_head_and_stream():
    async with trio.open_nursery() as nursery:
        server = await nursery.start(HttpServer(_echo).run)
        async with httpx.AsyncClient(base_url=server.url) as c:
            r = await c.post("/p?a=1&a=2&b=", content=b"xyz")
            assert r.json() == {
                "method": "POST",
                "path": "/p",
                "query": [["a", "1"], ["a", "2"], ["b", ""]],
                "body": "xyz",
            }

            async def body():
                yield b"chunk1-"
                yield b"chunk2"

            r = await c.post("/c", content=body())  # chunked request body
            assert r.json()["body"] == "chunk1-chunk2"
            head = await c.head("/h")
            assert head.content == b"" and int(head.headers["content-length"]) > 0
            r = await c.get("/stream")
            assert (r.text, r.headers["transfer-encoding"]) == ("part0;part1;part2;", "chunked")
            # every exchange above reused one kept-alive connection
            assert (server.accepted, server.open_connections) == (1, 1)
            boom = await c.get("/boom")
            assert (boom.status_code, boom.text) == (500, "Internal Server Error")
            assert (await c.get("/after")).json()["path"] == "/after"  # the port survived
        nursery.cancel_scope.cancel()


async def test_http_core_survives_garbage():
    async with trio.open_nursery() as nursery:
        server = await nursery.start(HttpServer(_echo).run)
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.send_all(b"NOT HTTP AT ALL\r\n\r\n")
        with trio.fail_after(5):
            while await stream.receive_some(1024):  # the server closes the connection
                pass
        async with httpx.AsyncClient() as c:
            assert (await c.get(server.url + "/ok")).status_code == 200
        nursery.cancel_scope.cancel()


async def test_weights_route_records_transfers_without_torch():
    pytest.importorskip("smgrl.fake.distributed")
    from smgrl.fake import distributed

    if distributed.available():
        pytest.skip("torch is installed: real mode would wait for a trainer")
    group = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}
    update = {
        "names": ["a", "b"],
        "dtypes": ["float32", "bfloat16"],
        "shapes": [[1], [2, 2]],
        "weight_version": "3",
    }
    async with (
        fake_fleet("tokenspeed", real_distributed=True) as fleet,
        httpx.AsyncClient(base_url=fleet.urls[0]) as c,
    ):
        await c.post("/init_weights_update_group", json=group)
        assert (await c.post("/update_weights_from_distributed", json=update)).status_code == 200
        weights = (await c.get("/_fake/weights")).json()
        assert weights["real"] is False
        assert weights["groups"]["weight_update_group"]["world_size"] == 2
        assert [(u["names"], u["weight_version"]) for u in weights["updates"]] == [(["a", "b"], "3")]
        # Nothing received: the checksums are those of the declared metadata (docs/engines.md).
        from smgrl.fake.transfer import declared_checksum

        assert weights["checksums"] == {
            "a": declared_checksum("a", "float32", [1]),
            "b": declared_checksum("b", "bfloat16", [2, 2]),
        }

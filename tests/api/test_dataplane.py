"""Rollout routes on the gateway's port: /generate, /v1/completions, /v1/chat/completions,
/v1/models: passthrough, the model rules of the TokenSpeed/slime work, streams
relayed chunk by chunk, and a client disconnect cancelling the engine call."""

from __future__ import annotations

import json
import logging

import httpx
import pytest
import trio
import trio.testing

from smgrl.core.config import Config, RlConfig
from smgrl.fake import fake_fleet
from smgrl.fake.checkpoint import make_checkpoint
from smgrl.testing import gateway_in_process
from smgrl.testing.dataplane import PROBE_MODEL, ScriptedEngine, gateway_on_loopback

GEN = {"text": "hello there", "sampling_params": {"max_new_tokens": 4}}


def cfg(**kw) -> Config:
    return Config(rl=RlConfig(enabled=True), policy=kw.pop("policy", "round_robin"), **kw)


async def test_generate_single_prompt_answers_one_object_and_a_batch_a_list():
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        r = await gw.client.post("/generate", json=GEN)
        assert r.status_code == 200
        body = r.json()
        assert isinstance(body, dict) and body["meta_info"]["completion_tokens"] == 4
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        assert r.headers["x-smgrl-worker-id"] == wid
        assert r.headers["x-smg-routed-worker-id"] == fleet.urls[0]  # SMG names the worker URL
        assert r.headers["x-request-id"].startswith("gnt-")

        r = await gw.client.post("/generate", json={**GEN, "text": ["a", "b"]})
        assert r.status_code == 200 and isinstance(r.json(), list) and len(r.json()) == 2

        r = await gw.client.post(
            "/generate", json={"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
        )
        assert isinstance(r.json(), dict)


async def test_openai_routes_and_models():
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        r = await gw.client.post(
            "/v1/chat/completions",
            json={
                "model": "fake/Qwen3-0.6B",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 3,
            },
        )
        assert r.status_code == 200 and r.json()["object"] == "chat.completion"
        r = await gw.client.post(
            "/v1/completions", json={"prompt": "hi", "max_tokens": 3, "model": "fake/Qwen3-0.6B"}
        )
        assert r.status_code == 200 and r.json()["object"] == "text_completion"
        r = await gw.client.get("/v1/models")
        assert r.status_code == 200
        assert [m["id"] for m in r.json()["data"]] == ["fake/Qwen3-0.6B"]
        assert r.json()["object"] == "list"
        # Quart's routes are untouched by the data-plane front.
        assert (await gw.client.get("/v1/rl/workers")).json()["total"] == 2
        assert (await gw.client.get("/liveness")).status_code == 200


async def test_a_generate_without_model_is_forwarded_without_one_and_openai_routes_require_it():
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(ScriptedEngine().serve)
        async with gateway_in_process(cfg(), worker_urls=[engine.url]) as gw:
            raw = b'{"text": "x", "sampling_params": {"max_new_tokens": 1}}'
            r = await gw.client.post(
                "/generate",
                content=raw,
                headers={"authorization": "Bearer caller", "x-custom": "1"},
            )
            assert r.status_code == 200
            seen = engine.seen[-1]
            assert seen.body == raw  # byte for byte: no "model": "unknown" added
            assert seen.path == "/generate"
            assert "authorization" not in seen.headers and "x-custom" not in seen.headers
            # /generate without a content type (SMG: 415) is forwarded as JSON (deviations.md).
            assert seen.headers["content-type"] == "application/json"
            # An OpenAI request without `model` is SMG's 400, the engine never sees it.
            calls = len(engine.seen)
            r = await gw.client.post(
                "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
            )
            assert r.status_code == 400
            assert r.json()["error"]["code"] == "missing_required_parameter"
            assert r.json()["error"]["param"] == "model"
            r = await gw.client.post("/v1/completions", json={"prompt": "x"})
            assert r.status_code == 400 and r.json()["error"]["param"] == "model"
            assert len(engine.seen) == calls
            # The caller's model name is forwarded as given.
            raw = json.dumps({"model": PROBE_MODEL, "prompt": "x"}).encode()
            r = await gw.client.post(
                "/v1/completions", content=raw, headers={"content-type": "application/json"}
            )
            assert r.status_code == 200
            assert engine.seen[-1].body == raw
        nursery.cancel_scope.cancel()


# The OpenAI routes' refusals: SMG 1.13.0's status, code, param and text (checked side by
# side: tests/conformance/cases/dataplane.jsonl), answered before any engine is called.
MSGS = [{"role": "user", "content": "hi"}]
OPENAI_REFUSALS = [
    (
        "/v1/chat/completions",
        b"not json",
        "invalid_json",
        None,
        "JSON syntax error: Failed to parse the request body as JSON: expected ident at line 1 column 2",
    ),
    (
        "/v1/chat/completions",
        b'{"model": 7, "messages": []}',
        "invalid_type",
        "model",
        (
            "Invalid JSON data: Failed to deserialize the JSON body into the target type: model: invalid "
            "type: integer `7`, expected a string at line 1 column 11"
        ),
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": PROBE_MODEL}).encode(),
        "missing_required_parameter",
        "messages",
        (
            "Invalid JSON data: Failed to deserialize the JSON body into the target type: missing field "
            "`messages` at line 1 column 27"
        ),
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": PROBE_MODEL, "messages": [{"role": "bogus"}]}).encode(),
        "invalid_value",
        "messages[0].role",
        (
            "Invalid JSON data: Failed to deserialize the JSON body into the target type: messages[0].role: "
            "unknown variant `bogus`, expected one of `system`, `user`, `assistant`, `tool`, `function`, "
            "`developer`, `root` at line 1 column 57"
        ),
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": PROBE_MODEL, "messages": MSGS, "max_tokens": -1}).encode(),
        "integer_below_min_value",
        "max_tokens",
        None,
    ),
    (
        "/v1/chat/completions",
        json.dumps({"model": PROBE_MODEL, "messages": []}).encode(),
        "empty_array",
        "messages",
        None,
    ),
    (
        "/v1/completions",
        json.dumps({"model": PROBE_MODEL, "prompt": 7}).encode(),
        "invalid_type",
        "prompt",
        None,
    ),
    # A lone surrogate and 1,000-deep nesting are SMG's 400 invalid_json, not a 500.
    (
        "/v1/chat/completions",
        b'{"model": "\\ud800", "messages": []}',
        "invalid_json",
        None,
        (
            "JSON syntax error: Failed to parse the request body as JSON: model: unexpected end of hex "
            "escape at line 1 column 18"
        ),
    ),
    (
        "/v1/chat/completions",
        b'{"model": "m", "x": ' + b"[" * 1000 + b"]" * 1000 + b"}",
        "invalid_json",
        None,
        None,
    ),
    (
        "/v1/completions",
        b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
        "invalid_json",
        None,
        (
            "JSON syntax error: Failed to parse the request body as JSON: max_tokens: number out of range "
            "at line 1 column 5044"
        ),
    ),
]


@pytest.mark.parametrize(("path", "body", "code", "param", "message"), OPENAI_REFUSALS)
async def test_openai_bodies_are_refused_as_smg_refuses_them(path, body, code, param, message):
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(ScriptedEngine().serve)
        async with gateway_in_process(cfg(), worker_urls=[engine.url]) as gw:
            calls = len(engine.seen)
            r = await gw.client.post(path, content=body, headers={"content-type": "application/json"})
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
            if message is not None:
                assert error["message"] == message
            assert len(engine.seen) == calls
        nursery.cancel_scope.cancel()


async def test_openai_routes_need_a_json_content_type_and_name_unknown_models_as_smg():
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(ScriptedEngine().serve)
        async with gateway_in_process(cfg(), worker_urls=[engine.url]) as gw:
            body = json.dumps({"model": PROBE_MODEL, "messages": MSGS}).encode()
            r = await gw.client.post("/v1/chat/completions", content=body)
            assert r.status_code == 400
            assert r.json()["error"] == {
                "type": "invalid_request_error",
                "code": "json_parse_error",
                "message": "Missing Content-Type: application/json header",
                "param": None,
            }
            body = json.dumps({"model": "nope", "messages": MSGS}).encode()
            r = await gw.client.post("/v1/chat/completions", json={"model": "nope", "messages": MSGS})
            assert r.status_code == 404
            assert r.json()["error"] == {
                "type": "invalid_request_error",
                "code": "model_not_found",
                "message": "No worker available for model 'nope'",
                "param": None,
            }
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        (b"not json", 400, "invalid_json", None),
        (b"[1]", 422, "invalid_type", None),
        (b'{"model": 7, "text": "x"}', 422, "invalid_type", "model"),
        (b'{"model": "\\ud800", "text": "x"}', 400, "invalid_json", None),
        (b'{"text": "x", "y": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400, "invalid_json", None),
        # More digits than Python's int() takes (4,300) answered 500 before: serde's f64, out of range.
        (
            b'{"text": "x", "sampling_params": {"max_new_tokens": ' + b"9" * 5000 + b"}}",
            400,
            "invalid_json",
            None,
        ),
        (b'{"text": "x", "rid": ' + b"9" * 5000 + b"}", 400, "invalid_json", None),
    ],
)
async def test_generate_refusals_are_json_envelopes_with_smgs_codes(body, status, code, param):
    async with gateway_in_process(cfg()) as gw:
        r = await gw.client.post("/generate", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status and r.headers["content-type"] == "application/json"
        assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param)
        assert r.headers["x-smg-error-code"] == code


async def test_model_rules_with_several_models():
    async with (
        fake_fleet("sglang", n=1) as a,
        fake_fleet("sglang", n=1, served_model_name="other/model") as b,
        gateway_in_process(cfg(), worker_urls=[*a.urls, *b.urls]) as gw,
    ):
        r = await gw.client.post("/generate", json=GEN)
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "model_required"
        assert (
            "fake/Qwen3-0.6B" in r.json()["error"]["message"]
            and "other/model" in r.json()["error"]["message"]
        )
        assert r.headers["x-smg-error-code"] == "model_required"
        r = await gw.client.post("/generate", json={**GEN, "model": "other/model"})
        assert r.status_code == 200
        assert r.headers["x-smgrl-worker-id"] == gw.gateway.fleet.registry.id_for_url(b.urls[0])
        r = await gw.client.post("/generate", json={**GEN, "model": "nope"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        models = (await gw.client.get("/v1/models")).json()["data"]
        assert [m["id"] for m in models] == ["fake/Qwen3-0.6B", "other/model"]


async def test_errors_before_any_engine_is_called():
    async with gateway_in_process(cfg(max_payload_size=64)) as gw:
        r = await gw.client.post("/generate", json=GEN)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_available_workers"
        assert r.json()["error"]["retryable"] is True
        r = await gw.client.post("/generate", content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"
        r = await gw.client.post("/generate", content=b"[1, 2]")
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_type"
        r = await gw.client.get("/generate")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert r.json()["error"]["code"] == "method_not_allowed"
        r = await gw.client.post("/generate", content=b"x" * 65)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_body_too_large"
        r = await gw.client.post("/v1/models")
        assert r.status_code == 405 and r.headers["allow"] == "GET,HEAD"
        assert (await gw.client.get("/v1/models")).json() == {"object": "list", "data": []}


async def test_data_plane_keys():
    config = cfg(api_key="secret")
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(config, worker_urls=fleet.urls) as gw:
        r = await gw.client.post("/generate", json=GEN)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = await gw.client.post("/generate", json=GEN, headers={"authorization": "Bearer wrong"})
        assert r.status_code == 401
        r = await gw.client.post("/generate", json=GEN, headers={"authorization": "Bearer secret"})
        assert r.status_code == 200


async def test_streams_are_relayed_chunk_by_chunk():
    """The first chunk reaches the client while the engine still holds the rest: no buffering."""
    release = trio.Event()

    async def script(req, w):
        await w.start()
        await w.chunk(b'data: {"text": "a"}\n\n')
        await release.wait()
        await w.chunk(b'data: {"text": "ab"}\n\n')
        await w.chunk(b"data: [DONE]\n\n")
        await w.end()

    engine = ScriptedEngine(script)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.serve)
        async with gateway_on_loopback(cfg(worker_urls=(engine.url,))) as gw:
            await gw.wait_routable(1)
            body = {"text": "x", "stream": True}
            async with gw.client.stream("POST", "/generate", json=body) as r:
                assert r.status_code == 200
                assert r.headers["content-type"] == "text/event-stream"
                assert r.headers["x-smgrl-worker-id"]
                chunks = r.aiter_raw()
                first = await chunks.__anext__()
                assert first == b'data: {"text": "a"}\n\n'
                assert engine.active == 1  # the engine has not finished: nothing was buffered
                release.set()
                rest = b"".join([c async for c in chunks])
            assert rest == b'data: {"text": "ab"}\n\ndata: [DONE]\n\n'
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("stream", [True, False])
async def test_a_client_disconnect_cancels_the_engine_call(stream):
    engine_saw_close = trio.Event()
    started = trio.Event()

    async def script(req, w):
        if stream:
            await w.start()
            await w.chunk(b'data: {"text": "a"}\n\n')
        started.set()
        # The engine keeps the request open until the gateway hangs up on it.
        data = await w.stream.receive_some(1024)
        assert data == b""
        engine_saw_close.set()
        w.close_after = True

    engine = ScriptedEngine(script)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.serve)
        async with gateway_on_loopback(cfg(worker_urls=(engine.url,))) as gw:
            await gw.wait_routable(1)

            async def call(client):
                async with client.stream("POST", "/generate", json={"text": "x", "stream": stream}) as r:
                    async for _ in r.aiter_raw():
                        pass

            with trio.fail_after(10):
                async with httpx.AsyncClient(base_url=gw.base) as client, trio.open_nursery() as inner:
                    inner.start_soon(call, client)
                    await started.wait()
                    inner.cancel_scope.cancel()  # the client goes away mid-request
                await engine_saw_close.wait()
        nursery.cancel_scope.cancel()


async def test_streams_from_the_fake_engines_end_with_done():
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        for path, body in (
            ("/generate", {"text": "hi", "stream": True, "sampling_params": {"max_new_tokens": 3}}),
            (
                "/v1/completions",
                {"model": "fake/Qwen3-0.6B", "prompt": "hi", "stream": True, "max_tokens": 3},
            ),
            (
                "/v1/chat/completions",
                {
                    "model": "fake/Qwen3-0.6B",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": True,
                    "max_tokens": 3,
                },
            ),
        ):
            r = await gw.client.post(path, json=body)
            assert r.status_code == 200, path
            assert r.text.endswith("data: [DONE]\n\n"), path


async def test_an_unexpected_error_in_the_raw_front_is_the_internal_error_envelope_and_logged(caplog):
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(ScriptedEngine().serve)
        async with gateway_in_process(cfg(), worker_urls=[engine.url]) as gw:
            dataplane = gw.app.dataplane

            def broken(model):  # a fault injected where a bug could be: not bad input
                raise RuntimeError("a bug")

            dataplane.resolve_model = broken
            with caplog.at_level(logging.ERROR, logger="smgrl.dataplane"):
                r = await gw.client.post("/generate", json={"text": "x"})
            assert r.status_code == 500
            assert r.json()["error"]["code"] == "internal_error"
            assert r.headers["x-smg-error-code"] == "internal_error" and r.headers["x-request-id"]
            logged = [rec for rec in caplog.records if rec.name == "smgrl.dataplane"]
            assert logged and logged[-1].exc_info and "a bug" in str(logged[-1].exc_info[1])
        nursery.cancel_scope.cancel()


async def test_request_ids_follow_smgs_headers_and_prefixes_and_models_are_self_hosted():
    # SMG 1.13.0 takes the id from x-request-id, x-correlation-id,
    # x-trace-id, request-id (the first present) and echoes it; a generated id has OpenAI's prefix.
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(ScriptedEngine().serve)
        async with gateway_in_process(cfg(), worker_urls=[engine.url]) as gw:
            chat = {"model": PROBE_MODEL, "messages": [{"role": "user", "content": "x"}]}
            cases = [
                ({"x-correlation-id": "corr-1", "x-trace-id": "tr-1"}, "corr-1"),
                ({"x-trace-id": "tr-1", "request-id": "r-1"}, "tr-1"),
                ({"request-id": "r-1"}, "r-1"),
                ({"x-request-id": "own", "x-correlation-id": "corr-1"}, "own"),
            ]
            for headers, expected in cases:
                r = await gw.client.post("/v1/chat/completions", json=chat, headers=headers)
                assert r.status_code == 200 and r.headers["x-request-id"] == expected, headers
                assert engine.seen[-1].headers["x-request-id"] == expected  # forwarded as well
                r = await gw.client.get("/v1/rl/workers", headers=headers)
                assert r.headers["x-request-id"] == expected, headers
            # Over 128 characters: a new id (SMG does not fall through to the next header).
            r = await gw.client.post(
                "/v1/chat/completions", json=chat, headers={"x-correlation-id": "a" * 200, "x-trace-id": "t"}
            )
            assert r.headers["x-request-id"].startswith("chatcmpl-")
            r = await gw.client.post("/v1/completions", json={"model": PROBE_MODEL, "prompt": "x"})
            assert r.headers["x-request-id"].startswith("cmpl-") and len(r.headers["x-request-id"]) == 29
            r = await gw.client.get("/v1/models")
            assert r.headers["x-request-id"].startswith("req-")
            assert r.json()["data"] == [
                {"id": PROBE_MODEL, "object": "model", "created": 0, "owned_by": "self_hosted"}
            ]
        nursery.cancel_scope.cancel()


async def test_a_refit_from_disk_never_makes_the_registered_model_name_404(tmp_path):
    # After update_weights_from_disk SGLang names the checkpoint path in its answers'
    # `model` (and its own /v1/models); clients that keep sending the registered name must still
    # be routed, and the engine's own `model` field is relayed untouched, as SMG does.
    name = "fake/Qwen3-0.6B"
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        ckpt = str(make_checkpoint(tmp_path / "step-42", name, seed=42))
        r = await gw.client.post(
            "/v1/rl/engine/update_weights_from_disk",
            params={"selector": "engine=sglang"},
            json={"model_path": ckpt, "weight_version": "42"},
        )
        assert r.status_code == 200, r.text
        chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for _ in range(4):  # both engines (round robin or not, each is reached in 4 with 2)
            r = await gw.client.post("/v1/chat/completions", json=chat)
            assert r.status_code == 200, r.text
            assert r.json()["model"] == ckpt  # the engine's own name, passed through
        r = await gw.client.post("/v1/completions", json={"model": name, "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200 and r.json()["model"] == ckpt
        assert [m["id"] for m in (await gw.client.get("/v1/models")).json()["data"]] == [name]
        # Routing accepts the registered name only (docs/data-plane.md).
        r = await gw.client.post("/v1/chat/completions", json={**chat, "model": ckpt})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


async def test_a_model_card_by_id_as_smg():
    """GET /v1/models/{model} (SMG 1.13.0: the card of /v1/models' list; the id may hold
    slashes; 404 model_not_found otherwise; GET/HEAD only)."""
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(Config(), worker_urls=fleet.urls) as gw:
        r = await gw.client.get("/v1/models/fake/Qwen3-0.6B")
        assert r.status_code == 200
        assert r.json() == {
            "id": "fake/Qwen3-0.6B",
            "object": "model",
            "created": 0,
            "owned_by": "self_hosted",
        }
        assert r.json() == (await gw.client.get("/v1/models")).json()["data"][0]
        missing = await gw.client.get("/v1/models/nope")
        assert missing.status_code == 404 and missing.headers["x-smg-error-code"] == "model_not_found"
        assert missing.json() == {
            "error": {
                "type": "invalid_request_error",
                "code": "model_not_found",
                "message": "No worker available for model 'nope'",
                "param": None,
            }
        }
        wrong = await gw.client.post("/v1/models/nope")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET,HEAD"
        assert (await gw.client.get("/v1/models/")).json()["error"]["code"] == "unknown_url"


@pytest.mark.parametrize("pieces", [1, 3])
async def test_a_body_whole_or_in_pieces_reaches_the_engine_byte_for_byte(pieces):
    """On the real server: a body that came with its head is taken at once (no deadline
    scopes), one still arriving is read under the body bounds; the engine gets the same bytes."""
    engine = ScriptedEngine()
    body = json.dumps({"text": "hello there", "sampling_params": {"max_new_tokens": 4}}).encode()
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.serve)
        async with gateway_on_loopback(cfg(worker_urls=(engine.url,))) as gw:
            await gw.wait_routable(1)
            stream = await trio.open_tcp_stream("127.0.0.1", int(gw.base.rsplit(":", 1)[1]))
            head = b"POST /generate HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n"
            await stream.send_all(head + b"content-length: %d\r\n\r\n" % len(body))
            cut = len(body) // pieces
            for i in range(pieces):
                if i:
                    await trio.testing.wait_all_tasks_blocked()  # the gateway waits for the rest
                await stream.send_all(body[i * cut : None if i == pieces - 1 else (i + 1) * cut])
            answer = b""
            with trio.fail_after(10):
                while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                    answer += await stream.receive_some(65536)
            assert answer.startswith(b"HTTP/1.1 200")
            await stream.aclose()
        nursery.cancel_scope.cancel()
    assert [s.body for s in engine.seen if s.path == "/generate"] == [body]

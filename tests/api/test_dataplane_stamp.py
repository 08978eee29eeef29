"""Stamping through the gateway: x-smg-weight-version, x-smg-routed-worker-id,
x-smg-mixed-version, x-version-tag and system_fingerprint, buffered and streamed."""

from __future__ import annotations

import json

import trio

from smgrl.core.config import Config, RlConfig
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process
from smgrl.testing.dataplane import PROBE_MODEL, ScriptedEngine

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}
CHAT = {"model": PROBE_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def cfg() -> Config:
    return Config(rl=RlConfig(enabled=True, control_timeout_secs=10), policy="round_robin")


FAKE_CHAT = {**CHAT, "model": "fake/Qwen3-0.6B"}


def sse_events(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: ") and block != "data: [DONE]":
            out.append(json.loads(block[6:]))
    return out


async def test_responses_carry_the_weight_version_once_known_and_follow_a_refit():
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        r = await gw.client.post("/generate", json=GEN)
        assert r.headers["x-smg-weight-version"] == "default"  # never refitted: SGLang's placeholder
        assert r.headers["x-version-tag"] == "-1"
        assert r.headers["x-smgrl-worker-id"] == wid
        assert "x-smg-mixed-version" not in r.headers

        refit = {"model_path": fleet[0].config.model_path, "weight_version": "v7"}
        r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/update_weights_from_disk", json=refit)
        assert r.status_code == 200, r.text

        r = await gw.client.post("/generate", json=GEN)
        assert r.json()["meta_info"]["weight_version"] == "v7"
        assert r.headers["x-smg-weight-version"] == "v7" and r.headers["x-version-tag"] == "v7"
        r = await gw.client.post("/v1/chat/completions", json=FAKE_CHAT)
        assert r.headers["x-smg-weight-version"] == "v7"
        assert r.json()["system_fingerprint"] == "v7"
        r = await gw.client.post(
            "/v1/completions", json={"model": FAKE_CHAT["model"], "prompt": "x", "max_tokens": 2}
        )
        assert r.json()["system_fingerprint"] == "v7"

        # Streams: the head names the table's version, every OpenAI event carries it too.
        r = await gw.client.post("/generate", json={**GEN, "stream": True})
        assert r.headers["x-smg-weight-version"] == "v7" and "x-smg-mixed-version" not in r.headers
        assert {e["meta_info"]["weight_version"] for e in sse_events(r.text)} == {"v7"}
        r = await gw.client.post("/v1/chat/completions", json={**FAKE_CHAT, "stream": True})
        assert r.headers["x-smg-weight-version"] == "v7"
        events = sse_events(r.text)
        assert events and {e["system_fingerprint"] for e in events} == {"v7"}
        assert r.text.endswith("data: [DONE]\n\n")


def scripted_generate(meta: dict):
    async def script(req, w):
        obj = json.loads(req.body)
        if obj.get("stream"):
            await w.start()
            await w.chunk(b"data: " + json.dumps({"text": "a", "meta_info": meta}).encode() + b"\n\n")
            await w.chunk(b"data: [DONE]\n\n")
            await w.end()
            return
        await w.full(200, json.dumps({"text": "a", "meta_info": meta}).encode())

    return script


async def test_buffered_generate_flags_mixed_versions_and_streams_are_never_flagged():
    cases = [
        ({"weight_version": "v2", "weight_versions": [{"version": "v1"}, {"version": "v2"}]}, True),
        ({"weight_version": "v1"}, False),
        ({"weight_version": "v3"}, True),  # drifted from the table's v1
    ]
    for meta, mixed in cases:
        engine = ScriptedEngine(scripted_generate(meta))
        async with trio.open_nursery() as nursery:
            await nursery.start(engine.serve)
            async with gateway_in_process(cfg()) as gw:
                await gw.register([engine.url], labels={"weight_version": "v1"})
                r = await gw.client.post("/generate", json={"text": "x"})
                assert r.status_code == 200
                assert (r.headers.get("x-smg-mixed-version") == "true") is mixed, meta
                assert r.headers["x-smg-weight-version"] == meta["weight_version"]
                r = await gw.client.post("/generate", json={"text": "x", "stream": True})
                assert "x-smg-mixed-version" not in r.headers
                # The head waited for the first event: the engine's version, not the table's v1.
                assert r.headers["x-smg-weight-version"] == meta["weight_version"]
                r = await gw.client.post(
                    "/v1/completions", json={"model": PROBE_MODEL, "prompt": "x", "stream": True}
                )
                assert r.headers["x-smg-weight-version"] == "v1"  # OpenAI streams: the table's
            nursery.cancel_scope.cancel()


async def test_a_single_prompt_generate_never_answers_a_one_element_list():
    async def script(req, w):
        await w.full(200, json.dumps([{"text": "a", "meta_info": {"weight_version": "v1"}}]).encode())

    engine = ScriptedEngine(script)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.serve)
        async with gateway_in_process(cfg(), worker_urls=[engine.url]) as gw:
            r = await gw.client.post("/generate", json={"text": "x"})
            assert r.json() == {"text": "a", "meta_info": {"weight_version": "v1"}}
            r = await gw.client.post("/generate", json={"text": ["x"]})
            assert isinstance(r.json(), list)
        nursery.cancel_scope.cancel()


async def test_engine_errors_are_relayed_untouched_with_the_table_version():
    async def script(req, w):
        await w.full(400, b'{"error": "bad request"}')

    engine = ScriptedEngine(script)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.serve)
        async with gateway_in_process(cfg()) as gw:
            await gw.register([engine.url], labels={"weight_version": "v4"})
            r = await gw.client.post("/v1/chat/completions", json=CHAT)
            assert r.status_code == 400 and r.content == b'{"error": "bad request"}'
            assert r.headers["x-smg-weight-version"] == "v4"
        nursery.cancel_scope.cancel()

"""Partial-rollout loopback of text prompts and the OpenAI routes, with the gateway holding the
model's tokenizer (--tokenizer-path); without it they answer the engine's abort. In process, real
fake engines on loopback using the same tokenizer."""

from __future__ import annotations

import json

import pytest
import trio

from smgrl.core.config import Config, DataPlaneConfig, RlConfig, SessionsConfig
from smgrl.fake import fake_fleet, model
from smgrl.testing import gateway_in_process

N = 30


def cfg(model_dir=None) -> Config:
    sessions = SessionsConfig(tokenizer_path=str(model_dir)) if model_dir is not None else SessionsConfig()
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        dataplane=DataPlaneConfig(max_loopbacks=8),
        sessions=sessions,
    )


@pytest.fixture
def chat(model_dirs):
    with model.tokenizer_scope(model_dirs["chatml"]) as chat:
        yield chat


async def decoded(engine, k: int) -> None:
    def ready() -> bool:
        return any(len(j.output_ids) >= k and j.finish is None for j in engine.scheduler.jobs.values())

    assert await engine.wait_until(ready, timeout=30)


async def synced(gw, fleet, path: str, body: dict, k: int = 5):
    """POST ``body`` to ``path``; once the engine decoded ``k`` tokens, sync it through the
    gateway (pause in abort mode, a new version, resume). Returns the answer."""
    engine = fleet.engines[0]
    wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
    box = {}

    async def call():
        box["r"] = await gw.client.post(path, json=body)

    async with trio.open_nursery() as n:
        n.start_soon(call)
        await decoded(engine, k)
        for op, payload in (
            ("pause_generation", {"mode": "abort"}),
            ("update_weight_version", {"new_version": "2", "abort_all_requests": False}),
            ("continue_generation", {}),
        ):
            r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/{op}", json=payload)
            assert r.status_code == 200, r.text
    return box["r"]


def looped(gw) -> list:
    return [rec.event for rec in gw.store.read() if rec.event.TYPE == "dataplane.request_looped_back"]


async def test_a_text_prompt_is_tokenized_and_looped_back(chat, model_dirs):
    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=1, token_latency_ms=3, weight_version="1") as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            text = "tell me a long story"
            body = {"text": text, "sampling_params": {"max_new_tokens": N, "ignore_eos": True}}
            r = await synced(gw, fleet, "/generate", body)
            assert r.status_code == 200, r.text
            out = r.json()
            meta = out["meta_info"]
            ids = out["output_ids"]
            assert len(ids) == N and meta["completion_tokens"] == N
            first, second = meta["segments"]
            k = first["end"]
            assert k >= 5 and (second["start"], second["end"]) == (k, N)
            assert meta["weight_versions"] == [
                {"version": "1", "start": 0, "end": k},
                {"version": "2", "start": k, "end": N},
            ]
            last = fleet.engines[0].calls_to("/generate")[-1].json_body()
            assert last["input_ids"] == chat.encode(text) + ids[:k] and "text" not in last
            (ev,) = looped(gw)
            assert ev.tokens_kept == k and ev.outcome == "completed"


async def test_completions_and_chat_are_looped_back_as_token_in_completions(chat, model_dirs):
    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=1, token_latency_ms=3, weight_version="1") as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            engine = fleet.engines[0]
            name = gw.app.dataplane.served_models()[0]
            prompt = "once upon a time"
            body = {"model": name, "prompt": prompt, "max_tokens": N, "ignore_eos": True}
            r = await synced(gw, fleet, "/v1/completions", body)
            assert r.status_code == 200, r.text
            out = r.json()
            (choice,) = out["choices"]
            first, second = choice["segments"]
            k = first["end"]
            assert out["usage"]["completion_tokens"] == N and out["usage"]["prompt_tokens"] == len(
                chat.encode(prompt)
            )
            assert choice["finish_reason"] == "length" and (second["start"], second["end"]) == (k, N)
            assert [s["version"] for s in choice["weight_versions"]] == ["1", "2"]
            cont = engine.calls_to("/v1/completions")[-1].json_body()
            head = chat.encode(prompt)
            partial = chat.decode(cont["prompt"][len(head) :])
            assert cont["prompt"][: len(head)] == head and cont["max_tokens"] == N - k
            assert partial and choice["text"].startswith(partial)  # the kept text, re-tokenized

            messages = [{"role": "user", "content": "write a poem"}]
            body = {"model": name, "messages": messages, "max_tokens": N, "ignore_eos": True}
            r = await synced(gw, fleet, "/v1/chat/completions", body)
            assert r.status_code == 200, r.text
            out = r.json()
            assert out["object"] == "chat.completion"
            (choice,) = out["choices"]
            k = choice["segments"][0]["end"]
            assert out["usage"]["completion_tokens"] == N and choice["finish_reason"] == "length"
            cont = engine.calls_to("/v1/completions")[-1].json_body()
            head = chat.tokenize_messages(messages)
            assert cont["prompt"][: len(head)] == head and cont["max_tokens"] == N - k
            partial = chat.decode(cont["prompt"][len(head) :])
            assert partial and choice["message"]["content"].startswith(partial)
            assert len(looped(gw)) == 2


async def test_without_a_tokenizer_the_openai_routes_answer_the_engines_abort(chat):
    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=1, token_latency_ms=3) as fleet,
            gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
        ):
            name = gw.app.dataplane.served_models()[0]
            body = {"model": name, "prompt": "once upon a time", "max_tokens": N, "ignore_eos": True}
            r = await synced(gw, fleet, "/v1/completions", body)
            assert r.json()["choices"][0]["finish_reason"] == "abort"
            assert not looped(gw)


def sse(text: str) -> list[dict]:
    return [json.loads(b[6:]) for b in text.split("\n\n") if b.startswith("data: {")]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_openai_streams_continue_across_the_loopback(chat, model_dirs, route):
    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=1, token_latency_ms=3, weight_version="1") as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            name = gw.app.dataplane.served_models()[0]
            prompt = (
                {"messages": [{"role": "user", "content": "a poem"}]}
                if "chat" in route
                else {"prompt": "a poem"}
            )
            body = {"model": name, **prompt, "max_tokens": N, "ignore_eos": True, "stream": True}
            plain = await gw.client.post(route, json={**body, "stream_options": {"include_usage": True}})
            assert (
                plain.text.count("data: [DONE]") == 1
                and sse(plain.text)[-1]["usage"]["completion_tokens"] == N
            )
            r = await synced(gw, fleet, route, {**body, "stream_options": {"include_usage": True}})
            assert r.status_code == 200, r.text
            assert r.text.endswith("data: [DONE]\n\n") and r.text.count("[DONE]") == 1
            events = sse(r.text)
            usage = events.pop()
            assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == N
            assert len({e["id"] for e in events}) == 1  # one stream, the first leg's id
            finishes = [e["choices"][0]["finish_reason"] for e in events]
            assert finishes[-1] == "length" and set(finishes[:-1]) == {None}  # no abort in sight
            text = "".join(
                (e["choices"][0].get("delta") or {}).get("content") or ""
                if "chat" in route
                else e["choices"][0]["text"]
                for e in events
            )
            last = events[-1]["choices"][0]
            k = last["segments"][0]["end"]
            assert [s["version"] for s in last["weight_versions"]] == ["1", "2"] and 0 < k < N
            cont = fleet.engines[0].calls_to("/v1/completions")[-1].json_body()
            head = (
                chat.tokenize_messages(prompt["messages"])
                if "chat" in route
                else chat.encode(prompt["prompt"])
            )
            partial = chat.decode(cont["prompt"][len(head) :])
            assert cont["prompt"][: len(head)] == head and partial and text.startswith(partial)
            assert cont["stream"] is True and cont["max_tokens"] == N - k
            (ev,) = looped(gw)
            assert ev.tokens_kept == k and ev.generated_tokens == N and ev.outcome == "completed"

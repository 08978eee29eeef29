"""Rollouts on gRPC engines, in process: every wire (SGLang, vLLM upstream, vLLM as PSRL's fork
speaks it, TokenSpeed) answers /generate and the OpenAI routes with what the HTTP SGLang fake
answers for the same weights and prompt (the fake's tokens are a function of the weights and
the context), buffered and streamed; the DP rank of a PSRL-style registration reaches the engine."""

from __future__ import annotations

import contextlib
import json

import httpx
import pytest
import trio
from rl_api_helpers import ADMIN, rl_cfg

from smgrl.core.config import SessionsConfig
from smgrl.fake import fake_fleet, model
from smgrl.fake.grpc_front import GrpcFront
from smgrl.testing import gateway_in_process
from smgrl.tito.testkit import make_model_dir
from smgrl.upstream import WIRES

WIRE_KINDS = [("sglang", "sglang"), ("vllm", "vllm"), ("vllm", "vllm-psrl"), ("tokenspeed", "tokenspeed")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("grpc-model") / "chatml", "chatml")


@contextlib.asynccontextmanager
async def grpc_gateway(model_dir, kind: str, wire: str, labels=None, **config):
    """A fake engine of ``kind`` served over ``wire``, an HTTP SGLang fake with the same weights
    (the reference), and a gateway with the gRPC one registered."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with (
            fake_fleet(kind, 1, **config) as fleet,
            fake_fleet("sglang", 1, **config) as reference,
            trio.open_nursery() as nursery,
        ):
            front = await nursery.start(GrpcFront(fleet[0], WIRES[wire]).serve)
            cfg = rl_cfg(sessions=SessionsConfig(tokenizer_path=str(model_dir)))
            async with gateway_in_process(cfg) as gw:
                payload = {"url": front.url, "connection_mode": "grpc", "runtime": kind,
                           "labels": {"rl.control_url": fleet[0].url, **(labels or {})}}  # fmt: skip
                r = await gw.client.post("/workers", json=payload, headers=ADMIN)
                assert r.status_code == 202, r.text
                await wait_routable(gw)
                async with httpx.AsyncClient(base_url=reference[0].url, timeout=30) as ref:
                    yield gw, ref, front
            nursery.cancel_scope.cancel()


async def wait_routable(gw) -> None:
    while not gw.gateway.dataplane.served_models() or gw.gateway.dataplane.served_models() == ["unknown"]:
        await trio.sleep(0.02)


def events(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: ") and block != "data: [DONE]":
            out.append(json.loads(block[6:]))
    return out


@pytest.mark.parametrize(("kind", "wire"), WIRE_KINDS)
async def test_generate_with_input_ids_answers_as_the_http_engine(model_dir, kind, wire):
    async with grpc_gateway(model_dir, kind, wire) as (gw, ref, _front):
        body = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 12, "temperature": 0}}
        want = (await ref.post("/generate", json=body)).json()
        r = await gw.client.post("/generate", json=body)  # no `model`: the fleet's one model
        assert r.status_code == 200, r.text
        got = r.json()
        assert isinstance(got, dict)  # a single prompt answers one object
        assert got["output_ids"] == want["output_ids"]
        assert got["text"] == want["text"]
        assert got["meta_info"]["finish_reason"]["type"] == want["meta_info"]["finish_reason"]["type"]
        assert got["meta_info"]["completion_tokens"] == len(want["output_ids"])
        # Streamed: SGLang's cumulative events, the last one finished, the last token once.
        r = await gw.client.post("/generate", json={**body, "stream": True})
        assert r.status_code == 200, r.text
        evs = events(r.text)
        assert r.text.endswith("data: [DONE]\n\n")
        assert evs[-1]["output_ids"] == want["output_ids"] and evs[-1]["text"] == want["text"]
        assert evs[-1]["meta_info"]["finish_reason"] is not None
        assert all(e["meta_info"]["finish_reason"] is None for e in evs[:-1])
        assert len(evs) <= len(want["output_ids"]) + 1


@pytest.mark.parametrize(("kind", "wire"), [("sglang", "sglang"), ("vllm", "vllm-psrl")])
async def test_text_and_openai_routes_are_tokenized_by_the_gateway(model_dir, kind, wire):
    async with grpc_gateway(model_dir, kind, wire) as (gw, ref, _front):
        body = {"text": "hello there", "sampling_params": {"max_new_tokens": 10}}
        want = (await ref.post("/generate", json=body)).json()
        got = (await gw.client.post("/generate", json=body)).json()
        assert got["output_ids"] == want["output_ids"] and got["text"] == want["text"]
        name = gw.gateway.dataplane.served_models()[0]
        chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
        want = (await ref.post("/v1/chat/completions", json=chat)).json()
        r = await gw.client.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200, r.text
        got = r.json()
        assert got["object"] == "chat.completion"
        assert got["choices"][0]["message"]["content"] == want["choices"][0]["message"]["content"]
        assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
        assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
        r = await gw.client.post(
            "/v1/chat/completions", json={**chat, "stream": True, "stream_options": {"include_usage": True}}
        )
        evs = events(r.text)
        assert evs[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(e["choices"][0]["delta"].get("content", "") for e in evs if e["choices"])
        assert text == want["choices"][0]["message"]["content"]
        assert evs[-1]["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
        comp = {"model": name, "prompt": "hello there", "max_tokens": 7}
        want = (await ref.post("/v1/completions", json=comp)).json()
        got = (await gw.client.post("/v1/completions", json=comp)).json()
        assert got["choices"][0]["text"] == want["choices"][0]["text"]
        r = await gw.client.post("/v1/completions", json={**comp, "stream": True})
        text = "".join(e["choices"][0]["text"] for e in events(r.text) if e["choices"])
        assert text == want["choices"][0]["text"]


async def test_a_psrl_registration_pins_its_dp_rank(model_dir):
    labels = {"dp_size": "2"}
    async with grpc_gateway(model_dir, "vllm", "vllm-psrl", labels, dp_size=2) as (gw, _ref, front):
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}}
        for _ in range(4):
            r = await gw.client.post("/generate", json=body)
            assert r.status_code == 200, r.text
        assert len(front.ranks) == 4

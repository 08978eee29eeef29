"""Rollouts on gRPC engines, in process: every wire (SGLang, vLLM upstream, vLLM as PSRL's fork
speaks it, TokenSpeed) answers /generate and the OpenAI routes with what the HTTP SGLang fake
answers for the same weights and prompt (the fake's tokens are a function of the weights and
the context), buffered and streamed; the DP rank of a PSRL-style registration reaches the engine."""

from __future__ import annotations

import contextlib
import functools
import json

import httpx
import pytest
import trio
from rl_api_helpers import ADMIN, rl_cfg

from smgrl.core.config import SessionsConfig
from smgrl.fake import fake_fleet, model
from smgrl.fake.grpc_front import GrpcFront
from smgrl.testing import gateway_in_process
from smgrl.testing.dataplane import gateway_on_loopback
from smgrl.tito.testkit import make_model_dir
from smgrl.upstream import WIRES

WIRE_KINDS = [("sglang", "sglang"), ("vllm", "vllm"), ("vllm", "vllm-psrl"), ("tokenspeed", "tokenspeed")]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("grpc-model") / "chatml", "chatml")


@contextlib.asynccontextmanager
async def grpc_gateway(model_dir, kind: str, wire: str, labels=None, policy="cache_aware", **config):
    """A fake engine of ``kind`` served over ``wire``, an HTTP SGLang fake with the same weights
    (the reference), and a gateway with the gRPC one registered."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with (
            fake_fleet(kind, 1, **config) as fleet,
            fake_fleet("sglang", 1, **config) as reference,
            trio.open_nursery() as nursery,
        ):
            front = await nursery.start(GrpcFront(fleet[0], WIRES[wire]).serve)
            cfg = rl_cfg(sessions=SessionsConfig(tokenizer_path=str(model_dir)), policy=policy)
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


async def test_a_psrl_registration_serves_rollouts_on_its_dp_ranks_and_sessions(model_dir):
    # The payload PSRL's rollout server posts: grpc://, connection_mode grpc, runtime_type vllm,
    # models, a dp_size label; with --dp-aware its two ranks are two instances.
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("vllm", 1, dp_size=2) as fleet, trio.open_nursery() as nursery:
            front = await nursery.start(GrpcFront(fleet[0], WIRES["vllm-psrl"]).serve)
            cfg = rl_cfg(sessions=SessionsConfig(tokenizer_path=str(model_dir)), dp_aware=True,
                         policy="round_robin")  # fmt: skip
            async with gateway_in_process(cfg) as gw:
                payload = {"url": front.url, "worker_type": "regular", "connection_mode": "grpc",
                           "runtime_type": "vllm", "models": [{"id": fleet[0].served_model_name}],
                           "labels": {"dp_size": "2", "rl.control_url": fleet[0].url}}  # fmt: skip
                r = await gw.client.post("/workers", json=payload, headers=ADMIN)
                assert r.status_code == 202, r.text
                await wait_routable(gw)
                while len(gw.gateway.dataplane.table().models[fleet[0].served_model_name].entries) < 2:
                    await trio.sleep(0.02)
                body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}}
                for _ in range(4):
                    r = await gw.client.post("/generate", json=body)
                    assert r.status_code == 200, r.text
                assert sorted(front.ranks.values()) == [0, 0, 1, 1]  # PSRL's field 8 reached the engine
                front.ranks.clear()
                stats = (await gw.client.get("/workers/stats")).json()["workers"]
                base = stats[0]["base_worker_id"]
                pin = {"x-base-worker-id": base, "x-target-dp-rank": "1", "x-is-sticky": "1"}
                for _ in range(3):
                    r = await gw.client.post("/generate", json=body, headers=pin)
                    assert r.status_code == 200, r.text
                assert list(front.ranks.values()) == [1, 1, 1]  # the (worker, rank) pin holds
                # A session turn on it: the gateway's ids go in the Generate request.
                r = await gw.client.post("/sessions", headers={"x-prompt-id": "p1"})
                sid = r.json()["session_id"]
                chat = {"model": fleet[0].served_model_name, "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 6}  # fmt: skip
                r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=chat)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"]["content"] is not None
            nursery.cancel_scope.cancel()


async def test_sessions_without_a_tokenizer_path_take_the_tokenizer_a_grpc_engine_serves(model_dir):
    """PSRL's rollout gateway enables TITO and names no tokenizer: as its fork, sessions take the
    one the gRPC workers serve (GetTokenizer). Before an engine served one, a turn is a 503
    tokenizer_unavailable (retryable); after, it is token-exact with the engine's own chat."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with (
            fake_fleet("sglang", 1) as fleet,
            fake_fleet("sglang", 1) as reference,
            trio.open_nursery() as nursery,
        ):
            front = await nursery.start(
                GrpcFront(fleet[0], WIRES["sglang"], tokenizer_dir=str(model_dir)).serve
            )
            cfg = rl_cfg(sessions=SessionsConfig(from_engines=True))
            async with (
                gateway_in_process(cfg) as gw,
                httpx.AsyncClient(base_url=reference[0].url) as ref,
            ):
                name = fleet[0].served_model_name
                chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6}
                r = await gw.client.post("/sessions", headers={"x-prompt-id": "p1"})
                assert r.status_code in (200, 201), r.text
                sid = r.json()["session_id"]
                r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=chat)
                assert r.status_code == 503 and r.json()["error"]["code"] == "tokenizer_unavailable", r.text
                payload = {"url": front.url, "connection_mode": "grpc", "runtime": "sglang",
                           "labels": {"rl.control_url": fleet[0].url}}  # fmt: skip
                assert (await gw.client.post("/workers", json=payload, headers=ADMIN)).status_code == 202
                await wait_routable(gw)
                want = (await ref.post("/v1/chat/completions", json=chat)).json()
                r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=chat)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"] == want["choices"][0]["message"]
                assert gw.gateway.sessions.chat is not None  # adopted once, for every later turn
            nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def leaving_client(model_dir):
    """A slow fake SGLang engine over gRPC registered with a gateway on a real loopback socket
    (a client that leaves must close a real connection); yields the engine, its gRPC front and
    the client. On the way out it checks the call was abandoned once: one Abort (after the
    RST_STREAM), and the engine's job gone."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 1, token_latency_ms=20) as fleet, trio.open_nursery() as nursery:
            front = await nursery.start(GrpcFront(fleet[0], WIRES["sglang"]).serve)
            async with gateway_on_loopback(rl_cfg()) as gw, httpx.AsyncClient(base_url=gw.base) as client:
                payload = {"url": front.url, "connection_mode": "grpc", "runtime": "sglang",
                           "labels": {"rl.control_url": fleet[0].url}}  # fmt: skip
                assert (await client.post("/workers", json=payload, headers=ADMIN)).status_code == 202
                await wait_routable(gw)
                yield fleet[0], front, client
                with trio.fail_after(10):
                    while not front.aborts:
                        await trio.sleep(0.02)
                assert len(front.aborts) == 1  # RST_STREAM and the engine's Abort for that request
                while fleet[0].scheduler.jobs:
                    await trio.sleep(0.02)
            nursery.cancel_scope.cancel()


async def test_a_client_that_leaves_mid_stream_aborts_the_engine_call(model_dir):
    async with leaving_client(model_dir) as (_engine, _front, client):
        body = {"input_ids": [4, 5], "stream": True,
                "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}  # fmt: skip
        async with client.stream("POST", "/generate", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    break  # the first event arrived: the client leaves


async def test_a_client_that_leaves_a_buffered_generate_aborts_the_engine_call(model_dir):
    async with leaving_client(model_dir) as (engine, _front, client):
        body = {"input_ids": [4, 5], "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
        async with trio.open_nursery() as leaving:
            leaving.start_soon(functools.partial(client.post, "/generate", json=body))
            with trio.fail_after(10):
                while not engine.scheduler.jobs:
                    await trio.sleep(0.02)
            leaving.cancel_scope.cancel()  # the client leaves before the answer


async def test_a_mixed_fleet_routes_across_http_and_grpc_workers(model_dir):
    async with grpc_gateway(model_dir, "sglang", "sglang", policy="round_robin") as (gw, ref, _front):
        r = await gw.client.post("/workers", json={"url": str(ref.base_url).rstrip("/")}, headers=ADMIN)
        assert r.status_code == 202, r.text
        with trio.fail_after(10):
            while (
                len(gw.gateway.dataplane.table().models.get(gw.gateway.dataplane.served_models()[0]).entries)
                < 2
            ):
                await trio.sleep(0.02)
        body = {"input_ids": [9, 8, 7], "sampling_params": {"max_new_tokens": 4}}
        routed, answers = set(), []
        for _ in range(6):
            r = await gw.client.post("/generate", json=body)
            assert r.status_code == 200, r.text
            routed.add(r.headers["x-smg-routed-worker-id"].split("://")[0])
            answers.append(r.json()["output_ids"])
        assert routed == {"grpc", "http"}  # both transports served
        assert all(a == answers[0] for a in answers)  # the same weights: the same tokens either way


async def test_without_a_tokenizer_path_the_engine_s_tokenizer_bundle_serves_text_and_chat(model_dir):
    """No --tokenizer-path: the gateway tokenizes text, renders chat and detokenizes with the
    tokenizer and chat template the engine served with GetTokenizer at discovery. An engine
    whose bundle holds no tokenizer (of another model) answers as without one."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with (
            fake_fleet("sglang", 1) as fleet,
            fake_fleet("sglang", 1, served_model_name="bare-model") as other,
            fake_fleet("sglang", 1) as reference,
            trio.open_nursery() as nursery,
        ):
            served = await nursery.start(
                GrpcFront(fleet[0], WIRES["sglang"], tokenizer_dir=str(model_dir)).serve
            )
            bare = await nursery.start(
                GrpcFront(other[0], WIRES["sglang"]).serve
            )  # a bundle with no tokenizer.json
            async with (
                gateway_in_process(rl_cfg()) as gw,
                httpx.AsyncClient(base_url=reference[0].url) as ref,
            ):
                assert gw.gateway.dataplane.grpc.tokenizer is None  # no --tokenizer-path
                for front, engine in ((served, fleet[0]), (bare, other[0])):
                    payload = {"url": front.url, "connection_mode": "grpc", "runtime": "sglang",
                               "labels": {"rl.control_url": engine.url}}  # fmt: skip
                    r = await gw.client.post("/workers", json=payload, headers=ADMIN)
                    assert r.status_code == 202, r.text
                name = fleet[0].served_model_name
                while sorted(gw.gateway.dataplane.served_models()) != sorted([name, "bare-model"]):
                    await trio.sleep(0.02)  # both discovered (each fetched its bundle first)
                chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 9}
                text = {"model": name, "text": "hello there", "sampling_params": {"max_new_tokens": 6}}
                want_chat = (await ref.post("/v1/chat/completions", json=chat)).json()
                want_text = (await ref.post("/generate", json=text)).json()
                r = await gw.client.post("/v1/chat/completions", json=chat)
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"] == want_chat["choices"][0]["message"]
                r = await gw.client.post("/generate", json=text)
                assert r.status_code == 200, r.text
                assert (r.json()["output_ids"], r.json()["text"]) == (
                    want_text["output_ids"],
                    want_text["text"],
                )
                for route, body in (("/v1/chat/completions", chat), ("/generate", text)):
                    r = await gw.client.post(route, json={**body, "model": "bare-model"})
                    assert r.status_code == 400 and r.json()["error"]["code"] == "tokenizer_required", r.text
            nursery.cancel_scope.cancel()


async def test_a_process_that_did_not_discover_the_engine_fetches_its_tokenizer_once(model_dir):
    """As a process of several on one journal that does not hold the discovery lease: nothing
    discovered here, so the first exchanges with the engine fetch its bundle, once for all."""
    from smgrl.dataplane.grpc.tokenizers import EngineTokenizers

    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with (
            fake_fleet("sglang", 1) as fleet,
            fake_fleet("sglang", 1) as reference,
            trio.open_nursery() as nursery,
        ):
            front = await nursery.start(
                GrpcFront(fleet[0], WIRES["sglang"], tokenizer_dir=str(model_dir)).serve
            )
            async with (
                gateway_in_process(rl_cfg()) as gw,
                httpx.AsyncClient(base_url=reference[0].url) as ref,
            ):
                payload = {"url": front.url, "connection_mode": "grpc", "runtime": "sglang",
                           "labels": {"rl.control_url": fleet[0].url}}  # fmt: skip
                assert (await gw.client.post("/workers", json=payload, headers=ADMIN)).status_code == 202
                await wait_routable(gw)
                assert front.tokenizer_fetches == 1  # discovery's
                gw.gateway.dataplane.grpc.engine_tokenizers = EngineTokenizers()  # nothing discovered here
                name = fleet[0].served_model_name
                chat = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}
                want = (await ref.post("/v1/chat/completions", json=chat)).json()["choices"][0]["message"]
                answers = []

                async def ask():
                    answers.append(await gw.client.post("/v1/chat/completions", json=chat))

                async with trio.open_nursery() as clients:
                    for _ in range(4):
                        clients.start_soon(ask)
                assert [r.status_code for r in answers] == [200] * 4, [r.text for r in answers]
                assert all(r.json()["choices"][0]["message"] == want for r in answers)
                assert front.tokenizer_fetches == 2  # one more, shared by the four first requests
            nursery.cancel_scope.cancel()

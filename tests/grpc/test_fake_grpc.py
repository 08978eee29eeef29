"""The fake engines' gRPC face: the HTTP fakes' model, weights, versions, pause and abort, DP
ranks and tokenizer, over each wire, through smgrl's own client (grpcio serves)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile

import httpx
import pytest
import trio

from smgrl.fake import fake_fleet
from smgrl.fake.grpc_front import GrpcFront
from smgrl.upstream.grpc import Channel, GrpcError, StatusCode
from smgrl.upstream.grpc.engines import WIRES, EngineClient

PROMPT = [11, 22, 33, 44]


@contextlib.asynccontextmanager
async def engine_client(kind: str, wire: str, **config):
    async with fake_fleet(kind, 1, **config) as fleet, trio.open_nursery() as nursery:
        front = await nursery.start(GrpcFront(fleet[0], WIRES[wire]).serve)
        channel = Channel("127.0.0.1", front.port)
        try:
            yield fleet[0], front, EngineClient(channel, WIRES[wire])
        finally:
            await channel.aclose()
            nursery.cancel_scope.cancel()


def gen_request(wire: str, rid: str, max_new: int, stream: bool = True, **extra):
    pb = WIRES[wire].pb
    key = "max_tokens" if wire.startswith("vllm") else "max_new_tokens"
    sp = pb.SamplingParams(**{key: max_new})
    return pb.GenerateRequest(
        request_id=rid,
        tokenized=pb.TokenizedInput(input_ids=PROMPT),
        sampling_params=sp,
        stream=stream,
        **extra,
    )


async def run(client, req) -> tuple[list[int], object]:
    chunks: list[int] = []
    complete = None
    async with client.generate(req, timeout=10) as stream:
        async for msg in stream:
            if msg.HasField("chunk"):
                chunks.extend(msg.chunk.token_ids)
            else:
                complete = msg.complete
    return chunks, complete


WIRE_KINDS = [("sglang", "sglang"), ("vllm", "vllm"), ("vllm", "vllm-psrl"), ("tokenspeed", "tokenspeed")]


@pytest.mark.parametrize(("kind", "wire"), WIRE_KINDS)
async def test_same_tokens_as_the_http_fake(kind, wire):
    async with engine_client(kind, wire) as (engine, _, client):
        chunks, complete = await run(client, gen_request(wire, "r1", 6))
        assert chunks == list(complete.output_ids) and len(chunks) == 6
        assert complete.finish_reason == "length"
        # Not streamed: only the Complete frame.
        _, complete2 = await run(client, gen_request(wire, "r2", 6, stream=False))
        assert list(complete2.output_ids) == chunks
        if kind != "vllm":
            async with httpx.AsyncClient(base_url=engine.url) as http:
                body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 6}}
                r = await http.post("/generate", json=body)
            assert r.json()["output_ids"] == chunks


@pytest.mark.parametrize(("kind", "wire"), WIRE_KINDS)
async def test_abort_rpc_ends_the_stream_with_an_abort_complete(kind, wire):
    async with engine_client(kind, wire, token_latency_ms=20) as (engine, front, client):
        got: list = []

        async def generate():
            got.append(await run(client, gen_request(wire, "long", 1000)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(generate)
            await engine.wait_until(
                lambda: any(len(j.output_ids) >= 2 for j in engine.scheduler.jobs.values()), 5
            )
            await client.abort("long", "stop now", timeout=2)
        _, complete = got[0]
        assert complete.finish_reason == "abort"
        assert 2 <= len(complete.output_ids) < 1000
        assert front.aborts == ["long"]


async def test_leaving_generate_sends_abort_stream_dropped_and_frees_the_slot():
    async with engine_client("sglang", "sglang", token_latency_ms=20) as (engine, front, client):
        with trio.move_on_after(0.2):
            await run(client, gen_request("sglang", "gone", 1000))
        assert front.aborts == ["gone"]
        assert await engine.wait_until(lambda: engine.inflight == 0, 5)


async def test_pause_abort_aborts_grpc_streams_and_new_ones_wait_for_continue():
    async with engine_client("sglang", "sglang", token_latency_ms=10) as (engine, _, client):
        got: list = []
        async with trio.open_nursery() as nursery, httpx.AsyncClient(base_url=engine.url) as http:
            nursery.start_soon(lambda: _collect(got, client, gen_request("sglang", "a", 1000)))
            await engine.wait_until(lambda: engine.inflight == 1, 5)
            assert (await http.post("/pause_generation", json={"mode": "abort"})).status_code == 200
            await engine.wait_until(lambda: len(got) == 1, 5)
            assert got[0][1].finish_reason == "abort"
            nursery.start_soon(lambda: _collect(got, client, gen_request("sglang", "b", 3)))
            await trio.sleep(0.2)
            assert len(got) == 1  # held at admission while paused
            assert (await http.post("/continue_generation", json={})).status_code == 200
        assert got[1][1].finish_reason == "length"


async def _collect(out, client, req):
    out.append(await run(client, req))


async def test_tokenspeed_chunks_name_their_weight_version():
    async with engine_client("tokenspeed", "tokenspeed", weight_version="v1") as (engine, _, client):
        req = gen_request("tokenspeed", "v", 3)
        async with client.generate(req, timeout=5) as stream:
            versions = [getattr(m, m.WhichOneof("response")).weight_version async for m in stream]
        assert versions == ["v1"] * 4
        info = await client.model_info(timeout=2)
        assert info.weight_version == "v1" and info.served_model_name == engine.served_model_name


async def test_dp_rank_pins_reach_the_engine_on_both_vllm_wires():
    for wire in ("vllm", "vllm-psrl"):
        async with engine_client("vllm", wire, dp_size=4) as (_, front, client):
            await run(client, gen_request(wire, "p", 2, data_parallel_rank=3))
            assert front.ranks["p"] == 3
            with pytest.raises(GrpcError) as info:
                await run(client, gen_request(wire, "q", 2, data_parallel_rank=9))
            assert info.value.code == StatusCode.INVALID_ARGUMENT
            loads = await client.loads(timeout=2)
            assert (loads is None) == (wire == "vllm-psrl")
            if loads is not None:
                assert [load.dp_rank for load in loads.loads] == [0, 1, 2, 3]


async def test_get_tokenizer_streams_a_verified_bundle(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "x"}))
    (tmp_path / "tokenizer.json").write_bytes(os.urandom(200_000))  # several 64 KiB chunks
    async with fake_fleet("sglang", 1) as fleet, trio.open_nursery() as nursery:
        front = await nursery.start(GrpcFront(fleet[0], WIRES["sglang"], tokenizer_dir=str(tmp_path)).serve)
        channel = Channel("127.0.0.1", front.port)
        data, sha = await EngineClient(channel, WIRES["sglang"]).tokenizer(timeout=5)
        assert hashlib.sha256(data).hexdigest() == sha
        names = zipfile.ZipFile(io.BytesIO(data)).namelist()
        assert sorted(names) == ["tokenizer.json", "tokenizer_config.json"]
        await channel.aclose()
        nursery.cancel_scope.cancel()


async def test_fake_engine_cli_serves_grpc_with_http_control():
    smgrl = os.path.join(os.path.dirname(sys.executable), "smgrl")
    # A real process, its ready line read in a worker thread (the loop never blocks on it).
    proc = subprocess.Popen([smgrl, "fake-engine", "--kind", "tokenspeed", "--grpc"], stdout=subprocess.PIPE)  # noqa: ASYNC220
    try:
        with trio.fail_after(30):
            line = json.loads(await trio.to_thread.run_sync(proc.stdout.readline))
        assert line["grpc_wire"] == "tokenspeed" and line["urls"][0].startswith("grpc://127.0.0.1:")
        port = int(line["urls"][0].rsplit(":", 1)[1])
        channel = Channel("127.0.0.1", port)
        client = EngineClient(channel, WIRES["tokenspeed"])
        assert (await client.health_check(timeout=5)).healthy
        info = await client.server_info(timeout=5)
        # The control app it advertises is the engine's HTTP side.
        assert info.server_args["rl.control_url"] == line["control_urls"][0]
        await channel.aclose()
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize(("kind", "wire"), WIRE_KINDS)
async def test_generate_request_builds_each_wires_request(kind, wire):
    from smgrl.upstream.grpc.engines import generate_request

    async with engine_client(kind, wire, dp_size=2) as (_, front, client):
        req = generate_request(WIRES[wire], "b", PROMPT, max_new_tokens=3, dp_rank=1, seed=7)
        chunks, complete = await run(client, req)
        assert len(chunks) == 3 and complete.finish_reason == "length"
        assert front.ranks["b"] == 1

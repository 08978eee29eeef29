"""A gRPC worker registers over its own wire: every fake kind (SGLang, vLLM upstream, vLLM as
PSRL's fork speaks it, TokenSpeed) shows its real model, runtime and weight version, and PSRL's
own registration payload selects PSRL's wire."""

from __future__ import annotations

import contextlib

import pytest
import trio
from rl_api_helpers import ADMIN, journal, rl_cfg

from smgrl.fake import fake_fleet
from smgrl.fake.grpc_front import GrpcFront
from smgrl.registry.loads import group_key
from smgrl.testing import gateway_in_process
from smgrl.upstream.grpc.engines import WIRES


@contextlib.asynccontextmanager
async def grpc_engine(kind: str, wire: str, **config):
    async with fake_fleet(kind, 1, **config) as fleet, trio.open_nursery() as nursery:
        front = await nursery.start(GrpcFront(fleet[0], WIRES[wire]).serve)
        yield fleet[0], front
        nursery.cancel_scope.cancel()


async def registered_row(gw, payload: dict) -> dict:
    r = await gw.client.post("/workers", json=payload, headers=ADMIN)
    assert r.status_code == 202, r.text
    wid = r.json()["worker_id"]
    await gw.wait_visible(1)
    r = await gw.client.get(f"/v1/rl/workers/{wid}", headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize(
    ("kind", "wire", "runtime", "version"),
    [
        ("sglang", "sglang", "sglang", "v7"),
        # vLLM's wire has no weight version: read from its control app's /weight_info.
        ("vllm", "vllm", "vllm", "v7"),
        ("vllm", "vllm-psrl", "vllm", "v7"),
        ("tokenspeed", "tokenspeed", "tokenspeed", "v7"),
        ("sglang", "sglang", None, "v7"),  # no runtime: the wire is found by asking
    ],
)
async def test_each_kind_registers_with_its_model_runtime_and_version(kind, wire, runtime, version):
    async with (
        grpc_engine(kind, wire, served_model_name="org/real-model", weight_version="v7") as (engine, front),
        gateway_in_process(rl_cfg()) as gw,
    ):
        payload = {"url": front.url, "connection_mode": "grpc", "labels": {"rl.control_url": engine.url}}
        if runtime:
            payload["runtime"] = runtime
        row = await registered_row(gw, payload)
        assert row["model_id"] == "org/real-model"
        assert row["engine"] == (runtime or kind)
        assert row["labels"]["grpc_wire"] == wire
        if version:
            assert row["weight_version"] == version
        # The tokenizer bundle was fetched once with GetTokenizer and verified.
        assert "org/real-model" in gw.gateway.registry.tokenizers.bundles


async def test_psrl_registration_payload_selects_psrl_wire():
    # The payload PSRL's rollout server posts, unchanged: runtime_type vllm, no wire label.
    async with (
        grpc_engine("vllm", "vllm-psrl", served_model_name="/models/qwen", dp_size=2) as (_, front),
        gateway_in_process(rl_cfg()) as gw,
    ):
        payload = {
            "url": front.url,
            "worker_type": "regular",
            "connection_mode": "grpc",
            "runtime_type": "vllm",
            "models": [{"id": "/models/qwen"}],
            "labels": {"max_model_len": "4096", "dp_size": "2", "tp_size": "1", "pp_size": "1"},
        }
        r = await gw.client.post("/workers", json=payload, headers=ADMIN)
        assert r.status_code == 202, r.text
        with trio.fail_after(10):
            while True:
                rows = (await gw.client.get("/v1/rl/workers", headers=ADMIN)).json()["workers"]
                if rows and rows[0]["labels"].get("grpc_wire"):
                    break
                await trio.sleep(0.02)
        assert rows[0]["labels"]["grpc_wire"] == "vllm-psrl"
        assert rows[0]["model_id"] == "/models/qwen"


async def test_the_load_monitor_reads_grpc_workers_with_get_loads():
    async with (
        grpc_engine("sglang", "sglang", dp_size=2) as (_, front),
        gateway_in_process(rl_cfg()) as gw,
    ):
        await registered_row(gw, {"url": front.url, "runtime": "sglang"})
        (worker,) = list(gw.gateway.fleet.registry)
        await gw.gateway.loads.poll_group(group_key(worker))
        (row,) = (await gw.client.get("/workers")).json()["workers"]
        load = row["engine_load"]
        assert load["version"] == "0.5.23" and load["dp_rank_count"] == 2
        assert [r["dp_rank"] for r in load["loads"]] == [0, 1]


async def test_a_tokenizer_bundle_whose_sha256_does_not_match_keeps_the_worker_pending():
    async with (
        grpc_engine("sglang", "sglang") as (_, front),
        gateway_in_process(rl_cfg(registration_backoff_initial_secs=0.01)) as gw,
    ):
        front._bundle = (b"PK-not-what-it-says", "0" * 64)
        r = await gw.client.post("/workers", json={"url": front.url, "runtime": "sglang"}, headers=ADMIN)
        assert r.status_code == 202
        with trio.fail_after(10):
            while not journal(gw, "worker.probe_failed"):
                await trio.sleep(0.01)
        (failed, *_) = journal(gw, "worker.probe_failed")
        assert "sha256" in failed.error
        assert not gw.gateway.registry.tokenizers.bundles
        assert (await gw.client.get("/v1/rl/workers", headers=ADMIN)).json()["workers"] == []

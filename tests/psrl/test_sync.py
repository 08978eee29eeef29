"""A PSRL weight sync with rollouts in flight, on fake SGLang engines (they park new requests
while paused, as PSRL's vLLM servicer parks them behind its closed admission gate).

PSRL 19c0474 psrl/workers/gen/rollout_coordination/sync_and_migrate/sync_and_migrate_mixin.py:160
pauses dispatch with ``POST /routing_loop/pause?wait=true`` (outside its try block), pauses the
engines itself, out of band, in abort mode (psrl/workers/gen/vllm_async_server.py:793), publishes
the new version per instance, resumes dispatch, and resumes the engines once their weights are
loaded (:803). Its rollouts must come back whole."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.psrl.conftest import register_psrl, start_fleet

PROMPT = [301, 302, 303, 304]
N = 150
# The engines' own name: this module is about syncs, not about the registered model name.
MODEL = "fake/Qwen3-0.6B"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sync")
    f = start_fleet(tmp, "sglang", 2, ["--token-latency-ms", "12", "--weight-version", "0"])
    try:
        register_psrl(f, model=MODEL, runtime="sglang")
        f.wait(lambda: len(f.instances()) == 2, what="two instances")
        yield f
    finally:
        f.stop()


def rollout(fleet, out: dict, key: str, headers: dict, **extra) -> None:
    body = {
        **extra,
        "model": MODEL,
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": N, "ignore_eos": True},
        "stream": False,
        "return_logprob": True,
    }
    with httpx.Client(base_url=fleet.base, timeout=60) as c:
        out[key] = c.post("/generate", json=body, headers=headers)


def decoding(fleet, threads, at_least: int = 20):
    def seen():
        assert all(t.is_alive() for t in threads), "a rollout ended before the sync"
        states = [httpx.get(f"{u}/_fake/state", timeout=5).json() for u in fleet.urls]
        return all(not s["decoded"] or min(s["decoded"]) >= at_least for s in states) and sum(
            len(s["decoded"]) for s in states
        )

    return fleet.wait(seen, what="rollouts decoding")


def engines(fleet, path: str, body: dict) -> None:
    """PSRL pauses and resumes its engines itself (not through the gateway)."""
    for url in fleet.urls:
        r = httpx.post(f"{url}/{path}", json=body, timeout=10)
        assert r.status_code == 200, (path, r.status_code, r.text)


def test_a_sync_keeps_in_flight_rollouts(fleet):
    """The coordinator's sync: pause dispatch (answers once selection is drained, not the
    generations), abort-mode engine pause out of band, per-instance version publish, resume
    dispatch, resume engines; every rollout with routing metadata comes back whole."""
    out: dict = {}
    threads = []
    for i in range(2):
        headers = {"x-request-id": str(700 + i), "x-prompt-id": str(800 + i), "x-version-tag": "0"}
        threads.append(threading.Thread(target=rollout, args=(fleet, out, f"r{i}", headers)))
        threads[-1].start()
    assert decoding(fleet, threads) == 2
    try:
        t0 = time.monotonic()
        paused = fleet.client.post("/routing_loop/pause", params={"wait": "true"}, json={})
        waited = time.monotonic() - t0
        assert paused.status_code == 200, paused.text
        assert paused.json()["paused"] is True and not paused.json().get("selecting")
        assert all(t.is_alive() for t in threads), "pause?wait=true waited for the generations"
        assert waited < 1.0
        engines(fleet, "pause_generation", {"mode": "abort"})
        updates = [{"worker_id": b, "dp_rank": r, "weight_version": 1} for b, r in fleet.instances()]
        published = fleet.client.post("/workers/update_weight_version", json=updates).json()
        assert published["updated"] == len(updates) and published["rejected"] == 0, published
    finally:
        fleet.client.post("/routing_loop/resume", json={})
        engines(fleet, "continue_generation", {})
    for t in threads:
        t.join(60)
    for key in ("r0", "r1"):
        r = out[key]
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["meta_info"]["finish_reason"]["type"] == "length", data["meta_info"]["finish_reason"]
        assert len(data["output_ids"]) == N
        assert data["meta_info"]["completion_tokens"] == N
        spans = data["meta_info"]["weight_versions"]
        assert spans[0]["start"] == 0 and spans[-1]["end"] == N


def test_without_routing_metadata_an_out_of_band_abort_stays_an_abort(fleet):
    """A rollout with no PSRL routing metadata (slime's: it aborts everything itself at the end of
    a rollout) keeps the older rule: an abort no control call through the gateway caused is
    answered as the engine gave it, never resurrected."""
    out: dict = {}
    t = threading.Thread(target=rollout, args=(fleet, out, "plain", {}))
    t.start()
    decoding(fleet, [t], 5)
    engines(fleet, "abort_request", {"abort_all": True})
    t.join(60)
    r = out["plain"]
    assert r.status_code == 200 and r.json()["meta_info"]["finish_reason"]["type"] == "abort"


def test_a_deliberate_abort_through_the_gateway_is_not_looped_back(fleet):
    """With routing metadata, the client's own ``abort_request`` for that request, sent through
    the gateway, is a cancellation: answered as the engine gave it."""
    out: dict = {}
    headers = {"x-request-id": "9100", "x-prompt-id": "9100", "x-version-tag": "0"}
    t = threading.Thread(target=rollout, args=(fleet, out, "cancelled", headers), kwargs={"rid": "9100"})
    t.start()
    decoding(fleet, [t], 5)
    r = fleet.client.post("/v1/rl/engine/abort_request?selector=engine%3Dsglang", json={"rid": "9100"})
    assert r.status_code == 200, r.text
    t.join(60)
    r = out["cancelled"]
    assert r.status_code == 200 and r.json()["meta_info"]["finish_reason"]["type"] == "abort"

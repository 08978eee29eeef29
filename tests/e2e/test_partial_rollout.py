"""Partial-rollout loopback with real processes: fake engines and a gateway process;
a trainer's sync through the gateway aborts long streamed generations mid-stream, and the
answer is checked token by token against the autoregressive fake model (before the abort: the
old weights' uninterrupted generation; after it: the new weights continuing the same context).
The same under --dp-aware with (worker, rank) pins; and the example's partial-rollout mode."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from smgrl.demo.procs import wait_for_workers
from smgrl.fake import make_checkpoint, model
from smgrl.rl import RL, RlError

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [201, 202, 203, 204]
N = 120


def reference(digest: str, ids: list[int], n: int) -> list[int]:
    out, key = [], model.context_key(ids)
    for _ in range(n):
        token, _ = model.next_token(bytes.fromhex(digest), key)
        out.append(token)
        key = model.extend_key(key, token)
    return out


def digest(http, url: str) -> str:
    return httpx.get(f"{url}/_fake/state", timeout=10).json()["weights_digest"]


def sync(http, ckpt: Path, version: str, errors: list) -> None:
    """The trainer's sync through the gateway: pause (abort), load, continue."""
    try:
        for path, body in [
            ("pause_generation", {"mode": "abort"}),
            ("update_weights_from_disk", {"model_path": str(ckpt), "weight_version": version}),
            ("continue_generation", {}),
        ]:
            status, _, payload = http.request("POST", f"/v1/rl/engine/{path}?selector=engine%3Dsglang", body)
            assert status == 200, (path, status, payload)
    except Exception as exc:  # noqa: BLE001 - reported by the test thread
        errors.append(exc)


def streamed(base: str, headers: dict, ckpt: Path, http, after: int) -> tuple[list[dict], dict]:
    """Stream a rollout; after ``after`` tokens arrived, run a sync on another thread."""
    body = {"input_ids": PROMPT, "stream": True, "sampling_params": {"max_new_tokens": N, "ignore_eos": True}}
    events, errors, trainer = [], [], None
    with httpx.stream("POST", f"{base}/generate", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[6:]))
            if trainer is None and len(events[-1]["output_ids"]) >= after:
                trainer = threading.Thread(target=sync, args=(http, ckpt, "v2", errors))
                trainer.start()
        head = dict(r.headers)
    assert trainer is not None
    trainer.join(30)
    assert not errors, errors
    return events, head


def check(events: list[dict], old: str, new: str) -> int:
    seen: list[int] = []
    for e in events:  # cumulative ids only grow, and no abort reaches the client
        assert e["output_ids"][: len(seen)] == seen
        seen = e["output_ids"]
        assert e["meta_info"]["finish_reason"] is None or e is events[-1]
    meta = events[-1]["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and len(seen) == N
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (len(PROMPT), N)
    first = meta["segments"][0]
    k = first["end"]
    assert 0 < k < N and first["finish_reason"] == "abort" and first["op_id"]
    assert seen[:k] == reference(old, PROMPT, N)[:k]
    assert seen[k:] == reference(new, PROMPT + seen[:k], N - k)
    assert [s["version"] for s in meta["weight_versions"]] == ["default", "v2"]
    return k


def test_a_sync_aborts_a_stream_mid_way_and_the_tokens_are_exact(engines, gateway, tmp_path):
    fleet = engines("sglang", 1, "--token-latency-ms", "4")
    (control,) = fleet.control_urls
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", *fleet.gateway_args())
    fleet.register(http)
    wait_for_workers(http.base, 1, child=gw)
    old = digest(http, control)
    ckpt = make_checkpoint(tmp_path / "v2", "fake/Qwen3-0.6B", seed=7)
    events, _ = streamed(http.base, {"x-prompt-id": "g1"}, ckpt, http, after=20)
    assert check(events, old, digest(http, control)) >= 20


def test_dp_aware_loopback_returns_to_the_pinned_rank(engines, gateway, tmp_path):
    fleet = engines("sglang", 1, "--token-latency-ms", "4", "--dp-size", "2")
    (url,), (control,) = fleet.urls, fleet.control_urls
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--dp-aware", *fleet.gateway_args())
    fleet.register(http)
    wait_for_workers(http.base, 1, child=gw)  # discovery rows collapse DP ranks
    old = digest(http, control)
    for _ in range(300):  # bounded: the ranks are routable once discovery expanded them
        status, _, stats = http.request("GET", "/workers/stats")
        if status == 200 and len(stats["workers"]) == 2:
            break
        time.sleep(0.05)
    assert len(stats["workers"]) == 2, stats
    base = stats["workers"][0]["base_worker_id"]
    ckpt = make_checkpoint(tmp_path / "v2", "fake/Qwen3-0.6B", seed=9)
    pin = {"x-base-worker-id": base, "x-target-dp-rank": "1", "x-is-sticky": "1", "x-prompt-id": "g2"}
    events, head = streamed(http.base, pin, ckpt, http, after=15)
    assert head["x-smg-routed-worker-id"] == f"{url}@1"
    check(events, old, digest(http, control))
    segments = events[-1]["meta_info"]["segments"]
    assert [s["dp_rank"] for s in segments] == [1, 1]  # the loopback went back to (worker, 1)
    # Every decoded token counted once, on the rank that decoded it (both legs: rank 1).
    _, _, stats = http.request("GET", "/workers/stats")
    assert {w["dp_rank"]: w["tokens"] for w in stats["workers"]} == {0: 0, 1: N}


def test_async_rl_loop_partial_rollout_mode(engines, gateway):
    fleet = engines("sglang", 2, "--token-latency-ms", "2")
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", *fleet.gateway_args())
    fleet.register(http)
    wait_for_workers(http.base, 2, child=gw)
    for _ in range(2):  # twice in a row on the same fleet
        run = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "async_rl_loop.py"), "--gateway", http.base, "--partial-rollout",
             "--clients", "6", "--refits", "3", "--refit-every", "0.5", "--tail", "0.3", "--tokens", "96"],
            check=False, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert "no decoded token lost across 3 syncs" in run.stdout


def test_async_rl_loop_partial_rollout_needs_engines_that_take_time(fakes, gateway):
    urls = fakes("sglang", 1)
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *urls)
    wait_for_workers(http.base, 1, child=gw)
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "async_rl_loop.py"), "--gateway", http.base, "--partial-rollout"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "--token-latency-ms" in run.stderr, run.stdout + run.stderr


def test_coordinator_controls_through_smgrl_rl(fakes, gateway):
    urls = fakes("sglang", 2)
    gw, http, _ = gateway(
        "--enable-rl", "--disable-health-check", "--eligible-wait-secs", "0", "--worker-urls", *urls
    )
    wait_for_workers(http.base, 2, child=gw)
    rl = RL(http.base, timeout=30)
    stats = rl.worker_stats()
    assert len(stats) == 2 and {s["in_flight"] for s in stats} == {0}
    assert rl.pause_dispatch()["paused"] is True and rl.routing_status()["paused"] is True
    # While paused nothing is dispatched: with --eligible-wait-secs 0 the answer says so at once.
    status, _, body = http.request(
        "POST", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}
    )
    assert status == 503 and body["error"]["reasons"] == {"dispatch_paused": 2}
    assert rl.resume_dispatch()["paused"] is False
    status, _, _ = http.request(
        "POST", "/generate", {"input_ids": [1], "sampling_params": {"max_new_tokens": 1}}
    )
    assert status == 200
    result = rl.update_weight_versions(
        [{"worker_id": s["base_worker_id"], "weight_version": 5} for s in stats]
    )
    assert result["updated"] == 2
    assert {s["weight_version"] for s in rl.worker_stats()} == {"5"}
    assert {w.weight_version for w in rl.workers()} == {"5"}  # the same version table
    with pytest.raises(RlError) as info:
        rl.update_weight_versions([])
    assert info.value.status == 400
    # PSRL's worker holds, the waiting-request filter and a waiting pause, through smgrl.rl.
    first = stats[0]["base_worker_id"]
    held = rl.pause_workers([{"worker_id": first}])
    assert held["action"] == "pause" and held["updated"] == 1
    assert {s["base_worker_id"]: s["held"] for s in rl.worker_stats()}[first] == "paused"
    assert rl.resume_workers([{"worker_id": first}])["results"][0]["status"] == "resumed"
    assert rl.waiting_requests(-1) == []
    paused = rl.pause_dispatch(wait=True, timeout=5)
    assert paused["drained"] is True and paused["running_request_num"] == 0
    assert rl.resume_dispatch()["paused"] is False

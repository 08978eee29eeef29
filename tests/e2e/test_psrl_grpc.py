"""PSRL's vLLM replica over gRPC, end to end: a real fake engine speaking PSRL's vLLM wire (its
fork's messages, two DP ranks) and a real gateway process. The replica registers itself with the
very body PSRL's rollout server posts (``grpc://``, ``connection_mode: grpc``, ``runtime_type:
vllm``, ``models``, a ``dp_size`` label, its replica index as ``id``; no control URL), and that
registration serves rollouts, a session turn and a partial-rollout loopback, with each
``(worker, dp_rank)`` pin reaching the engine as the Generate request's rank."""

from __future__ import annotations

import json
import threading
import time

import httpx

from smgrl.demo.procs import start_fake_engines
from smgrl.fake import model
from smgrl.tito.testkit import make_model_dir

MODEL = "/ckpt/psrl-policy"  # PSRL registers the model path it loaded
PROMPT = [311, 312, 313, 314]
N = 48


def registration(url: str) -> dict:
    """The body of PSRL 19c0474 psrl/workers/gen/smg_adapter.py build_worker_registration_payload,
    as its vllm_async_server.register_server_to_gateway posts it for replica 0."""
    return {
        "url": url,
        "worker_type": "regular",
        "connection_mode": "grpc",
        "runtime_type": "vllm",
        "models": [{"id": MODEL}],
        "labels": {"max_model_len": "40960", "dp_size": "2", "tp_size": "1", "pp_size": "1"},
        "id": "0",
    }


def wait(predicate, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # bounded: discovery and rank expansion are asynchronous
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout:g}s")


def reference(digest: str, ids: list[int], n: int, tok) -> list[int]:
    """The fake model's uninterrupted generation (with the tokenizer the engine runs with)."""
    out, key = [], model.context_key(ids)
    with model.tokenizer_scope(tok):
        for _ in range(n):
            token, _ = model.next_token(bytes.fromhex(digest), key)
            out.append(token)
            key = model.extend_key(key, token)
    return out


def test_a_psrl_grpc_registration_serves_rollouts_sessions_and_loopbacks(children, gateway, tmp_path):
    tok = make_model_dir(tmp_path / "tok")
    engine, (url,) = start_fake_engines(
        "vllm",
        1,
        ["--grpc", "--psrl", "--dp-size", "2", "--token-latency-ms", "5", "--tokenizer-path", str(tok)],
    )
    children.append(engine)
    (control,) = engine.control_urls
    _gw, http, _ = gateway(
        "--enable-rl", "--disable-health-check", "--dp-aware", "--tokenizer-path", str(tok)
    )
    status, _, answer = http.request("POST", "/workers", registration(url))
    assert status == 202 and answer["worker_id"], answer  # PSRL keeps it as its base_worker_id
    base = answer["worker_id"]

    def instances():
        status, _, stats = http.request("GET", "/workers/stats")
        rows = stats["workers"] if status == 200 else []
        return sorted((r["base_worker_id"], r["dp_rank"]) for r in rows) if len(rows) == 2 else None

    assert wait(instances, "two instances from the dp_size label") == [(base, 0), (base, 1)]
    (row,) = http.request("GET", "/v1/rl/workers")[2]["workers"]
    assert row["labels"]["grpc_wire"] == "vllm-psrl" and row["model_id"] == MODEL, row
    engine_state = lambda: httpx.get(f"{control}/_fake/state", timeout=10).json()
    digest = engine_state()["weights_digest"]

    # Rollouts: PSRL's metadata headers; pinned ones land on their rank, unpinned on either.
    body = {"model": MODEL, "input_ids": PROMPT, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    for rank in (1, 0, 1):
        pin = {"x-request-id": f"r{rank}-{time.monotonic_ns()}", "x-prompt-id": "p1",
               "x-base-worker-id": base, "x-target-dp-rank": str(rank), "x-is-sticky": "1"}  # fmt: skip
        status, head, out = http.request("POST", "/generate", body, headers=pin)
        assert status == 200, out
        assert head["x-smg-routed-worker-id"].endswith(f"@{rank}") and out["output_ids"] == reference(
            digest, PROMPT, 4, tok
        )
    assert engine_state()["grpc"]["ranks"] == [1, 0, 1]  # PSRL's rank field reached the engine

    # A session turn over the same registration: the gateway's ids go in the Generate request.
    status, _, session = http.request("POST", "/sessions", headers={"x-prompt-id": "p2"})
    assert status == 201, session
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    status, _, turn = http.request("POST", f"/sessions/{session['session_id']}/v1/chat/completions", chat)
    assert status == 200 and 0 < turn["usage"]["completion_tokens"] <= 5, turn
    status, _, captured = http.request("GET", f"/sessions/{session['session_id']}")
    assert status == 200, captured
    # Token-exact: the captured ids are the gateway's prompt ids, then what the engine decoded.
    (trajectory,) = captured["trajectories"]
    ids, n = trajectory["accumulated_token_ids"], turn["usage"]["completion_tokens"]
    assert ids[-n:] == reference(digest, ids[:-n], n, tok), trajectory
    assert engine_state()["grpc"]["ranks"][3] in (0, 1)  # on one of its ranks, named in the request

    # A loopback: PSRL pauses its engine itself, out of band, in abort mode, mid-stream; the
    # stream is continued on the same (worker, rank) and no decoded token is lost.
    events, errors = [], []

    def pause_and_resume():
        try:
            for path in ("pause?mode=abort", "resume"):
                r = httpx.post(f"{control}/{path}", timeout=10)
                assert r.status_code == 200, (path, r.text)
        except Exception as exc:  # noqa: BLE001 - reported by the test thread
            errors.append(exc)

    streamed = {**body, "stream": True, "sampling_params": {"max_new_tokens": N, "ignore_eos": True}}
    pin = {"x-request-id": "psrl-loop-1", "x-prompt-id": "p3", "x-base-worker-id": base,
           "x-target-dp-rank": "1", "x-is-sticky": "1"}  # fmt: skip
    before = len(engine_state()["grpc"]["ranks"])
    syncer = None
    with httpx.stream("POST", f"{http.base}/generate", json=streamed, headers=pin, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            events.append(json.loads(line[6:]))
            if syncer is None and len(events[-1]["output_ids"]) >= 8:
                syncer = threading.Thread(target=pause_and_resume)
                syncer.start()
    assert syncer is not None
    syncer.join(30)
    assert not errors, errors
    meta = events[-1]["meta_info"]
    assert meta["finish_reason"]["type"] == "length", meta
    assert events[-1]["output_ids"] == reference(digest, PROMPT, N, tok)  # whole, as if never cut
    assert [s["finish_reason"] for s in meta["segments"]][:1] == ["abort"]
    assert [s["dp_rank"] for s in meta["segments"]] == [1, 1]  # looped back to (worker, 1)
    assert engine_state()["grpc"]["ranks"][before:] == [1, 1]  # both legs' Generate named rank 1

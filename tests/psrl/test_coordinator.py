"""PSRL's rollout coordinator and native agent loop against smgrl, on a fleet of fake vLLM
engines registered as PSRL's replicas register (two replicas, ``dp_size: 2`` each: four
instances). The calls are PSRL's, in its order: registration, the initial per-rank version
publish, status pushes, the stats recorder's reads, the sync loop's queue filter, and the native
loop's token-in ``/generate``."""

from __future__ import annotations

import threading

import pytest

from tests.psrl.conftest import MODEL, psrl_worker, start_fleet

PROMPT = [101, 102, 103, 104, 105]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("coordinator")
    f = start_fleet(
        tmp,
        "vllm",
        2,
        ["--token-latency-ms", "8", "--weight-version", "0", "--served-model-name", MODEL],
        ["--dp-aware", "--policy", "round_robin"],
    )
    try:
        f.registered = [
            f.client.post("/workers", json=psrl_worker(url, i, 2)) for i, url in enumerate(f.urls)
        ]
        yield f
    finally:
        f.stop()


def _ready(fleet) -> list:
    """The instances once both replicas were discovered."""

    def discovered():
        workers = fleet.client.get("/workers").json()["workers"]
        return len(workers) >= 2 and all(w.get("status") != "pending" for w in workers)

    fleet.wait(discovered, what="both replicas discovered")
    rows = fleet.client.get("/workers/stats").json()["workers"]
    if any(r["weight_version"] is None for r in rows):  # PSRL's initial publish (run alone: not yet made)
        items = [
            {"worker_id": r["base_worker_id"], "dp_rank": r["dp_rank"], "weight_version": 0} for r in rows
        ]
        fleet.client.post("/workers/update_weight_version", json=items)
    return fleet.instances()


def psrl_generate(
    fleet, request_id: int, prompt_id: int, *, max_new_tokens: int = 8, hint=None, sticky=False
):
    """PSRL 19c0474 psrl/workers/agent_loop/loops/base_agent_loop.py:279 (headers and body of
    the native loop's ``/generate``; sampling params of :535)."""
    headers = {
        "x-request-id": str(request_id),
        "x-prompt-id": str(prompt_id),
        "x-version-tag": "0",
        "x-is-validate": "false",
    }
    if hint is not None:
        headers["x-base-worker-id"], headers["x-target-dp-rank"] = hint[0], str(hint[1])
    if sticky:
        headers["x-is-sticky"] = "true"
    body = {
        "model": MODEL,
        "request_id": str(request_id),
        "input_ids": PROMPT,
        "sampling_params": {
            "n": 1,
            "logprobs": 0,
            "temperature": 1.0,
            "top_p": 1.0,
            "top_k": -1,
            "repetition_penalty": 1.0,
            "ignore_eos": True,
            "detokenize": False,
            "max_new_tokens": max_new_tokens,
        },
        "stream": False,
        "return_logprob": True,
    }
    return fleet.client.post("/generate", json=body, headers=headers)


def test_registration_takes_the_replica_id_model_and_dp_size(fleet):
    """PSRL 19c0474 psrl/workers/gen/vllm_async_server.py:918 reads ``worker_id`` of the answer
    as the replica's base worker id; psrl/workers/gen/smg_adapter.py:196 sends ``id``, the model
    path as ``models[0].id`` and ``dp_size`` as a label. The coordinator then publishes the
    initial version per instance (psrl/workers/gen/rollout_coordination/coordinator.py:393,
    smg_adapter.py:250) and raises unless every item is updated
    (sync_and_migrate_mixin.py:38)."""
    answers = [r.json() for r in fleet.registered]
    assert [r.status_code for r in fleet.registered] == [202, 202]
    assert [a["worker_id"] for a in answers] == ["0", "1"]
    assert _ready(fleet) == [("0", 0), ("0", 1), ("1", 0), ("1", 1)]
    one = fleet.client.get("/workers/0")
    assert one.status_code == 200 and one.json()["id"] == "0"
    rows = fleet.client.get("/workers/stats").json()["workers"]
    assert {r["model"] for r in rows} == {MODEL}
    # A second registration under a taken id is a conflict, whatever its URL.
    dup = fleet.client.post("/workers", json=psrl_worker("http://127.0.0.1:9", 0, 2))
    assert dup.status_code == 409, dup.text
    updates = [{"worker_id": base, "dp_rank": rank, "weight_version": 0} for base, rank in fleet.instances()]
    result = fleet.client.post("/workers/update_weight_version", json=updates)
    assert result.status_code == 200, result.text
    body = result.json()
    assert body["rejected"] == 0 and body["updated"] == len(updates), body


def test_status_pushes_are_accepted_and_shown(fleet):
    """PSRL 19c0474 psrl/workers/gen/rollout_coordination/status_loop.py:91 pushes every
    instance's engine snapshot (smg_adapter.py:256) to ``POST /workers/update_stats`` and dies
    on any error status; ``GET /workers/stats`` shows what was pushed."""
    _ready(fleet)
    updates = []
    for n, (base, rank) in enumerate(fleet.instances()):
        updates.append(
            {
                "worker_id": base,
                "dp_rank": rank,
                "timestamp": "2026-12-01T10:00:00Z",
                "scheduler_stats": {
                    "req_id_to_prompt_token_num": {"7": 100 + n},
                    "req_id_to_response_token_num": {"7": 10 + n},
                    "num_running_reqs": n,
                    "num_waiting_reqs": 2 * n,
                    "kv_cache_usage": 0.25 * n,
                },
            }
        )
    r = fleet.client.post("/workers/update_stats", json=updates)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 4 and body["updated"] == 4 and body["rejected"] == 0, body
    # An older snapshot of an instance than the one kept is ignored, not applied.
    older = dict(updates[0], timestamp="2026-12-01T09:00:00Z")
    stale = fleet.client.post("/workers/update_stats", json=[older]).json()
    assert stale["stale_ignored"] == 1 and stale["results"][0]["status"] == "stale_ignored", stale
    rows = {
        (w["base_worker_id"], w["dp_rank"]): w for w in fleet.client.get("/workers/stats").json()["workers"]
    }
    for n, (base, rank) in enumerate(fleet.instances()):
        engine = rows[(base, rank)]["engine_stats"]
        assert engine["running"] == n and engine["waiting"] == 2 * n
        assert engine["kv_usage"] == pytest.approx(0.25 * n)
        assert engine["prompt_tokens"] == 100 + n and engine["response_tokens"] == 10 + n
    # An unknown instance is rejected per item, never a failed call.
    bad = fleet.client.post("/workers/update_stats", json=[dict(updates[0], worker_id="9")]).json()
    assert bad["rejected"] == 1 and bad["results"][0]["status"] == "rejected"


def test_routing_loop_filter_and_status_as_psrl_reads_them(fleet):
    """PSRL 19c0474 psrl/workers/gen/rollout_coordination/sync_and_migrate/sync_and_migrate_mixin.py:108
    iterates ``GET /routing_loop/filter`` as a list of ``{request_id, is_validate}``;
    psrl/workers/gen/stats_recorder.py:96 logs ``running_tasks``, ``selecting``, ``queue_keys`` and
    ``partition_queue_lens`` of ``GET /routing_loop/status``; rollout_coordination/base.py:39
    pauses with ``wait=true`` and checks ``paused``, ``selecting`` and
    ``active_dispatch_handoffs``."""
    _ready(fleet)
    paused = fleet.client.post("/routing_loop/pause", params={"wait": "true"}, json={})
    assert paused.status_code == 200
    p = paused.json()
    assert p["paused"] is True and p["selecting"] is False and p["active_dispatch_handoffs"] == 0
    done = {}
    waiter = threading.Thread(target=lambda: done.setdefault("r", psrl_generate(fleet, 4242, 77)))
    waiter.start()
    try:
        status = fleet.wait(
            lambda: (s := fleet.client.get("/routing_loop/status").json())["queue_len"] >= 1 and s,
            what="a queued request",
        )
        for key in ("running_tasks", "selecting", "queue_keys", "partition_queue_lens", "routing"):
            assert key in status, key
        assert status["selecting"] is False and status["routing"] is False
        assert status["queue_keys"] == [0] and status["partition_queue_lens"] == {"0": 1}
        listed = fleet.client.get("/routing_loop/filter", params={"version_tag": 0}).json()
        assert isinstance(listed, list), listed
        assert [(int(q["request_id"]), bool(q.get("is_validate", False))) for q in listed] == [(4242, False)]
        assert listed[0]["prompt_id"] == 77 and listed[0]["version_tag"] == 0
        assert fleet.client.get("/routing_loop/filter", params={"version_tag": -1}).json() == []
    finally:
        fleet.client.post("/routing_loop/resume", json={})
        waiter.join(30)
    assert done["r"].status_code == 200


def test_native_generate_on_a_vllm_worker(fleet):
    """PSRL 19c0474 psrl/workers/agent_loop/loops/base_agent_loop.py:279-338 posts ``/generate``
    with ``input_ids`` and reads ``output_ids``, ``meta_info.output_token_logprobs`` (first
    non-null per position), ``meta_info.finish_reason.type`` and the instance headers
    (:584-629)."""
    _ready(fleet)
    r = psrl_generate(fleet, 5001, 5001, max_new_tokens=6)
    assert r.status_code == 200, r.text
    data = r.json()
    answer = data[0] if isinstance(data, list) else data
    assert len(answer["output_ids"]) == 6
    meta = answer["meta_info"]
    assert meta["finish_reason"]["type"] == "length"
    assert meta["prompt_tokens"] == len(PROMPT) and meta["completion_tokens"] == 6
    logprobs = [next(lp for lp in pos if lp is not None) for pos in meta["output_token_logprobs"]]
    assert len(logprobs) == 6 and all(isinstance(lp, float) for lp in logprobs)
    assert [pos[1] for pos in meta["output_token_logprobs"]] == answer["output_ids"]
    assert (r.headers["x-base-worker-id"], int(r.headers["x-target-dp-rank"])) in fleet.instances()


def test_prompt_groups_are_not_pinned_by_default(fleet):
    """PSRL 19c0474 psrl/workers/gen/smg_adapter.py:133 passes ``psrl_enable_group_sticky`` (PSRL's
    config default off, psrl/trainer/config/psrl/rollout_coordination/routing_strategy.yaml:96; the
    fork's default off): two concurrent rollouts of one prompt group are then spread by the
    policy (round robin here), not pinned to the group's first instance."""
    _ready(fleet)
    served, threads = [], []

    def one(rid):
        body = {"model": MODEL, "prompt": "group", "max_tokens": 40, "ignore_eos": True}
        headers = {"x-request-id": str(rid), "x-prompt-id": "9000", "x-version-tag": "0"}
        r = fleet.client.post("/v1/completions", json=body, headers=headers)
        served.append((r.status_code, r.headers.get("x-base-worker-id"), r.headers.get("x-target-dp-rank")))

    for rid in (9001, 9002):
        threads.append(threading.Thread(target=one, args=(rid,)))
        threads[-1].start()
        fleet.wait(
            lambda: (
                sum(w["in_flight"] for w in fleet.client.get("/workers/stats").json()["workers"])
                >= len(threads)
            ),
            what="in flight",
        )
    for t in threads:
        t.join(30)
    assert [s[0] for s in served] == [200, 200]
    assert served[0][1:] != served[1][1:], served

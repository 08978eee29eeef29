"""The pure parts behind PSRL's calls: which aborts are cancellations, a session turn's routing
from per-turn headers, the vLLM translation of ``/generate``, the pushed engine stats."""

from __future__ import annotations

import json

import pytest

from smgrl.core import CANCEL_ALL, cancelled_requests, worker_id_problem
from smgrl.dataplane import vllm_generate
from smgrl.dataplane.instance_stats import InstanceStatsTable, StatsRejected, parse_snapshot
from smgrl.sessions.turn_routing import merged_headers, turn_meta


@pytest.mark.parametrize(
    ("path", "body", "want"),
    [
        ("abort_request", {"rid": "42"}, {"42"}),
        ("abort_request", {"abort_all": True}, {CANCEL_ALL}),
        ("abort_request", {}, set()),
        ("abort_requests", {"request_ids": ["a", 7]}, {"a", "7"}),
        ("abort_requests", {}, {CANCEL_ALL}),
        ("inference/v1/abort_requests", {"request_ids": ["x"]}, {"x"}),
        ("pause_generation", {"mode": "abort"}, None),
    ],
)
def test_cancelled_requests(path, body, want):
    got = cancelled_requests("POST", path, json.dumps(body).encode())
    assert (None if got is None else set(got)) == want


@pytest.mark.parametrize(
    ("wid", "ok"), [("0", True), ("replica-1.a:b_c", True), ("", False), ("a/b", False), ("x" * 129, False)]
)
def test_worker_ids_a_registration_may_choose(wid, ok):
    assert (worker_id_problem(wid) is None) is ok


def _meta(turn, defaults=None, **kw):
    args = {"session_floor": None, "session_sticky": False, "last_instance": None, "pin": None, "rid": "r"}
    args.update(kw)
    return turn_meta(merged_headers(defaults or {}, turn), **args)


def test_a_turn_floor_and_the_session_floor_take_the_higher():
    meta, psrl = _meta({"x-version-tag": "5"}, session_floor="3")
    assert meta.version_tag == "5" and not psrl
    meta, _ = _meta({"x-version-tag": "2"}, session_floor="3")
    assert meta.version_tag == "3"
    meta, _ = _meta({"x-version-tag": "-1"})
    assert meta.version_tag is None


def test_a_turn_hint_binds_only_when_it_opts_in():
    hint = {"x-base-worker-id": "1", "x-target-dp-rank": "0"}
    meta, _ = _meta(hint)
    assert meta.hint is None
    meta, _ = _meta({**hint, "x-is-sticky": "true"})
    assert (meta.hint.worker, meta.hint.rank, meta.is_sticky) == ("1", 0, True)
    meta, _ = _meta({**hint, "x-force-pin-once": "true"})
    assert meta.hint.worker == "1" and meta.force_pin_once and not meta.is_sticky
    meta, _ = _meta(hint, pin=("2", 1))
    assert (meta.hint.worker, meta.hint.rank, meta.force_pin_once) == ("2", 1, True)
    meta, _ = _meta({}, session_sticky=True, last_instance=("3", 0))
    assert meta.hint.worker == "3" and meta.is_sticky


def test_turn_headers_win_over_the_defaults_and_a_hint_is_taken_whole():
    merged = merged_headers(
        {"x-prompt-id": "1", "x-base-worker-id": "a", "x-target-dp-rank": "1", "x-smg-tito-session-id": "s"},
        {"x-prompt-id": "2", "x-base-worker-id": "b"},
    )
    assert merged == {"x-prompt-id": "2", "x-base-worker-id": "b"}
    _, psrl = _meta({"x-request-id": "1", "x-prompt-id": "2"})
    assert psrl


def test_generate_to_vllm_and_back():
    body = {
        "input_ids": [[1, 2, 3]],
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": 2, "temperature": 0.5, "sampling_seed": 3, "json_schema": "x"},
    }
    out = json.loads(vllm_generate.to_vllm(body))
    assert out == {
        "token_ids": [1, 2, 3],
        "sampling_params": {"max_tokens": 2, "temperature": 0.5, "seed": 3, "logprobs": 0},
    }
    answer = {
        "request_id": "g",
        "choices": [
            {
                "token_ids": [7, 8],
                "logprobs": [-0.5, -1.0],
                "finish_reason": "length",
                "weight_versions": [{"version": "4", "start": 0, "end": 2}],
            }
        ],
    }
    sg = json.loads(vllm_generate.to_sglang(json.dumps(answer).encode(), 3, True))
    assert sg["output_ids"] == [7, 8] and sg["text"] == ""
    assert sg["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    assert sg["meta_info"]["output_token_logprobs"] == [[-0.5, 7, None], [-1.0, 8, None]]
    assert sg["meta_info"]["prompt_tokens"] == 3 and sg["meta_info"]["weight_version"] == "4"
    assert vllm_generate.to_sglang(b'{"error": "x"}', 3, True) is None
    with pytest.raises(vllm_generate.Untranslatable):
        vllm_generate.prompt_ids({"text": "hi"})


def test_pushed_stats_keep_the_newest_snapshot():
    table = InstanceStatsTable()
    snap = {
        "timestamp": "2026-01-01T00:00:02Z",
        "scheduler_stats": {
            "num_running_reqs": 2,
            "num_waiting_reqs": 1,
            "kv_cache_usage": 0.5,
            "req_id_to_prompt_token_num": {"a": 10},
        },
    }
    assert table.put("0", 1, parse_snapshot(snap))
    older = parse_snapshot({**snap, "timestamp": "2026-01-01T00:00:01Z"})
    assert not table.put("0", 1, older)
    got = table.get("0", 1)
    assert (got.running, got.waiting, got.kv_usage, got.requests) == (2, 1, 0.5, 3)
    assert got.to_json()["prompt_tokens"] == 10 and table.get("0", 0) is None
    assert parse_snapshot({}).kv_usage is None
    for bad in (
        {"scheduler_stats": {"num_running_reqs": -1}},
        {"scheduler_stats": {"kv_cache_usage": "x"}},
        {"timestamp": "soon"},
    ):
        with pytest.raises(StatsRejected):
            parse_snapshot(bad)

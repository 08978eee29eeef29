"""Partial-rollout loopback, pure parts: which control calls abort running requests, and the
continuation/stitching rules (spec 7.3/7.5 defects fixed: no duplicated ids on a second abort,
original prompt length and total tokens reported)."""

from __future__ import annotations

import json

import pytest

from journal.codec import ControlStarted
from smgrl.core.aborts import aborts_inflight
from smgrl.dataplane.loopback import read_leg, start
from smgrl.events import ControlFinished
from smgrl.routing.instance import Instance
from smgrl.state.aborts import AbortingOps

ABORTS = [
    ("POST", "pause_generation", b"", None, True),
    ("POST", "pause_generation", b'{"mode": "abort"}', None, True),
    ("POST", "pause_generation", b'{"mode": "retract"}', None, False),
    ("POST", "pause_generation", b'{"mode": "wait"}', None, False),
    ("POST", "pause", b"", None, True),
    ("POST", "pause", b"", "mode=keep", False),
    ("POST", "sleep", b"", "level=1&mode=abort", True),
    ("POST", "update_weight_version", b'{"new_version": "2"}', None, True),
    ("POST", "update_weight_version", b'{"new_version": "2", "abort_all_requests": false}', None, False),
    ("POST", "update_weights_from_disk", b'{"model_path": "/m"}', None, False),
    ("POST", "update_weights_from_disk", b'{"model_path": "/m", "abort_all_requests": true}', None, True),
    ("POST", "update_weights_from_distributed", b'{"abort_all_requests": true}', None, True),
    ("POST", "abort_request", b'{"abort_all": true}', None, False),  # the trainer's own
    ("POST", "continue_generation", b"", None, False),
    ("GET", "pause_generation", b"", None, False),
]


@pytest.mark.parametrize(("method", "path", "body", "query", "expected"), ABORTS)
def test_which_calls_abort_running_requests(method, path, body, query, expected):
    assert aborts_inflight(method, path, body, query) is expected


INST = Instance("w", "http://e", "http://e", "w", None, "m", None)


def leg(ids, finish, version="1", start=0):
    return read_leg(
        {
            "text": "".join(f" t{i}" for i in ids),
            "output_ids": ids,
            "meta_info": {
                "finish_reason": {"type": finish},
                "weight_version": version,
                "prompt_tokens": 99,
                "completion_tokens": len(ids),
                "output_token_logprobs": [[-0.5, i, None] for i in ids],
                "input_token_logprobs": [[None, 1, None]],
            },
        }
    )


def test_two_aborts_continue_from_the_original_prompt_without_duplicates():
    r = start({"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 10}, "rid": "x"}, True, 8)
    r.add(leg([10, 11, 12], "abort", "1"), INST, "op-a")
    body = json.loads(r.continuation())
    assert body["input_ids"] == [1, 2, 10, 11, 12] and body["sampling_params"]["max_new_tokens"] == 7
    r.add(leg([13, 14], "abort", "2"), INST, "op-b")
    body = json.loads(r.continuation())
    assert body["input_ids"] == [1, 2, 10, 11, 12, 13, 14] and body["sampling_params"]["max_new_tokens"] == 5
    assert body["rid"] == "x"  # the rest of the body is the caller's
    last = leg([15, 16, 17, 18, 19], "length", "2")
    r.add(last, INST, None)
    out = r.stitch(last)
    meta = out["meta_info"]
    assert out["output_ids"] == list(range(10, 20)) and out["text"] == "".join(
        f" t{i}" for i in range(10, 20)
    )
    assert (meta["prompt_tokens"], meta["completion_tokens"]) == (2, 10)
    assert [lp[1] for lp in meta["output_token_logprobs"]] == list(range(10, 20))
    assert meta["weight_versions"] == [
        {"version": "1", "start": 0, "end": 3},
        {"version": "2", "start": 3, "end": 10},
    ]
    assert [(s["iteration"], s["start"], s["end"], s["op_id"]) for s in meta["segments"]] == [
        (0, 0, 3, "op-a"),
        (1, 3, 5, "op-b"),
        (2, 5, 10, None),
    ]
    assert r.loopbacks == 2 and r.kept == 5


def test_uncapped_stays_uncapped_and_logprobs_missing_in_a_leg_are_dropped():
    r = start({"input_ids": [1]}, True, 8)
    r.add(leg([5], "abort"), INST, "op")
    assert "sampling_params" not in json.loads(r.continuation())
    bare = read_leg({"output_ids": [6], "meta_info": {"finish_reason": {"type": "stop"}}})
    r.add(bare, INST, None)
    assert "output_token_logprobs" not in r.stitch(bare)["meta_info"]


@pytest.mark.parametrize(
    "obj, single",
    [
        ({"text": "hi"}, True),
        ({"input_ids": [[1], [2]]}, False),
        ({"input_ids": []}, True),
        ({"input_ids": [1], "sampling_params": {"max_new_tokens": -1}}, True),
    ],
)
def test_what_is_not_looped_back(obj, single):
    assert start(obj, single, 8) is None
    assert start({"input_ids": [1]}, True, 0) is None  # --max-loopbacks 0


def _started(op_id: str, path: str, body: bytes, urls=("http://e1",)):
    return ControlStarted(
        op_id=op_id,
        kind="fanout",
        method="POST",
        path=path,
        targets=tuple({"worker_id": u, "url": u, "control_url": u} for u in urls),
        **ControlStarted.body_fields(body),
    )


def _finished(op_id: str):
    return ControlFinished(
        op_id=op_id, result="ok", http_status=200, total=1, succeeded=1, failed=0, latency_ms=1
    )


def test_which_operations_may_have_aborted_a_request():
    ops = AbortingOps()
    ops.apply(
        10, _started("pause-1", "pause_generation", b'{"mode": "abort"}', ("http://e1@0", "http://e1@1"))
    )
    ops.apply(11, _started("flush", "flush_cache", b""))
    ops.apply(12, _started("trainer-abort", "abort_request", b'{"abort_all": true}'))
    # Sent before the pause started, or while it was in flight: the pause may have aborted it.
    assert ops.since("http://e1", 5) == ["pause-1"]
    assert ops.since("http://e1", 10) == ["pause-1"]
    ops.apply(13, _finished("pause-1"))
    assert ops.since("http://e1", 12) == ["pause-1"]  # sent while it was still in flight
    assert ops.since("http://e1", 13) == []  # sent after it ended: not its abort
    assert ops.since("http://e2", 0) == []  # another engine

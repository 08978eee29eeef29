"""build_training_data (PSRL's signature and results) and training_data(snapshot) with versions."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smgrl.tito import build_training_data, training_data


def rec(p, out, lp=-0.5, **extra):
    return {
        "prompt_token_count": p,
        "output_logprobs": [[lp, t] for t in out],
        "finish_reason": "stop",
        **extra,
    }


def test_no_records():
    assert build_training_data([1, 2, 3], []) == {
        "prompt_ids": [],
        "response_ids": [],
        "response_mask": [],
        "logprobs": [],
        "routed_experts": None,
        "num_turns": 0,
    }


def test_two_turns_with_environment_tokens_between():
    acc = [1, 2, 10, 11, 3, 4, 12]
    r = build_training_data(acc, [rec(2, [10, 11]), rec(6, [12], lp=-1.0)])
    assert r["prompt_ids"] == [1, 2]
    assert r["response_ids"] == [10, 11, 3, 4, 12]
    assert r["response_mask"] == [1, 1, 0, 0, 1]
    assert r["logprobs"] == [-0.5, -0.5, 0.0, 0.0, -1.0]
    assert r["num_turns"] == 2 and r["routed_experts"] is None


def test_prompt_override():
    assert build_training_data([1, 2, 9], [rec(2, [9])], prompt_ids_override=[7])["prompt_ids"] == [7]


def test_no_logprob_pairs_falls_back_to_accumulated_ids():
    acc = [1, 2, 10, 11, 3, 12]
    records = [
        {"prompt_token_count": 2, "output_logprobs": None},
        {"prompt_token_count": 5, "output_logprobs": None},
    ]
    r = build_training_data(acc, records)
    assert r["response_ids"] == [10, 11, 3, 12]
    # PSRL's rule: without pairs a turn's output runs to the next prompt start (glue included)
    assert r["response_mask"] == [1, 1, 1, 1]
    assert r["logprobs"] == [0.0] * 4


def test_trailing_trim_within_bound_drops_the_unmatched_tail():
    # turn 0 generated [10, 11, 99] but the next prompt has [10, 11, 3] (the adapter rewrote one id)
    acc = [1, 10, 11, 3, 12]
    r = build_training_data(acc, [rec(1, [10, 11, 99]), rec(4, [12])], max_trim_tokens=1)
    assert r["response_ids"] == [10, 11, 3, 12]
    assert r["response_mask"] == [1, 1, 0, 1]


def test_trailing_trim_overflow_raises():
    with pytest.raises(ValueError, match="trailing trim overflow"):
        build_training_data([1, 10, 3, 4, 12], [rec(1, [10, 98, 99]), rec(4, [12])], max_trim_tokens=1)


def test_last_turn_is_never_trimmed():
    r = build_training_data([1, 10], [rec(1, [10, 11])])
    assert r["response_ids"] == [10, 11]


def test_training_data_versions_turns_engines_and_spans():
    acc = [1, 2, 10, 11, 3, 12, 13, 14]
    records = [
        rec(2, [10, 11], weight_version="v1", engine="e1"),
        rec(
            5,
            [12, 13, 14],
            weight_version="v3",
            engine="e2",
            weight_versions=[
                {"start": 0, "end": 1, "version": "v2"},
                {"start": 1, "end": 3, "version": "v3"},
            ],
        ),
    ]
    snap = {
        "session_id": "s",
        "max_trim_tokens": 0,
        "trajectories": [{"trajectory_id": 4, "accumulated_token_ids": acc, "records": records}],
    }
    (t,) = training_data(snap)
    assert t["trajectory_id"] == 4 and t["finish_reason"] == "stop"
    assert t["versions"] == ["v1", "v1", None, "v2", "v3", "v3"]
    assert t["token_turns"] == [0, 0, None, 1, 1, 1]
    assert t["token_engines"] == ["e1", "e1", None, "e2", "e2", "e2"]


def test_training_data_needs_a_list():
    with pytest.raises(TypeError):
        training_data({"trajectories": {}})


@st.composite
def trajectories(draw):
    acc = draw(st.lists(st.integers(0, 50), min_size=1, max_size=5))
    records = []
    for _ in range(draw(st.integers(1, 5))):
        out = draw(st.lists(st.integers(0, 50), min_size=1, max_size=6))
        records.append(rec(len(acc), out, weight_version=str(len(records))))
        acc = acc + out + draw(st.lists(st.integers(0, 50), max_size=4))
    return acc, records


@given(trajectories())
def test_arrays_align_and_mask_counts_generated_tokens(t):
    acc, records = t
    (r,) = training_data(
        {"trajectories": [{"trajectory_id": 0, "accumulated_token_ids": acc, "records": records}]}
    )
    n = len(r["response_ids"])
    assert len(r["response_mask"]) == len(r["logprobs"]) == len(r["versions"]) == len(r["token_turns"]) == n
    assert sum(r["response_mask"]) == sum(len(x["output_logprobs"]) for x in records)
    assert r["prompt_ids"] + r["response_ids"] == acc[: len(r["prompt_ids"]) + n]
    for m, v, turn in zip(r["response_mask"], r["versions"], r["token_turns"], strict=True):
        assert (v is None) == (m == 0)
        if m:
            assert v == str(turn)

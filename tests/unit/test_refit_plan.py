"""The pure refit plan per engine kind (smgrl/refit/plan.py): tables of native calls."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smgrl.refit import plan as P

DIST = P.DistributedSource("10.0.0.1", 29500, group_name="g", backend="gloo")


def calls(p: P.EnginePlan) -> list[tuple[str, str, str]]:
    return [(phase, c.method, c.to_json()["target"]) for phase, cs in p.steps for c in cs]


@pytest.mark.parametrize(
    "kind, expected",
    [
        (
            "sglang",
            [
                ("pause", "POST", "/pause_generation"),
                ("load", "POST", "/update_weights_from_disk"),
                ("flush", "GET", "/flush_cache"),
                ("verify", "GET", "/model_info"),
                ("resume", "POST", "/continue_generation"),
            ],
        ),
        (
            "vllm",
            [
                ("pause", "POST", "/pause?mode=keep"),
                ("load", "POST", "/collective_rpc"),
                ("version", "POST", "/update_weight_version"),
                ("flush", "POST", "/reset_prefix_cache?reset_running_requests=true"),
                ("verify", "GET", "/weight_info"),
                ("resume", "POST", "/resume"),
            ],
        ),
    ],
)
def test_disk_plan_per_kind(kind, expected):
    assert calls(P.plan(kind, "disk", "7", model_path="/ckpt/7")) == expected


@pytest.mark.parametrize(
    "kind, expected",
    [
        (
            "sglang",
            [
                ("pause", "POST", "/pause_generation"),
                ("init", "POST", "/init_weights_update_group"),
                ("begin", "POST", "/begin_weight_update"),
                ("end", "POST", "/end_weight_update"),
                ("version", "POST", "/update_weight_version"),
                ("flush", "GET", "/flush_cache"),
                ("verify", "GET", "/model_info"),
                ("destroy", "POST", "/destroy_weights_update_group"),
                ("resume", "POST", "/continue_generation"),
            ],
        ),
        (
            "vllm",
            [
                ("pause", "POST", "/pause?mode=keep"),
                ("init", "POST", "/init_weight_transfer_engine"),
                ("begin", "POST", "/start_weight_update"),
                ("end", "POST", "/finish_weight_update"),
                ("flush", "POST", "/reset_prefix_cache?reset_running_requests=true"),
                ("verify", "GET", "/weight_info"),
                ("destroy", "POST", "/shutdown_weight_transfer_engine"),
                ("resume", "POST", "/resume"),
            ],
        ),
        (
            "tokenspeed",
            [
                ("pause", "POST", "/pause_generation"),
                ("init", "POST", "/init_weights_update_group"),
                ("version", "POST", "/update_weight_version"),
                ("flush", "GET", "/flush_cache"),
                ("verify", "GET", "/get_weight_version"),
                ("destroy", "POST", "/destroy_weights_update_group"),
                ("resume", "POST", "/continue_generation"),
            ],
        ),
    ],
)
def test_distributed_plan_per_kind(kind, expected):
    p = P.plan(kind, "distributed", "7", dist=DIST, rank_offset=3, world_size=5)
    assert calls(p) == expected
    (init,) = p.calls("init")
    info = init.body["init_info"] if kind == "vllm" else init.body
    assert (info["rank_offset"], info["world_size"], info["master_port"]) == (3, 5, 29500)


@pytest.mark.parametrize(
    "kind, source, mode, reason",
    [
        ("tokenspeed", "disk", None, "unsupported_source"),
        ("sglang", "disk", "keep", "unsupported_pause_mode"),
        ("vllm", "disk", "retract", "unsupported_pause_mode"),
        ("tokenspeed", "distributed", "in_place", "unsupported_pause_mode"),
        ("trtllm", "disk", None, "unsupported_engine"),
    ],
)
def test_refusals(kind, source, mode, reason):
    refused = P.refusal(kind, source, mode)
    assert refused is not None and refused.reason == reason
    with pytest.raises(P.Refused):
        P.plan(kind, source, "1", model_path="/x", dist=DIST, pause_mode=mode)


@pytest.mark.parametrize("kind, mode", [("sglang", "retract"), ("vllm", "keep"), ("tokenspeed", "keep")])
def test_default_pause_mode_keeps_in_flight_work(kind, mode):
    p = P.plan(kind, "distributed", "1", dist=DIST)
    assert p.pause_mode == mode and mode not in P.ABORTING
    (pause,) = p.calls("pause")
    assert (pause.query == f"mode={mode}") if kind == "vllm" else (pause.body == {"mode": mode})


@pytest.mark.parametrize("mode, abort", [(None, False), ("in_place", False), ("abort", True)])
def test_sglang_version_write_never_aborts_unless_asked(mode, abort):
    """SGLang's update_weight_version aborts everything by default: the plan always says."""
    p = P.plan("sglang", "distributed", "9", dist=DIST, pause_mode=mode)
    (v,) = p.calls("version")
    assert v.body == {"new_version": "9", "abort_all_requests": abort}
    d = P.plan("sglang", "disk", "9", model_path="/m", pause_mode=mode)
    (load,) = d.calls("load")
    assert load.body["abort_all_requests"] is abort and load.body["weight_version"] == "9"


def test_no_flush_phase_when_not_asked():
    assert "flush" not in P.plan("sglang", "disk", "1", model_path="/m", flush=False).phases


@pytest.mark.parametrize(
    "status, body, ok",
    [(200, {"success": True}, True), (200, {"success": False}, False), (400, {}, False), (None, None, False),
     (200, "Cache flushed.", True), (204, None, True)],
)  # fmt: skip
def test_answer_ok(status, body, ok):
    assert P.answer_ok(P.flush_call("sglang"), status, body) is ok


def test_readback():
    c = P.readback_call("vllm")
    assert P.readback(c, 200, {"weight_version": 7}) == "7"
    assert P.readback(c, 500, {"weight_version": "7"}) is None
    assert P.readback(c, 200, {"other": 1}) is None


@given(st.lists(st.one_of(st.none(), st.integers(1, 8)), max_size=20))
def test_rank_offsets_are_disjoint_and_fill_the_world(tps):
    offsets, world = P.rank_offsets(tps)
    ranks = [r for off, tp in zip(offsets, tps) for r in range(off, off + (tp or 1))]
    assert sorted(ranks) == list(range(1, world))


@given(
    st.sampled_from(P.KINDS),
    st.sampled_from(P.SOURCES),
    st.text(min_size=1, max_size=5),
    st.booleans(),
)
def test_every_plan_pauses_first_resumes_last_and_follows_the_phase_order(kind, source, version, flush):
    if P.refusal(kind, source, None):
        return
    p = P.plan(kind, source, version, model_path="/m", dist=DIST, flush=flush)
    order = P.phases_for(source)
    assert p.phases[0] == "pause" and p.phases[-1] == "resume"
    assert [order.index(x) for x in p.phases] == sorted(order.index(x) for x in p.phases)
    assert any(x in P.WEIGHT_PHASES for x in p.phases) or source == "distributed" and kind == "tokenspeed"


@pytest.mark.parametrize(
    ("expected", "body", "bad"),
    [
        ({"a": "1", "b": "2"}, {"checksums": {"a": "1", "b": "2", "extra": "x"}}, []),
        ({"a": "1", "b": "2"}, {"checksums": {"a": "1", "b": "3"}}, ["b"]),
        ({"a": "1", "b": "2"}, {"checksums": {"a": "1"}}, ["b"]),  # not reported = mismatch
        ({"a": "1"}, {"checksums": {"a": 1}}, []),  # compared as text
        ({"a": "1"}, {"status": "reset"}, None),  # no checksums in the answer
        ({"a": "1"}, {"checksums": ["a"]}, None),
        ({"a": "1"}, None, None),
    ],
)
def test_checksum_mismatches(expected, body, bad):
    assert P.checksum_mismatches(expected, body) == bad


@pytest.mark.parametrize(("kind", "mark", "phase"), [("vllm", "checked", True), ("sglang", "unverified", False),
                                                      ("tokenspeed", "unverified", False)])  # fmt: skip
def test_trainer_checksums_add_a_checksum_phase_where_the_kind_has_a_route(kind, mark, phase):
    dist = P.DistributedSource("127.0.0.1", 29500, checksums={"w": "abc"})
    p = P.plan(kind, "distributed", "9", dist=dist)
    assert p.checksums == mark and ("checksum" in p.phases) is phase
    assert P.plan(kind, "distributed", "9", dist=P.DistributedSource("127.0.0.1", 29500)).checksums is None

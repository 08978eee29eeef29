"""Refit grouping (smgrl.state.refits) as table tests over control-event sequences."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smgrl.cli.journal.refits import cycle_row
from smgrl.core.observe import intent_of
from smgrl.history.values import fmt_ms
from smgrl.state.refits import PHASE_ORDER, Cycle, OpsFold, _any_ok, _phases_of, group_cycles, phase_of

E1, E2, E3 = "http://e1:1", "http://e2:1", "http://e3:1"
ALL = (E1, E2, E3)


def events(script):
    """Control events for a script of ``(path, engines, opts)`` steps, one second apart.

    opts: ``v`` weight version in the body, ``fail`` engines answering 500, ``cut`` engines with
    no outcome (then control.interrupted instead of control.finished), ``intent=False`` an old
    record without intent, ``method``.
    """
    seq = itertools.count(1)
    out = []
    for n, (path, engines, opts) in enumerate(script):
        op_id, t = f"op{n}", 100.0 + n
        body = {}
        if "v" in opts:
            body = {"new_version" if path == "update_weight_version" else "weight_version": opts["v"]}
        method = opts.get("method", "POST")
        intent = (
            intent_of(method, path, json.dumps(body).encode()).to_json() if opts.get("intent", True) else None
        )
        targets = [{"worker_id": f"w-{u}", "url": u, "control_url": u} for u in engines]
        p = {
            "op_id": op_id,
            "kind": "fanout",
            "method": method,
            "path": path,
            "targets": targets,
            "intent": intent,
        }
        out.append((next(seq), t, "control.started", p))
        ok = 0
        for u in engines:
            if u in opts.get("cut", ()):
                continue
            status = 500 if u in opts.get("fail", ()) else 200
            ok += status == 200
            o = {"op_id": op_id, "worker_id": f"w-{u}", "status": status, "error": None, "latency_ms": 100}
            out.append((next(seq), t + 0.5, "control.outcome", o))
        if opts.get("cut"):
            out.append((next(seq), t + 0.6, "control.interrupted", {"op_id": op_id}))
        else:
            total = len(engines)
            fin = {"op_id": op_id, "result": "ok" if ok == total else "partial", "total": total}
            fin.update(succeeded=ok, failed=total - ok, latency_ms=600)
            out.append((next(seq), t + 0.6, "control.finished", fin))
    return out


def cycles_of(script):
    fold = OpsFold()
    for row in events(script):
        fold.apply(*row)
    return group_cycles(fold.in_order())


def summary(script):
    return [(c.status, c.version, tuple(c.phases()), len(c.engines)) for c in cycles_of(script)]


P, U, R = "pause_generation", "update_weights_from_disk", "continue_generation"

CASES = {
    "sglang disk refit": (
        [(P, ALL, {}), (U, ALL, {"v": "s1"}), (R, ALL, {})],
        [("ok", "s1", ("pause", "update", "resume"), 3)],
    ),
    "vllm pause / collective_rpc / resume": (
        [("pause", ALL, {}), ("collective_rpc", ALL, {}), ("resume", ALL, {})],
        [("ok", None, ("pause", "update", "resume"), 3)],
    ),
    "vllm weight transfer: setup outside any refit is not one": (
        [
            ("init_weight_transfer_engine", ALL, {}),
            ("pause", ALL, {}),
            ("start_weight_update", ALL, {}),
            ("update_weights", ALL, {}),
            ("update_weights", ALL, {}),
            ("finish_weight_update", ALL, {"v": "s2"}),
            ("resume", ALL, {}),
        ],
        [("ok", "s2", ("pause", "update", "resume"), 3)],
    ),
    "tokenspeed distributed chunks inside pause/continue": (
        [
            (P, ALL, {}),
            ("init_weights_update_group", ALL, {}),
            ("update_weights_from_distributed", ALL, {}),
            ("update_weights_from_distributed", ALL, {}),
            ("update_weights_from_distributed", ALL, {"v": "s3"}),
            ("destroy_weights_update_group", ALL, {}),
            (R, ALL, {}),
        ],
        [("ok", "s3", ("pause", "setup", "update", "teardown", "resume"), 3)],
    ),
    "updates without pause: one cycle per version": (
        [(U, ALL, {"v": "s1"}), (U, ALL, {"v": "s2"})],
        [("ok", "s1", ("update",), 3), ("ok", "s2", ("update",), 3)],
    ),
    "unpaused chunks until a version is set": (
        [
            ("update_weights_from_distributed", ALL, {}),
            ("update_weights_from_distributed", ALL, {}),
            ("update_weights_from_distributed", ALL, {"v": "s4"}),
            ("flush_cache", ALL, {}),
        ],
        [("ok", "s4", ("update",), 3)],
    ),
    "unpaused chunks never finished": (
        [("update_weights_from_tensor", ALL, {})],
        [("open", None, ("update",), 3)],
    ),
    "pause without resume is open": (
        [(P, ALL, {}), (U, ALL, {"v": "s1"})],
        [("open", "s1", ("pause", "update"), 3)],
    ),
    "a new pause abandons a refit that never resumed": (
        [(P, ALL, {}), (U, ALL, {"v": "s1"}), (P, ALL, {}), (U, ALL, {"v": "s1"}), (R, ALL, {})],
        [("abandoned", "s1", ("pause", "update"), 3), ("ok", "s1", ("pause", "update", "resume"), 3)],
    ),
    "one engine refuses the update": (
        [(P, ALL, {}), (U, ALL, {"v": "s1", "fail": {E2}}), (R, ALL, {})],
        [("failed", "s1", ("pause", "update", "resume"), 3)],
    ),
    "per-engine calls join one cycle, closed by the last resume": (
        [(P, (E1,), {}), (P, (E2,), {}), (U, (E1, E2), {"v": "s1"}), (R, (E1,), {}), (R, (E2,), {})],
        [("ok", "s1", ("pause", "update", "resume"), 2)],
    ),
    "flush inside a refit is a phase, outside it is nothing": (
        [
            ("flush_cache", ALL, {}),
            (P, ALL, {}),
            (U, ALL, {"v": "s1"}),
            ("flush_cache", ALL, {}),
            (R, ALL, {}),
        ],
        [("ok", "s1", ("pause", "update", "flush", "resume"), 3)],
    ),
    "calls that are no refit phase are ignored": (
        [("generate", ALL, {}), ("get_weight_version", ALL, {}), (P, ALL, {"method": "HEAD"})],
        [],
    ),
    "records without intent use the path": (
        [("/pause_generation", ALL, {"intent": False}), ("/continue_generation", ALL, {"intent": False})],
        [("ok", None, ("pause", "resume"), 3)],
    ),
    "sleep and wake inside a refit": (
        [
            (P, ALL, {}),
            ("release_memory_occupation", ALL, {}),
            ("resume_memory_occupation", ALL, {}),
            (R, ALL, {}),
        ],
        [("ok", None, ("pause", "sleep", "wake", "resume"), 3)],
    ),
    "an update cut short by a crash leaves the cycle open": (
        [(P, ALL, {}), (U, ALL, {"v": "s1", "cut": {E3}})],
        [("open", "s1", ("pause", "update"), 3)],
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_grouping(name):
    script, expected = CASES[name]
    assert summary(script) == expected


def test_failures_name_the_engine_and_the_phase():
    (c,) = cycles_of([(P, ALL, {}), (U, ALL, {"v": "s1", "fail": {E2}}), (R, ALL, {})])
    assert c.failures() == {E2: ["update: HTTP 500"]}
    assert c.to_json()["failed"] == {E2: ["update: HTTP 500"]}


def test_cut_short_targets_have_no_outcome():
    (c,) = cycles_of([(P, ALL, {}), (U, ALL, {"v": "s1", "cut": {E3}})])
    assert c.failures() == {E3: ["update: no outcome (interrupted)"]}
    missing = [s for s in c.spans() if s.state == "missing"]
    assert [(s.engine, s.phase) for s in missing] == [(E3, "update")]


def test_partial_resume_then_a_new_pause_ends_the_cycle_with_the_engine_never_resumed():
    first, second = cycles_of([(P, ALL, {}), (U, ALL, {"v": "s1"}), (R, (E1, E2), {}), (P, ALL, {})])
    assert first.status == "failed" and first.failures() == {E3: ["resume: never resumed"]}
    assert second.status == "open"


def test_dp_ranks_are_one_engine():
    fold = OpsFold()
    targets = [{"worker_id": f"r{i}", "url": f"http://dp:1@{i}"} for i in range(2)]
    fold.apply(1, 1.0, "control.started", {"op_id": "a", "path": P, "targets": targets, "intent": None})
    fold.apply(
        2, 2.0, "control.finished", {"op_id": "a", "result": "ok", "total": 2, "succeeded": 2, "failed": 0}
    )
    (c,) = group_cycles(fold.in_order())
    assert list(c.engines) == ["http://dp:1"]


def test_span_timing_comes_from_the_outcome_latency():
    (c,) = cycles_of([(U, (E1,), {"v": "s1"})])
    (span,) = c.spans()
    assert span.end == 100.5 and span.start == pytest.approx(100.4) and span.state == "ok"


def test_clean_ops_need_no_outcomes():
    fold = OpsFold()
    for seq, ts, type_, p in events([(U, ALL, {"v": "s1"})]):
        if type_ != "control.outcome":
            fold.apply(seq, ts, type_, p)
    (op,) = fold.in_order()
    assert not fold.needs_outcomes(op)
    assert {s.state for s in op.spans()} == {"ok"}
    (c,) = group_cycles([op])
    assert c.status == "ok" and c.version == "s1"


@pytest.mark.parametrize(
    "path, intent, method, phase",
    [
        ("pause_generation", None, "POST", "pause"),
        ("/resume", None, "POST", "resume"),
        ("x", {"phase": "update"}, "POST", "update"),
        ("pause", None, "HEAD", None),
        ("generate", None, "POST", None),
    ],
)
def test_phase_of(path, intent, method, phase):
    assert phase_of(path, intent, method) == phase


# The shortcuts of the grouping (a finished clean cycle's failures, the usual three-op cycle's
# phases, the version read from the newest op, engines merged only when new) against the
# general computations, over random scripts of refit calls.
_PATHS = (P, U, R, "flush_cache", "update_weights_from_distributed", "update_weight_version", "generate")
_engines = st.lists(st.sampled_from(ALL), min_size=1, max_size=3, unique=True)


@st.composite
def _steps(draw):
    path, engines = draw(st.sampled_from(_PATHS)), tuple(draw(_engines))
    opts = {}
    if draw(st.booleans()):
        opts["v"] = draw(st.sampled_from(("s1", "s2")))
    bad = draw(st.lists(st.sampled_from(engines), unique=True))
    if bad:
        opts[draw(st.sampled_from(("fail", "cut")))] = set(bad)
    return path, engines, opts


@settings(max_examples=300, deadline=None)
@given(st.lists(_steps(), max_size=12), st.booleans())
def test_grouping_shortcuts_agree_with_the_general_computation(script, refit_shaped):
    if refit_shaped:  # the usual cycle first: pause, update, resume over the same engines
        script = [(P, ALL, {}), (U, ALL, {"v": "s1"}), (R, ALL, {}), *script]
    for c in cycles_of(script):
        assert c.phases() == _phases_of(c.ops)
        fresh = Cycle(c.index, c.paused, list(c.ops), dict(c.engines), set(c.resumed), c.stage, c.status)
        assert c.failures() == fresh.failures()
        if c.status == "ok":
            assert not fresh.failures()
        reached = [op.version for op in c.ops if op.version is not None and _any_ok(op)]
        tried = [op.version for op in c.ops if op.version is not None]
        assert c.version == (reached or tried or [None])[-1]
        assert list(c.engines) == list(dict.fromkeys(e for op in c.ops for e in op.targets.values()))
        assert cycle_row(c, list(PHASE_ORDER))["total"] == fmt_ms(c.end - c.start)

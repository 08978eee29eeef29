"""The registry and engine-state projections as pure folds over journal events."""

import pytest

from smgrl.core.observe import intent_of
from smgrl.events import (
    ControlFinished,
    ControlInterrupted,
    ControlOutcome,
    ControlStarted,
    WorkerDiscovered,
    WorkerHealthChanged,
    WorkerLabelsChanged,
    WorkerRegistered,
    WorkerRemoved,
)
from smgrl.state.fleet import FleetState


def registered(wid, url, **kw):
    return WorkerRegistered(worker_id=wid, url=url, base_url=url.split("@")[0], source="api", **kw)


def fold(*events):
    fleet = FleetState()
    for seq, e in enumerate(events, 1):
        fleet.apply(seq, e)
    return fleet


def test_registration_is_pending_until_discovered():
    f = fold(registered("a", "http://h:1", labels={"role": "policy"}, has_api_key=True))
    w = f.registry.get("a")
    assert (
        w.status == "pending" and not w.is_visible and w.has_api_key and w.caller_labels == {"role": "policy"}
    )
    f.apply(
        2,
        WorkerDiscovered(
            worker_id="a",
            runtime="sglang",
            labels={"tp_size": "1", "role": "x"},
            model_id="m",
        ),
    )
    w = f.registry.get("a")
    assert w.status == "ready" and w.engine == "sglang" and w.labels == {"tp_size": "1", "role": "policy"}
    assert w.effective_model_id == "m"


def test_dp_discovery_creates_ranks_sharing_one_group():
    f = fold(
        registered("r0", "http://h:1", dp_aware=True),
        WorkerDiscovered(
            worker_id="r0",
            runtime="sglang",
            labels={"dp_size": "3"},
            dp_rank_ids=["r0", "r1", "r2"],
        ),
    )
    urls = {w.id: (w.url, w.dp_rank, w.dp_size, w.group) for w in f.registry}
    assert urls == {
        "r0": ("http://h:1@0", 0, 3, "r0"),
        "r1": ("http://h:1@1", 1, 3, "r0"),
        "r2": ("http://h:1@2", 2, 3, "r0"),
    }
    assert f.registry.conflict_for("http://h:1").id == "r0"
    assert f.registry.conflict_for("http://h:1@2").id == "r2"
    f.apply(3, WorkerHealthChanged(worker_id="r0", health="not_ready", reason="x"))
    assert {w.status for w in f.registry} == {"not_ready"}
    f.apply(4, WorkerRemoved(worker_id="r1", reason="x"))
    assert len(f.registry) == 0 and f.registry.conflict_for("http://h:1") is None


@pytest.mark.parametrize(
    "mode, expected",
    [("merge", {"a": "1", "b": "2", "c": "3"}), ("replace", {"c": "3"})],
)
def test_label_changes(mode, expected):
    f = fold(
        registered("a", "http://h:1", labels={"a": "1", "b": "2"}),
        WorkerLabelsChanged(worker_id="a", labels={"c": "3"}, mode=mode),
    )
    assert f.registry.get("a").caller_labels == expected


def test_unknown_events_and_unknown_workers_are_skipped():
    from journal.codec import UnknownEvent

    f = fold(
        UnknownEvent("worker.teleported", 9, {"worker_id": "a"}),
        WorkerRemoved(worker_id="ghost", reason="x"),
        WorkerLabelsChanged(worker_id="ghost", labels={}, mode="merge"),
    )
    assert len(f.registry) == 0


def op(op_id, path, body, targets, method="POST", kind="fanout"):
    return ControlStarted(
        op_id=op_id,
        kind=kind,
        method=method,
        path=path,
        body_size=len(body),
        body_sha256="0" * 64,
        targets=[{"worker_id": w, "url": u, "control_url": u} for w, u in targets],
        intent=intent_of(method, path, body).to_json(),
    )


def outcome(op_id, wid, url, status=200, error=None, message=None, stage=None):
    if error == "upstream_timeout" and stage is None:
        stage = "head"  # what smgrl/control/call.py records for a deadline before the answer
    return ControlOutcome(
        stage=stage,
        op_id=op_id,
        worker_id=wid,
        url=url,
        control_url=url,
        status=status,
        latency_ms=1,
        error=error,
        message=message,
        excerpt="",
        body_truncated=False,
    )


def finished(op_id, result="ok"):
    return ControlFinished(
        op_id=op_id,
        result=result,
        http_status=200,
        total=1,
        succeeded=1,
        failed=0,
        latency_ms=1,
    )


FLEET = [("a", "http://a:1"), ("b", "http://b:1")]


def base_fleet():
    return [
        registered("a", "http://a:1"),
        registered("b", "http://b:1"),
        WorkerDiscovered(worker_id="a", runtime="sglang", labels={"weight_version": "default"}),
        WorkerDiscovered(worker_id="b", runtime="sglang", labels={"weight_version": "3"}),
    ]


def test_refit_confirmed_by_2xx_sets_version_and_control():
    f = fold(
        *base_fleet(),
        op("p", "pause_generation", b"{}", FLEET),
        outcome("p", "a", "http://a:1"),
        outcome("p", "b", "http://b:1"),
        finished("p"),
        op("u", "update_weights_from_disk", b'{"model_path":"/c","weight_version":"7"}', FLEET),
        outcome("u", "a", "http://a:1"),
        outcome("u", "b", "http://b:1"),
        finished("u"),
    )
    for base in ("http://a:1", "http://b:1"):
        facts = f.engines.get(base)
        assert (facts.weight_version, facts.version_source, facts.control) == ("7", "passthrough", "paused")
        assert facts.version_known and not facts.mixed
    assert f.engines.get("http://b:1") is not None


def test_partial_refit_leaves_the_failed_engine_mixed_and_a_timeout_unknown():
    three = FLEET + [("c", "http://c:1")]
    f = fold(
        *base_fleet(),
        registered("c", "http://c:1"),
        WorkerDiscovered(worker_id="c", runtime="sglang", labels={}),
        op("u", "update_weight_version", b'{"new_version":"8"}', three),
        outcome("u", "a", "http://a:1"),
        outcome("u", "b", "http://b:1", status=400),
        outcome("u", "c", "http://c:1", status=None, error="upstream_timeout", message="timed out"),
        finished("u", "partial"),
    )
    a, b, c = (f.engines.get(f"http://{x}:1") for x in "abc")
    assert a.weight_version == "8" and not a.mixed
    assert b.weight_version is None and b.mixed and b.version_known
    assert not c.version_known and c.mixed
    # A later confirmed refit clears both marks.
    f.apply(100, op("v", "update_weight_version", b'{"new_version":"9"}', three))
    for wid in "abc":
        f.apply(101, outcome("v", wid, f"http://{wid}:1"))
    f.apply(102, finished("v"))
    assert all(f.engines.get(f"http://{x}:1").weight_version == "9" for x in "abc")
    assert not any(f.engines.get(f"http://{x}:1").mixed for x in "abc")
    assert all(f.engines.get(f"http://{x}:1").version_known for x in "abc")


def test_refused_call_changes_nothing_and_cut_short_call_is_unknown():
    f = fold(
        *base_fleet(),
        op("p", "pause_generation", b"", FLEET),
        outcome("p", "a", "http://a:1", status=400),
        ControlInterrupted(
            op_id="p",
            reason="gateway_restart",
            recorded_targets=["a"],
            missing_targets=["b"],
        ),
    )
    assert f.engines.get("http://a:1").control == "active"
    assert f.engines.get("http://b:1").control == "unknown"
    f.apply(50, op("c", "continue_generation", b"{}", FLEET[1:]))
    f.apply(51, outcome("c", "b", "http://b:1"))
    f.apply(52, finished("c"))
    assert f.engines.get("http://b:1").control == "active"


# How far a failed exchange got decides whether the engine may have acted (the structured
# ``stage``), whatever the message says.
STAGE_CASES = [
    # (error, stage, message, control afterwards)
    ("upstream_unreachable", "connect", "error sending request", "active"),
    ("upstream_unreachable", "send", "error sending request", "active"),
    ("upstream_unreachable", "body", "anything at all", "unknown"),
    ("upstream_timeout", "head", "timed out", "unknown"),
    # The text alone no longer decides: a message that merely mentions a body read, with the
    # exchange stopped before sending, changed nothing on the engine.
    ("upstream_unreachable", "connect", "reading response body: error decoding response body", "active"),
]


@pytest.mark.parametrize(("error", "stage", "message", "control"), STAGE_CASES)
def test_engine_state_follows_the_structured_stage_of_a_failed_call(error, stage, message, control):
    f = fold(
        *base_fleet(),
        op("p", "pause_generation", b"{}", FLEET[:1]),
        outcome("p", "a", "http://a:1", status=None, error=error, message=message, stage=stage),
        finished("p", "partial"),
    )
    assert f.engines.get("http://a:1").control == control


@pytest.mark.parametrize("end", ["finished", "interrupted"])
def test_engine_removed_during_an_operation_and_registered_again_is_not_unknown(end):
    """The operation ends (or is found interrupted at restart) after its target was removed and a
    new engine registered at the same URL: the new engine never got that call."""
    closing = (
        finished("p", "cancelled")
        if end == "finished"
        else ControlInterrupted(op_id="p", reason="gateway_restart", missing_targets=["a"])
    )
    f = fold(
        *base_fleet(),
        op("p", "pause_generation", b"{}", FLEET[:1]),
        WorkerRemoved(worker_id="a", reason="removed through DELETE /workers"),
        registered("a2", "http://a:1"),
        WorkerDiscovered(worker_id="a2", runtime="sglang", labels={}),
        closing,
    )
    facts = f.engines.get("http://a:1")
    assert facts.control == "active" and facts.version_known and not facts.mixed
    # The operation's other target, never removed, is still marked as cut short.
    assert "p" not in f.operations.open


def test_operations_projection_tracks_open_and_finished():
    f = fold(*base_fleet(), op("p", "flush_cache", b"", FLEET, method="GET"), outcome("p", "a", "http://a:1"))
    assert "p" in f.operations.open
    f.apply(10, finished("p", "partial"))
    rec = f.operations.get("p")
    assert rec.result == "partial" and rec.missing == ["b"] and "p" not in f.operations.open
    js = rec.to_json()
    assert js["targets"][0]["outcome"]["status"] == 200 and js["targets"][1]["outcome"] is None


@pytest.mark.parametrize(
    "method, path, body, version, control",
    [
        ("POST", "update_weights_from_disk", b'{"model_path":"/x","weight_version":"v1"}', "v1", None),
        ("POST", "update_weights_from_distributed", b'{"weight_version": 12}', "12", None),
        ("POST", "update_weights_from_tensor", b'{"weight_version": true}', None, None),
        ("POST", "update_weight_version", b'{"new_version":" 5 "}', "5", None),
        ("POST", "finish_weight_update", b'{"weight_version":"w"}', "w", None),
        ("POST", "update_weights_from_disk", b"not json", None, None),
        ("POST", "pause_generation", b"", None, "paused"),
        ("POST", "pause", b"", None, "paused"),
        ("POST", "continue_generation", b"{}", None, "active"),
        ("POST", "wake_up", b"", None, "active"),
        ("GET", "release_memory_occupation", b"{}", None, "asleep"),
        ("POST", "sleep", b"", None, "asleep"),
        ("HEAD", "pause_generation", b"", None, None),
        ("POST", "flush_cache", b"", None, None),
        ("POST", "update_weight_version", b'{"new_version":"has space"}', None, None),
    ],
)
def test_intents(method, path, body, version, control):
    i = intent_of(method, path, body)
    assert (i.version, i.control) == (version, control)

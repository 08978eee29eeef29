"""Events: the registry, the canonical codec, UnknownEvent, body fields, Append."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import typing

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st
from journal_helpers import registered, started

from journal import Append, ControlStarted, Event, UnknownEvent, event_type
from smgrl.events import (
    AuditControlPlane,
    ControlFinished,
    ControlInterrupted,
    ControlOutcome,
    GatewayStarted,
    GatewayStopped,
    SnapshotTaken,
    WorkerDiscovered,
    WorkerHealthChanged,
    WorkerLabelsChanged,
    WorkerProbeFailed,
    WorkerRegistered,
    WorkerRemoved,
    decode,
    encode,
    event_class,
)

CATALOGUE = {
    "worker.registered": WorkerRegistered,
    "worker.discovered": WorkerDiscovered,
    "worker.probe_failed": WorkerProbeFailed,
    "worker.labels_changed": WorkerLabelsChanged,
    "worker.health_changed": WorkerHealthChanged,
    "worker.removed": WorkerRemoved,
    "control.started": ControlStarted,
    "control.outcome": ControlOutcome,
    "control.finished": ControlFinished,
    "control.interrupted": ControlInterrupted,
    "audit.control_plane": AuditControlPlane,
    "gateway.started": GatewayStarted,
    "gateway.stopped": GatewayStopped,
    "snapshot.taken": SnapshotTaken,
}

_json_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=10)
_json = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


def _strategy(tp: object) -> st.SearchStrategy:
    if tp is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if tp == dict[str, typing.Any]:
        return st.dictionaries(st.text(max_size=8), _json, max_size=4)
    return st.from_type(tp)  # type: ignore[arg-type]


def _events(cls: type[Event]) -> st.SearchStrategy:
    """Every field generated (st.builds alone would leave defaulted fields at their defaults)."""
    hints = typing.get_type_hints(cls)
    return st.builds(cls, **{f.name: _strategy(hints[f.name]) for f in attrs.fields(cls)})


def _written(ev: Event) -> bool:
    """Only what the gateway can write: a kept control.started body names its encoding (one whose
    body and encoding disagree is a tampered row, decoded as unknown: its own test below)."""
    if isinstance(ev, ControlStarted):
        return (ev.body is None) == (ev.body_encoding == "none")
    return True


any_event = (
    st.sampled_from(sorted(CATALOGUE.values(), key=lambda c: c.TYPE)).flatmap(_events).filter(_written)
)


def test_catalogue_is_registered():
    for name, cls in CATALOGUE.items():
        assert cls.TYPE == name
        # control.started and refit.started gained ``gateway`` (several processes): schema 2.
        assert cls.SCHEMA == (2 if name in ("control.started", "refit.started") else 1)
        assert event_class(name) is cls
        assert attrs.has(cls)
        assert issubclass(cls, Event)
    assert event_class("no.such") is None


def test_events_are_frozen():
    ev = registered()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ev.worker_id = "other"  # type: ignore[misc]


@given(any_event)
def test_encode_is_the_canonical_asdict_json(ev):
    type_, schema, payload = encode(ev)
    expected = json.dumps(
        attrs.asdict(ev, recurse=True), separators=(",", ":"), sort_keys=True, ensure_ascii=False
    )
    assert (type_, schema, payload) == (type(ev).TYPE, type(ev).SCHEMA, expected)


@given(any_event)
def test_decode_round_trips(ev):
    assert decode(*encode(ev)) == ev


def test_decode_falls_back_to_unknown_event():
    payload = {"worker_id": "w1", "reason": "api"}
    text = json.dumps(payload)
    assert decode("worker.removed", 1, text) == WorkerRemoved(worker_id="w1", reason="api")
    assert decode("fleet.new_thing", 1, text) == UnknownEvent("fleet.new_thing", 1, payload)
    assert decode("worker.removed", 2, text) == UnknownEvent("worker.removed", 2, payload)  # newer schema
    missing = {"worker_id": "w1"}
    assert decode("worker.removed", 1, json.dumps(missing)) == UnknownEvent("worker.removed", 1, missing)
    extra = {**payload, "surprise": 1}
    assert decode("worker.removed", 1, json.dumps(extra)) == UnknownEvent("worker.removed", 1, extra)
    assert decode("worker.removed", 1, "[1, 2]") == UnknownEvent("worker.removed", 1, [1, 2])
    assert decode("worker.removed", 1, "{oops") == UnknownEvent("worker.removed", 1, "{oops")


def test_missing_optional_fields_take_defaults():
    ev = decode("worker.discovered", 1, '{"worker_id": "w1", "runtime": "sglang"}')
    assert ev == WorkerDiscovered(worker_id="w1", runtime="sglang")
    assert ev.dp_rank_ids == ()


def test_unknown_event_reencodes_to_the_same_payload():
    payload = '{"a":[1,2],"b":"é"}'
    ev = decode("fleet.x", 3, payload)
    assert isinstance(ev, UnknownEvent)
    assert encode(ev) == ("fleet.x", 3, payload)
    with pytest.raises(TypeError):
        encode(UnknownEvent("fleet.x", 1, "{not json"))


def test_encode_refuses_unregistered_classes_and_non_json_values():
    @attrs.frozen(slots=True)
    class Stray(Event):
        x: int

    with pytest.raises(TypeError):
        encode(Stray(x=1))
    with pytest.raises(ValueError):
        encode(WorkerProbeFailed(worker_id="w", attempt=1, error="e", next_retry_s=math.nan))
    with pytest.raises(TypeError):
        encode(WorkerRemoved(worker_id=b"w", reason="x"))  # type: ignore[arg-type]


def test_registry_refuses_a_second_class_for_a_type():
    with pytest.raises(ValueError):

        @event_type("worker.removed", schema=1)
        @attrs.frozen(slots=True, kw_only=True)
        class Impostor(Event):
            worker_id: str

    with pytest.raises(TypeError):
        event_type("x.plain", schema=1)(type("Plain", (), {}))
    with pytest.raises(ValueError):
        event_type("x.bad", schema=0)


@pytest.mark.parametrize(
    ("raw", "encoding", "kept"),
    [
        (b'{"a": 1}', "utf8", '{"a": 1}'),
        ("héllo".encode(), "utf8", "héllo"),
        (b"\xff\x00", "base64", base64.b64encode(b"\xff\x00").decode()),
        (b"", "none", None),
        (b"x" * (64 * 1024 + 1), "none", None),
    ],
)
def test_body_fields(raw, encoding, kept):
    fields = ControlStarted.body_fields(raw)
    assert fields == {
        "body_size": len(raw),
        "body_sha256": hashlib.sha256(raw).hexdigest(),
        "body": kept,
        "body_encoding": encoding,
    }
    ev = started(body=raw)
    assert ev.body_bytes() == (raw if kept is not None else None)


def test_a_row_whose_body_and_encoding_disagree_decodes_as_unknown():
    # A tampered row (a body kept, its encoding changed to "none"): shown, never folded.
    type_, schema, payload = encode(attrs.evolve(started(body=b"abc"), body_encoding="none"))
    assert isinstance(decode(type_, schema, payload), UnknownEvent)
    assert decode(*encode(started(body=b"abc"))) == started(body=b"abc")


def test_body_at_the_limit_is_kept():
    assert ControlStarted.body_fields(b"x" * 64 * 1024)["body_encoding"] == "utf8"


@given(
    raw=st.one_of(st.binary(max_size=64), st.text(max_size=32).map(str.encode)),
    urls=st.lists(st.text(max_size=12), max_size=4),
    selector=st.one_of(st.none(), st.text(max_size=12)),
)
def test_a_kept_body_is_hashed_as_the_parsed_payload_with_a_null_body(raw, urls, selector):
    """prepare() splices ``"body": null`` into the canonical payload instead of parsing it and
    encoding it again: the text hashed is the same either way."""
    from journal._chain import hashed_payload

    targets = tuple({"worker_id": f"w{i}", "url": u, "control_url": None} for i, u in enumerate(urls))
    ev = attrs.evolve(started(body=raw), selector=selector, targets=targets)
    item = Append("control", ev)
    payload = item._prepared.payload
    assert (
        item._prepared.hashed_utf8 == hashed_payload("control.started", payload, json.loads(payload)).encode()
    )
    if ev.body is not None:
        assert b'"body":null' in item._prepared.hashed_utf8


class TestAppend:
    def test_inconsistent_body_is_refused_in_the_caller(self):
        good = started()
        with pytest.raises(ValueError, match="body"):
            Append("control", attrs.evolve(good, body='{"other": 1}'))
        with pytest.raises(ValueError, match="body"):
            Append("control", attrs.evolve(good, body_encoding="base64", body="!!!"))
        Append("control", attrs.evolve(good, body=None))  # a body that was not kept is fine

    def test_stream_and_secrets_are_checked(self):
        with pytest.raises(ValueError):
            Append("", registered())
        with pytest.raises(ValueError):
            Append("workers", registered(), {"": "k"})
        with pytest.raises(ValueError):
            Append("workers", registered(), {"w1": 42})  # type: ignore[dict-item]
        with pytest.raises(UnicodeEncodeError):
            Append("workers", WorkerRemoved(worker_id="w\ud800", reason="x"))

    def test_repr_masks_secrets(self):
        item = Append("workers", registered(), {"w1": "sk-123456", "w2": None})
        assert "sk-123456" not in repr(item)
        assert "'w1': '***'" in repr(item)
        assert item.secrets == {"w1": "sk-123456", "w2": None}


def test_control_started_of_schema_1_decodes_without_a_gateway():
    """A journal written before several processes shared one: its operations name no process."""
    from journal.codec import ControlStarted
    from smgrl.events import decode, encode

    ev = ControlStarted(
        op_id="op", kind="call", method="POST", path="flush_cache", **ControlStarted.body_fields(b"")
    )
    _, schema, payload = encode(ev)
    assert schema == 2
    old = json.loads(payload)
    del old["gateway"]
    back = decode("control.started", 1, json.dumps(old))
    assert isinstance(back, ControlStarted) and back.gateway is None
    # And a newer schema than this code knows stays opaque.
    assert not isinstance(decode("control.started", 3, payload), ControlStarted)

"""More hypothesis properties of the pure core: what engines and callers send can be
anything, and each parser fails only in its own way.

- label maps: whatever JSON an engine answers discovery with, labels are str -> str;
- registration bodies: ``/workers`` bodies either parse or raise ``WorkerApiError`` 400 BAD_REQUEST;
- outcome decoding: ``decode_engine_body`` never raises, and what it returns can always be put on
  the wire (strict JSON, valid UTF-8);
- the registry probe's JSON reader never raises (a deeply nested answer used to crash the gateway).
"""

from __future__ import annotations

import json
import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from smgrl.control import outcome as outcome_rules
from smgrl.control.outcome import BODY_CAP, EXCERPT_CAP, Outcome, decode_engine_body
from smgrl.core.discovery import (
    MODEL_INFO_KEYS,
    SERVER_INFO_KEYS,
    grpc_labels,
    label_value,
    sglang_labels,
    vllm_labels,
)
from smgrl.core.errors import WorkerApiError
from smgrl.core.wire import json_bytes
from smgrl.http.bodies.workers_body import (
    WORKER_SPEC,
    check_content_type,
    is_json_content_type,
    parse_worker_spec,
    parse_worker_update,
    uuid_error,
)
from smgrl.registry.probe import _json as probe_json

# JSON values as Python's json module produces them (NaN and infinities included: json.loads
# accepts them, and so the probe can hand them over).
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _info(keys):
    """A server-info-like object: the keys discovery reads, with any JSON values, plus noise."""
    return st.one_of(
        st.none(),
        st.dictionaries(st.sampled_from(keys), json_values, max_size=len(keys)),
        st.dictionaries(st.text(max_size=10), json_values, max_size=5),
    )


models_docs = st.one_of(
    st.none(),
    json_values.filter(lambda v: isinstance(v, dict)),
    st.fixed_dictionaries(
        {
            "data": st.one_of(
                json_values,
                st.lists(
                    st.dictionaries(
                        st.sampled_from(["id", "root", "owned_by", "max_model_len"]), json_values
                    ),
                    max_size=2,
                ),
            )
        }
    ),
)


def _assert_labels(labels):
    assert isinstance(labels, dict)
    for k, v in labels.items():
        assert isinstance(k, str) and isinstance(v, str), (k, v)


@given(json_values)
@example(float("nan"))
@example(2**80)
@example({"a": [1, {"b": None}]})
def test_label_value_is_none_only_for_null_and_otherwise_a_string(value):
    out = label_value(value)
    if value is None:
        assert out is None
    else:
        assert isinstance(out, str)
        out.encode("utf-8", "surrogatepass")


@given(_info(list(SERVER_INFO_KEYS)), _info(list(MODEL_INFO_KEYS)), models_docs)
@settings(max_examples=200)
def test_sglang_labels_are_strings_whatever_the_engine_answers(server_info, model_info, models):
    found = sglang_labels(server_info, model_info, models)
    _assert_labels(found.labels)
    assert found.model_id is None or isinstance(found.model_id, str)
    assert found.dp_size is None or (isinstance(found.dp_size, int) and found.dp_size >= 0)


@given(models_docs, _info(["version"]))
def test_vllm_labels_are_strings(models, version):
    found = vllm_labels(models, version)
    _assert_labels(found.labels)


@given(
    _info(
        [
            *SERVER_INFO_KEYS,
            "server_args",
            "tensor_parallel_size",
            "rl.control_url",
            "rl.pause_modes",
            "tokenspeed_version",
            "is_paused",
        ]
    ),
    st.sampled_from(["tokenspeed", "sglang", "unknown"]),
)
def test_grpc_labels_are_strings(info, runtime):
    found = grpc_labels(info, runtime)
    _assert_labels(found.labels)
    assert "is_paused" not in found.labels  # transient keys never become labels


@given(st.binary(max_size=200))
@example(b"[" * 100_000)  # deeper than Python's recursion limit: was a RecursionError
@example(b'{"a":' * 50_000)
@example(b"\xff\xfe")
def test_the_probe_json_reader_never_raises(data):
    value = probe_json(data)
    assert value is None or isinstance(value, dict)


# -- registration bodies --------------------------------------------------------------------------

FIELD_VALUES = st.one_of(
    json_values,
    st.just("http://127.0.0.1:1"),
    st.just("sglang"),
    st.just("decode"),
    st.integers(min_value=0, max_value=70_000),
)
spec_objects = st.dictionaries(
    st.one_of(
        st.sampled_from(sorted(WORKER_SPEC) + ["runtime_type", "model_id", "labels"]), st.text(max_size=6)
    ),
    FIELD_VALUES,
    max_size=6,
)
bodies = st.one_of(
    st.binary(max_size=100),
    json_values.map(lambda v: json.dumps(v).encode()),
    spec_objects.map(lambda v: json.dumps(v).encode()),
    st.builds(
        lambda d, u: json.dumps({**d, "url": u}).encode(),
        spec_objects,
        st.one_of(
            st.text(max_size=30),
            st.sampled_from(["http://", "http://:1", "grpc://h", "http://a b", "ipc:///tmp/x", "HTTP://h"]),
        ),
    ),
)


def _refused(exc: WorkerApiError) -> None:
    assert (exc.status, exc.code) == (400, "BAD_REQUEST")
    assert exc.body() == {"error": exc.message, "code": "BAD_REQUEST"}
    assert isinstance(exc.message, str) and exc.message
    json_bytes(exc.body())  # always renderable


@given(bodies)
@settings(max_examples=300)
@example(b'{"url": "http://127.0.0.1:1", "labels": {"a": 1}}')
@example(b'{"url": 1}')
@example(b"[" * 5000)
@example(b'{"url": "http://h", "url": "http://h"}')
@example(b'{"url": "http://h", "bootstrap_port": 70000}')
def test_worker_spec_parses_or_raises_bad_request_only(data):
    try:
        spec = parse_worker_spec(data)
    except WorkerApiError as exc:
        _refused(exc)
    else:
        assert isinstance(spec["url"], str) and spec["url"]
        _assert_labels(spec["labels"])
        assert spec["api_key"] is None or isinstance(spec["api_key"], str)
        assert spec["bootstrap_port"] is None or 0 <= spec["bootstrap_port"] <= 65535


@given(bodies)
@example(b'{"labels": null}')
@example(b'{"labels": {"k": "v"}, "priority": -1}')
def test_worker_update_parses_or_raises_bad_request_only(data):
    try:
        update = parse_worker_update(data)
    except WorkerApiError as exc:
        _refused(exc)
    else:
        assert isinstance(update, dict)
        if update.get("labels") is not None:
            _assert_labels(update["labels"])


@given(
    st.one_of(
        st.none(),
        st.text(max_size=40),
        st.sampled_from(
            [
                "application/json",
                "Application/JSON; charset=utf-8",
                "application/vnd.x+json",
                "text/json",
                "json",
            ]
        ),
    )
)
def test_content_type_check_raises_only_bad_request(value):
    try:
        check_content_type(value)
    except WorkerApiError as exc:
        _refused(exc)
        assert not is_json_content_type(value)
    else:
        assert is_json_content_type(value)


@given(st.text(max_size=50))
@example("{0123456789abcdef0123456789abcdef}")
@example("urn:uuid:")
@example("{}")
def test_uuid_check_returns_none_or_a_message(text):
    out = uuid_error(text)
    assert out is None or (isinstance(out, str) and out)


# -- outcome decoding ------------------------------------------------------------------------------

content_types = st.one_of(
    st.none(),
    st.text(max_size=30),
    st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-8",
            "text/plain",
            "JSON",
            "application/problem+json",
            "",
        ]
    ),
)
engine_bodies = st.one_of(
    st.binary(max_size=300),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.text(max_size=100).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.sampled_from(
        [
            b"NaN",
            b"1e400",
            b"-0",
            b"18446744073709551616",
            b'"\\ud800"',
            b"[" * 128 + b"]" * 128,
            b"[" * 5000,
            b'{"a": Infinity}',
            b"\xef\xbb\xbf{}",
            b" ",
            b"null",
        ]
    ),
)


@given(engine_bodies, content_types, st.booleans())
@settings(max_examples=400)
def test_decode_engine_body_never_raises_and_is_always_wire_safe(data, content_type, truncated):
    value = decode_engine_body(data, content_type, truncated)
    # What the gateway puts on the wire: strict JSON (no NaN/Infinity), valid UTF-8.
    text = json.dumps(value, allow_nan=False, ensure_ascii=False)
    text.encode("utf-8")
    if truncated or content_type is None or "json" not in content_type or not data:
        assert isinstance(value, str)
    if isinstance(value, float):
        assert math.isfinite(value)
    outcome = Outcome("w", "http://e", "http://e", status=200, body=value, body_truncated=truncated)
    json_bytes(outcome.envelope())
    assert len(outcome.excerpt()) <= EXCERPT_CAP


def _decoded_with_the_full_walk(data: bytes, content_type: str | None, truncated: bool):
    """decode_engine_body as it was: every parsed answer walked for what serde_json refuses."""
    if not truncated and content_type is not None and "json" in content_type and data:
        try:
            value = json.loads(
                data.decode("utf-8"),
                parse_int=outcome_rules._parse_int,
                parse_float=outcome_rules._parse_float,
                parse_constant=outcome_rules._parse_constant,
            )
        except (ValueError, UnicodeDecodeError, RecursionError):
            pass
        else:
            if not outcome_rules._serde_refuses(value):
                return value
    return data.decode("utf-8", errors="replace")


@given(engine_bodies, content_types, st.booleans())
@settings(max_examples=400)
@example(b"[" * 127 + b"]" * 127, "application/json", False)
@example(b"[" * 128 + b"]" * 128, "application/json", False)
@example(b'[{"a": ' * 64 + b"1" + b"}]" * 64, "application/json", False)
@example(b'{"a": [' * 60 + b'"\\udc00"' + b"]}" * 60, "application/json", False)
@example(b'{"k\\ud83d\\ude00": [{"x": "\\ud83d"}]}', "application/json", False)
def test_decoding_skips_the_walk_only_when_it_could_not_refuse(data, content_type, truncated):
    """The walk for lone surrogates and deep nesting is skipped when the text has no ``\\u``
    escape and too few brackets: the answer is the same as with the walk, every time."""
    got = decode_engine_body(data, content_type, truncated)
    want = _decoded_with_the_full_walk(data, content_type, truncated)
    assert type(got) is type(want) and json.dumps(got) == json.dumps(want)


@given(st.integers(min_value=0, max_value=64), content_types)
def test_a_truncated_body_is_the_lossy_text_of_the_bytes(extra, content_type):
    data = b'{"pad":"' + b"x" * (BODY_CAP - 8 + extra)
    data = data[:BODY_CAP]
    value = decode_engine_body(data, content_type, True)
    assert value == data.decode("utf-8", errors="replace")

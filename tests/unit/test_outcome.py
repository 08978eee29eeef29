"""Engine answers -> envelopes and fan-out entries (docs/rl-control-plane.md, "Calling one engine", "Fan-out")."""

import pytest

from smgrl.control.outcome import BODY_CAP, Outcome, decode_engine_body, fanout_body
from smgrl.core.errors import NoControlEndpoint, UpstreamTimeout, UpstreamUnreachable

J = "application/json"


@pytest.mark.parametrize(
    "data, ctype, expected",
    [
        (b'{"a":1}', J, {"a": 1}),
        (b'{"a":1}', "text/json", {"a": 1}),
        (b'{"a":1}', "application/problem+json", {"a": 1}),
        (b'{"a":1}', "application/json; charset=utf-8", {"a": 1}),
        (b'{"a":1}', "APPLICATION/JSON", '{"a":1}'),  # case-sensitive match, as SMG
        (b'{"a":1}', "text/plain", '{"a":1}'),
        (b'{"a":1}', None, '{"a":1}'),
        (b"", J, ""),
        (b"", None, ""),
        (b"null", J, None),
        (b"[1,2]", J, [1, 2]),
        (b'"s"', J, "s"),
        (b'{"a":1,"a":2}', J, {"a": 2}),  # duplicate keys keep the last value
        (b"18446744073709551615", J, 18446744073709551615),
        (b"18446744073709551616", J, 18446744073709551616.0),  # beyond u64 becomes a float
        (b"-9223372036854775809", J, -9223372036854775809.0),
        (b"1e400", J, "1e400"),  # serde refuses: raw text comes back
        (b"NaN", J, "NaN"),
        (b"{bad", J, "{bad"),
        (b"\xff\xfeok", "text/plain", "\ufffd\ufffdok"),
        (b"\xff", J, "\ufffd"),
    ],
)
def test_decode_engine_body(data, ctype, expected):
    got = decode_engine_body(data, ctype, False)
    assert got == expected and type(got) is type(expected)


def test_truncated_json_is_never_parsed():
    assert decode_engine_body(b'{"a":1}', J, True) == '{"a":1}'


def test_envelope_omits_body_truncated_unless_set():
    o = Outcome("w", "http://h:1", "http://h:1", latency_ms=3, status=200, body={"x": 1})
    assert o.envelope() == {
        "worker_id": "w",
        "url": "http://h:1",
        "status": 200,
        "latency_ms": 3,
        "body": {"x": 1},
    }
    t = Outcome("w", "u", "u", status=200, body="x" * BODY_CAP, body_truncated=True)
    assert t.envelope()["body_truncated"] is True


def _err(cls, msg="m", **ctx):
    return cls(msg, worker_id="w", url="u", **ctx)


@pytest.mark.parametrize(
    "outcome, entry, metric",
    [
        (Outcome("w", "u", "u", status=200), None, "ok"),
        (Outcome("w", "u", "u", status=204), None, "ok"),
        (
            Outcome("w", "u", "u", status=500, body="x"),
            {"worker_id": "w", "url": "u", "error": "upstream_error", "message": "HTTP 500", "status": 500},
            "upstream_error",
        ),
        (
            Outcome("w", "u", "u", status=307),
            {"worker_id": "w", "url": "u", "error": "upstream_error", "message": "HTTP 307", "status": 307},
            "upstream_error",
        ),
        (
            Outcome("w", "u", "u", error=_err(UpstreamUnreachable, "down")),
            {"worker_id": "w", "url": "u", "error": "upstream_unreachable", "message": "down"},
            "unreachable",
        ),
        (
            Outcome("w", "u", "u", error=_err(UpstreamTimeout, "slow")),
            {"worker_id": "w", "url": "u", "error": "upstream_timeout", "message": "slow"},
            "timeout",
        ),
        (
            Outcome("w", "u", None, error=_err(NoControlEndpoint, "none", connection_mode="grpc")),
            {
                "worker_id": "w",
                "url": "u",
                "error": "no_control_endpoint",
                "message": "none",
                "connection_mode": "grpc",
            },
            None,
        ),
    ],
)
def test_failed_entries_and_metric_results(outcome, entry, metric):
    assert outcome.failed_entry("grpc") == entry
    assert outcome.metric_result == metric


def test_fanout_body_sorts_and_counts():
    outs = [
        Outcome("w3", "u3", "u3", error=_err(UpstreamUnreachable, "x")),
        Outcome("w1", "u1", "u1", status=200, body={}),
        Outcome("w2", "u2", "u2", status=500, body={}),
        Outcome("g1", "g", None, error=_err(NoControlEndpoint, "n", connection_mode="grpc")),
    ]
    status, body = fanout_body(outs, {"g1": "grpc"})
    assert status == 207
    assert list(body["results"]) == ["w1", "w2"]
    assert [f["worker_id"] for f in body["failed"]] == ["g1", "w2", "w3"]
    assert body["failed"][0]["connection_mode"] == "grpc"
    assert body["total"] == 4 and body["succeeded"] == 1
    status, body = fanout_body([Outcome("a", "u", "u", status=200, body="")], {})
    assert status == 200 and body["failed"] == [] and body["succeeded"] == 1

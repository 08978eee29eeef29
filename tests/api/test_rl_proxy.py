"""The per-worker proxy `GET|POST|HEAD /v1/rl/workers/{id}/engine/{path}` (docs/rl-control-plane.md,
"Calling one engine", "Errors"; SMG 1.13.0's observed envelope, paths, query and headers)."""

from __future__ import annotations

import json

import pytest
import trio
from rl_api_helpers import (
    GENERATED_GNT_ID,
    MS,
    RawEngine,
    assert_generated_id,
    assert_json,
    assert_text,
    op_events,
    rl_cfg,
    rl_error,
    row_ids,
    sent_headers,
)

from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

OP_HEADERS = {"content-type", "content-length", "x-request-id", "x-smgrl-operation-id"}
FLUSHED = (
    "Cache flushed.\nPlease check backend logs for more details. (When there are running or "
    "waiting requests, the operation will not be performed.)\n"
)
NOT_FOUND = {"detail": "Not Found"}


def envelope(wid, url, status, body, **extra):
    return {"worker_id": wid, "url": url, "status": status, "latency_ms": MS, "body": body, **extra}


# (method, path+query after /engine/, request body, request headers) ->
# (engine method, engine path, engine query, engine body, engine headers without host)
FORWARDING = [
    pytest.param(
        "POST",
        "a%2Fb?x=1&&selector=q&y&selector=z&Selector=k",
        b"hello",
        {
            "content-type": "text/plain",
            "x-request-id": "abc",
            "traceparent": "tp",
            "tracestate": "ts",
            "authorization": "Bearer caller",
            "user-agent": "ua",
            "x-custom": "1",
            "accept": "text/html",
            "cookie": "c=1",
            "x-smg-routing-key": "k",
            "x-forwarded-for": "1.2.3.4",
            "x-correlation-id": "c",
        },
        (
            "POST",
            "/a/b",
            "x=1&y&Selector=k",
            b"hello",
            {
                "accept": "*/*",
                "content-length": "5",
                "content-type": "text/plain",
                "x-request-id": "abc",
                "traceparent": "tp",
                "tracestate": "ts",
            },
        ),
        id="headers-query-path",
    ),
    pytest.param(
        "POST",
        "flush_cache",
        None,
        {},
        ("POST", "/flush_cache", "", b"", {"accept": "*/*"}),
        id="bodyless-post",
    ),
    pytest.param(
        "POST",
        "flush_cache",
        b"",
        {"content-type": "application/json"},
        ("POST", "/flush_cache", "", b"", {"accept": "*/*", "content-type": "application/json"}),
        id="empty-body-with-type",
    ),
    pytest.param(
        "GET",
        "flush_cache",
        b"{}",
        {},
        (
            "GET",
            "/flush_cache",
            "",
            b"{}",
            {"accept": "*/*", "content-length": "2", "content-type": "application/json"},
        ),
        id="get-with-body-defaults-type",
    ),
    pytest.param(
        "HEAD",
        "flush_cache",
        None,
        {},
        ("HEAD", "/flush_cache", "", b"", {"accept": "*/*"}),
        id="head-as-head",
    ),
    pytest.param(
        "GET",
        "a%41b/x%2Fc?a+b=%7E&e=%C3%A9&selector",
        None,
        {},
        ("GET", "/aAb/x/c", "a+b=%7E&e=%C3%A9", b"", {"accept": "*/*"}),
        id="decoding-and-raw-query",
    ),
    pytest.param(
        "POST",
        "/v1/x?selector=only",
        b'{"a": 1}',
        {},
        (
            "POST",
            "/v1/x",
            "",
            b'{"a": 1}',
            {"accept": "*/*", "content-length": "8", "content-type": "application/json"},
        ),
        id="leading-slash-selector-only",
    ),
    pytest.param(
        "POST",
        "...?sel%65ctor=1&selectorx=2",
        None,
        {},
        ("POST", "/...", "sel%65ctor=1&selectorx=2", b"", {"accept": "*/*"}),
        id="dots-and-lookalikes",
    ),
]


@pytest.mark.parametrize("method,path,body,headers,expected", FORWARDING)
async def test_forwarding_is_exact(rl_config, method, path, body, headers, expected):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw)
        engine = fleet.engines[0]
        engine.clear_calls()
        r = await gw.client.request(
            method, f"/v1/rl/workers/{wid}/engine/{path}", content=body, headers=headers
        )
        assert r.status_code in (200, 404, 405), r.text
        (call,) = list(engine.calls)
        e_method, e_path, e_query, e_body, e_headers = expected
        assert (call.method, call.path, call.query, call.body) == (e_method, e_path, e_query, e_body)
        assert sent_headers(call) == e_headers


async def test_worker_api_key_is_the_bearer_and_the_callers_authorization_is_dropped(rl_config):
    async with fake_fleet("sglang", 1, api_key="engine-secret") as fleet, gateway_in_process(rl_config) as gw:
        (wid,) = await gw.register(fleet.urls, api_key="engine-secret")
        engine = fleet.engines[0]
        engine.clear_calls()
        r = await gw.client.post(
            f"/v1/rl/workers/{wid}/engine/flush_cache", headers={"authorization": "Bearer caller-token"}
        )
        assert_json(r, 200, envelope(wid, engine.url, 200, FLUSHED), OP_HEADERS)
        (call,) = list(engine.calls)
        assert sent_headers(call) == {"accept": "*/*", "authorization": "Bearer engine-secret"}
        listed = await gw.client.get("/workers")
        assert "engine-secret" not in listed.text


async def test_envelope_and_status_mirroring(rl_config):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw)
        engine = fleet.engines[0]
        url = f"/v1/rl/workers/{wid}/engine/flush_cache"
        r = await gw.client.post(url)
        assert_json(r, 200, envelope(wid, engine.url, 200, FLUSHED), OP_HEADERS)
        r = await gw.client.get(f"/v1/rl/workers/{wid}/engine/nope")
        assert_json(r, 404, envelope(wid, engine.url, 404, NOT_FOUND), OP_HEADERS)
        cases = [
            (418, "[1,2]", [1, 2]),
            (500, '{"x":1}', {"x": 1}),
            (599, "not json", "not json"),
            (200, '{"a":1,"a":2}', {"a": 2}),  # duplicate keys: the last wins
            (200, "18446744073709551616", 1.8446744073709552e19),  # beyond u64: a float
            (200, "18446744073709551615", 18446744073709551615),
            (200, "1e400", "1e400"),  # out of range: not JSON for serde, so the text
            (201, "", ""),
        ]
        for status, text, body in cases:
            engine.set_knobs(force_status=status, force_body=text)
            r = await gw.client.post(url, json={})
            assert_json(r, status, envelope(wid, engine.url, status, body), OP_HEADERS)
        # 204: the envelope is dropped, the JSON content-type stays.
        engine.set_knobs(force_status=204, force_body=None)
        r = await gw.client.post(url)
        assert r.status_code == 204 and r.content == b""
        assert r.headers["content-type"] == "application/json"
        assert set(r.headers) == OP_HEADERS


async def test_head_is_forwarded_and_answers_the_envelope_headers(rl_config):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw)
        engine = fleet.engines[0]
        engine.clear_calls()
        r = await gw.client.head(f"/v1/rl/workers/{wid}/engine/flush_cache")
        assert r.status_code == 200 and r.content == b""
        assert r.headers["content-type"] == "application/json"
        # The GET envelope's length (latency_ms has a few digits: 0 when written as "0").
        zero = json.dumps({**envelope(wid, engine.url, 200, ""), "latency_ms": 0}, separators=(",", ":"))
        assert 0 <= int(r.headers["content-length"]) - len(zero) <= 5
        assert [c.method for c in engine.calls] == ["HEAD"]


async def test_engine_redirect_is_not_followed(rl_config):
    # D4: SMG 1.13.0 follows redirects (to other hosts too); smgrl answers the 3xx itself.
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        ids = await row_ids(gw)
        rows = (await gw.client.get("/v1/rl/workers")).json()["workers"]
        first, other = fleet.engines if fleet.engines[0].url == rows[0]["url"] else fleet.engines[::-1]
        for status in (301, 302, 307, 308):
            first.set_knobs(redirect_to=other.url, redirect_status=status)
            other.clear_calls()
            r = await gw.client.post(f"/v1/rl/workers/{ids[0]}/engine/flush_cache", json={})
            assert_json(r, status, envelope(ids[0], first.url, status, ""), OP_HEADERS)
            assert list(other.calls) == []


@pytest.mark.parametrize("size,truncated", [(1_048_576, False), (1_048_577, True), (3_000_000, True)])
async def test_bodies_over_one_mib_are_truncated(rl_config, size, truncated):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw)
        fleet.engines[0].set_knobs(huge_body_bytes=size)
        r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache")
        assert r.status_code == 200
        body = json.loads(r.content)
        assert list(body) == ["worker_id", "url", "status", "latency_ms", "body"] + (
            ["body_truncated"] if truncated else []
        )
        if truncated:
            assert body["body_truncated"] is True
            full = '{"pad":"' + "x" * (size - 10) + '"}'
            assert body["body"] == full[:1_048_576]
        else:
            assert body["body"] == {"pad": "x" * (size - 10)}


def _nested(n: int) -> list:
    value: list = []
    for _ in range(n - 1):
        value = [value]
    return value


CONTENT_TYPES = [
    ("application/json", b'{"a":1}', {"a": 1}),
    ("text/json", b'{"a":1}', {"a": 1}),
    ("application/problem+json", b"[1]", [1]),
    ("application/x-json-stream", b"2", 2),
    ("application/json; charset=utf-8", b'"s"', "s"),
    ("APPLICATION/JSON", b'{"a":1}', '{"a":1}'),  # the match is case-sensitive
    ("text/plain", b'{"a":1}', '{"a":1}'),
    (None, b'{"a":1}', '{"a":1}'),
    ("application/json", b"{bad", "{bad"),
    ("application/json", b"", ""),
    ("text/plain", b"ok\xff\xfe!", "ok\ufffd\ufffd!"),  # lossy UTF-8
    ("application/json", b'"\xff"', '"\ufffd"'),
    ("application/json", b"NaN", "NaN"),
    ("application/json", b"-0", -0.0),  # serde_json parses -0 as a float
    ("application/json", b"-9223372036854775809", -9.223372036854776e18),
    ("application/json", b'"\\ud83d\\ude00"', "\U0001f600"),
    ("application/json", b'"\\ud800"', '"\\ud800"'),  # a lone surrogate is not JSON for serde
    ("application/json", b"[" * 127 + b"]" * 127, _nested(127)),
    ("application/json", b"[" * 128 + b"]" * 128, "[" * 128 + "]" * 128),  # serde's depth limit
]


async def test_engine_body_decoding_rules(rl_config):
    async with trio.open_nursery() as nursery:
        engine = await nursery.start(RawEngine().serve)
        async with gateway_in_process(rl_config, worker_urls=[engine.url]) as gw:
            (wid,) = await row_ids(gw)
            for ctype, raw, body in CONTENT_TYPES:
                engine.answer(200, raw, ctype)
                r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/x")
                assert_json(r, 200, envelope(wid, engine.url, 200, body), OP_HEADERS)
            # A body cut short is a body-read error: 502 upstream_unreachable.
            engine.answer(200, b'{"a":', "application/json", declared_length=100)
            r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/x")
            message = (
                f"upstream `{engine.url}` unreachable: reading response body: error decoding response body"
            )
            assert_json(
                r, 502, rl_error("upstream_unreachable", message, worker_id=wid, url=engine.url), OP_HEADERS
            )
            # The journal says how far the exchange got (the engine answered, then was cut off),
            # which is what engine state is decided from (smgrl/state/engines.py).
            (event,) = [
                e for e in op_events(gw, r.headers["x-smgrl-operation-id"]) if e.TYPE == "control.outcome"
            ]
            assert (event.error, event.stage) == ("upstream_unreachable", "body")
        nursery.cancel_scope.cancel()


PATH_ERRORS = [
    ("a/b/c/d/e", "path has more than 4 segments"),
    ("a//b", "path has an empty segment"),
    ("pause/", "path has an empty segment"),
    ("%2F%2Fpause", "path has an empty segment"),
    ("%2e%2e", "path must not contain `.` or `..` segments"),
    ("a/%2e/b", "path must not contain `.` or `..` segments"),
    ("a/%2E%2E/b", "path must not contain `.` or `..` segments"),
    ("pause%3Fmode=keep", "path must not contain `?` or `#`"),
    ("pause%23frag", "path must not contain `?` or `#`"),
    ("pause%20generation", "segment `pause generation` contains characters outside [A-Za-z0-9._-]"),
    ("a:b", "segment `a:b` contains characters outside [A-Za-z0-9._-]"),
    ("caf%C3%A9", "segment `café` contains characters outside [A-Za-z0-9._-]"),
    ("~x", "segment `~x` contains characters outside [A-Za-z0-9._-]"),
    ("%2F", "path is empty"),
]


@pytest.mark.parametrize("path,reason", PATH_ERRORS)
async def test_invalid_engine_paths_are_checked_before_the_worker(rl_config, path, reason):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw)
        fleet.clear_calls()
        for worker in (wid, "nope"):
            r = await gw.client.post(f"/v1/rl/workers/{worker}/engine/{path}")
            assert_json(
                r,
                400,
                rl_error("invalid_engine_path", f"invalid engine path: {reason}"),
                {"content-type", "content-length", "x-request-id"},
            )
        assert list(fleet.engines[0].calls) == []


async def test_invalid_utf8_in_a_path_parameter_is_a_plain_400(rl_config):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw)
        cases = [
            (f"/v1/rl/workers/{wid}/engine/%FF", "path"),
            ("/v1/rl/workers/nope/engine/a%FFb", "path"),
            ("/v1/rl/workers/%FF/engine/x", "id"),
            ("/v1/rl/workers/%FF/engine/a/b/c/d/e", "id"),  # the id is decoded first
            ("/v1/rl/workers/%FF", "id"),
            ("/v1/rl/engine/%FF?selector=a&selector=b", "path"),  # before the query
            ("/v1/rl/engine/%FF", "path"),
        ]
        for path, param in cases:
            r = await gw.client.post(path) if "/engine/" in path else await gw.client.get(path)
            assert_text(
                r,
                400,
                f"Invalid URL: Invalid UTF-8 in `{param}`",
                {"content-type", "content-length", "x-request-id"},
            )


async def test_unreachable_and_timeout():
    async with (
        fake_fleet("sglang", 1) as fleet,
        gateway_in_process(rl_cfg(timeout=1), worker_urls=fleet.urls) as gw,
    ):
        (wid,) = await row_ids(gw)
        engine = fleet.engines[0]
        engine.set_knobs(hang=True)
        r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache")
        assert_json(
            r,
            504,
            rl_error(
                "upstream_timeout",
                f"upstream `{engine.url}` timed out after 1s",
                worker_id=wid,
                url=engine.url,
            ),
            OP_HEADERS,
        )
        engine.set_knobs(hang=False)
        engine.go_down(30)
        r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache?a=b")
        message = (
            f"upstream `{engine.url}` unreachable: error sending request for url "
            f"({engine.url}/flush_cache?a=b)"
        )
        assert_json(
            r, 502, rl_error("upstream_unreachable", message, worker_id=wid, url=engine.url), OP_HEADERS
        )
        # Control-call failures never change health.
        assert gw.gateway.fleet.registry.get(wid).status == "ready"


async def test_request_ids(rl_config):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw)
        engine = fleet.engines[0]
        base = f"/v1/rl/workers/{wid}/engine"

        async def sent(path, headers):
            engine.clear_calls()
            r = await gw.client.post(f"{base}/{path}", headers=headers, json={})
            (call,) = list(engine.calls)
            return r, call.headers.get("x-request-id")

        r, fwd = await sent("flush_cache", {})
        assert_generated_id(r)
        assert fwd is None  # a generated id is not forwarded
        r, fwd = await sent("generate", {})
        assert_generated_id(r, GENERATED_GNT_ID)
        assert fwd is None
        r, fwd = await sent("flush_cache", {"x-request-id": "caller-1"})
        assert r.headers["x-request-id"] == fwd == "caller-1"
        r, fwd = await sent("flush_cache", {"x-request-id": "a" * 128})
        assert r.headers["x-request-id"] == fwd == "a" * 128
        r, fwd = await sent("flush_cache", {"x-request-id": "a" * 129})
        assert_generated_id(r)
        assert fwd == r.headers["x-request-id"]  # the replacement IS forwarded
        r, fwd = await sent("flush_cache", {"x-request-id": ""})
        assert_generated_id(r)
        assert fwd == r.headers["x-request-id"]


async def test_operation_id_names_the_journal_record(rl_config):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        (wid,) = await row_ids(gw)
        r = await gw.client.post(
            f"/v1/rl/workers/{wid}/engine/pause_generation?mode=x",
            json={"mode": "abort"},
            headers={"x-request-id": "rid-1"},
        )
        assert r.status_code == 200
        op_id = r.headers["x-smgrl-operation-id"]
        started, outcome, finished = op_events(gw, op_id)
        assert started.kind == "call" and started.method == "POST" and started.path == "pause_generation"
        assert started.query == "mode=x" and started.request_id == "rid-1"
        assert started.body == '{"mode":"abort"}' and started.body_size == 16
        assert [t["worker_id"] for t in started.targets] == [wid]
        assert (outcome.worker_id, outcome.status, outcome.error) == (wid, 200, None)
        assert (finished.result, finished.http_status, finished.total, finished.succeeded) == (
            "ok",
            200,
            1,
            1,
        )


async def test_control_characters_in_the_engine_path_are_invalid_not_unknown():
    from smgrl.core.config import Config, RlConfig
    from smgrl.fake import fake_fleet
    from smgrl.testing import gateway_in_process

    cfg = Config(rl=RlConfig(enabled=True))
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(cfg, worker_urls=fleet.urls) as gw:
        wid = next(iter(gw.gateway.fleet.registry)).id
        for path in (f"/v1/rl/workers/{wid}/engine/a%0Ab", "/v1/rl/engine/a%0Ab?selector=engine%3Dsglang"):
            r = await gw.client.post(path)
            assert r.status_code == 400, path
            assert r.json() == {
                "error": "invalid_engine_path",
                "message": "invalid engine path: segment `a\nb` contains characters outside [A-Za-z0-9._-]",
            }
        assert fleet.engines[0].calls_to("/a\nb") == []

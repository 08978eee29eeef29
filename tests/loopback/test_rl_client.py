"""The stdlib client `smgrl.rl` against an in-process gateway that answers SMG-shaped JSON.

The fake gateway is a `ThreadingHTTPServer` on 127.0.0.1 (port 0) in a thread; each test
installs canned answers per (method, path) and then inspects the requests it received.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import os
import sys
import threading
import urllib.error
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from smgrl import rl as smgrl_rl
from smgrl.rl import (
    RL,
    CallResult,
    FanoutError,
    FanoutFailure,
    FanoutResult,
    RlError,
    Worker,
    paused,
)

WID = "01a226af-50c7-7426-b236-6199cdedea6c"

ROW = {
    "id": WID,
    "url": "http://127.0.0.1:19104",
    "base_url": "http://127.0.0.1:19104",
    "engine": "sglang",
    "engine_version": "0.5.15.post1",
    "model_id": "Qwen/Qwen3-8B",
    "worker_type": "regular",
    "connection_mode": "http",
    "control_url": "http://127.0.0.1:19104",
    "tp_size": 1,
    "dp_size": 1,
    "pp_size": None,
    "dp_ranks": 1,
    "role": None,
    "health": "ready",
    "weight_version": "default",
    "labels": {"tp_size": "1", "version": "0.5.15.post1"},
    "capabilities": {"source": "static", "pause_modes": ["abort", "retract", "in_place"]},
    # Fields smgrl adds (M2): the client must tolerate them.
    "version_source": "registration",
    "control": "active",
}


def outcome(worker_id: str, status: int = 200, body: Any = None, **extra: Any) -> dict[str, Any]:
    return {
        "worker_id": worker_id,
        "url": f"http://{worker_id}:1",
        "status": status,
        "latency_ms": 3,
        "body": {} if body is None else body,
        **extra,
    }


def fanout_body(results: dict[str, Any], failed: list[dict[str, Any]], total: int) -> dict[str, Any]:
    succeeded = sum(1 for r in results.values() if 200 <= r["status"] < 300)
    return {"results": results, "failed": failed, "total": total, "succeeded": succeeded}


@dataclasses.dataclass
class Seen:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


Answer = tuple[int, Any, str]  # status, body (JSON-able, str or bytes), content-type


class FakeGateway:
    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Answer | Callable[[Seen], Answer]] = {}
        self.seen: list[Seen] = []
        self.url = ""

    def on(self, method: str, path: str, status: int, body: Any, ctype: str = "application/json") -> None:
        self.routes[(method, path)] = (status, body, ctype)

    def answer(self, request: Seen) -> Answer:
        self.seen.append(request)
        answer = self.routes.get((request.method, request.path))
        if answer is None:
            return 404, {"error": {"code": "unknown_url"}}, "application/json"
        return answer(request) if callable(answer) else answer


def _handler(gateway: FakeGateway) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            split = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("content-length") or 0)
            request = Seen(
                method=self.command,
                path=split.path,
                query=urllib.parse.parse_qs(split.query, keep_blank_values=True),
                headers={k.lower(): v for k, v in self.headers.items()},
                body=self.rfile.read(length) if length else b"",
            )
            status, body, ctype = gateway.answer(request)
            if isinstance(body, bytes):
                raw = body
            elif isinstance(body, str):
                raw = body.encode()
            else:
                raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(raw)

        do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = _serve

        def log_message(self, *args: Any) -> None:  # keep pytest output clean
            pass

    return Handler


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGateway]:
    # urllib honours proxy variables; the fake gateway is local.
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")
    fake = FakeGateway()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    fake.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def rl(gateway: FakeGateway) -> RL:
    return RL(gateway.url + "/", timeout=5)


# -- construction ---------------------------------------------------------------------------------


def test_base_url_is_right_stripped_and_timeout_checked():
    assert RL("http://smg:30000///").base_url == "http://smg:30000"
    assert RL("http://smg:30000").timeout == 600.0
    with pytest.raises(ValueError, match="timeout must be > 0 seconds, got 0"):
        RL("http://smg:30000", timeout=0)
    with pytest.raises(ValueError):
        RL("http://smg:30000", timeout=-1.5)


def test_a_non_positive_per_call_timeout_is_refused_before_sending(rl, gateway):
    with pytest.raises(ValueError):
        rl.call(WID, "flush_cache", timeout=0)
    assert gateway.seen == []


# -- discovery ------------------------------------------------------------------------------------


def test_workers_parses_rows_and_keeps_unknown_fields(rl, gateway):
    gateway.on("GET", "/v1/rl/workers", 200, {"protocol_version": 1, "workers": [ROW], "total": 1})
    [worker] = rl.workers()
    assert worker.id == WID
    assert worker.engine == "sglang"
    assert worker.tp_size == 1 and worker.pp_size is None
    assert worker.control_url == "http://127.0.0.1:19104"
    assert worker.labels["version"] == "0.5.15.post1"
    assert worker.capabilities["pause_modes"][0] == "abort"
    assert worker.extra == {"version_source": "registration", "control": "active"}
    seen = gateway.seen[0]
    assert seen.headers["accept"] == "application/json"
    assert "authorization" not in seen.headers
    assert "content-type" not in seen.headers
    assert seen.body == b""


def test_workers_with_none_registered(rl, gateway):
    gateway.on("GET", "/v1/rl/workers", 200, {"protocol_version": 1, "workers": [], "total": 0})
    assert rl.workers() == []


def test_api_key_is_sent_as_bearer(gateway):
    gateway.on("GET", "/v1/rl/workers", 200, {"protocol_version": 1, "workers": [], "total": 0})
    RL(gateway.url, api_key="admin-key", timeout=5).workers()
    assert gateway.seen[0].headers["authorization"] == "Bearer admin-key"


def test_worker_by_id(rl, gateway):
    gateway.on("GET", f"/v1/rl/workers/{WID}", 200, ROW)
    worker = rl.worker(WID)
    assert worker.id == WID and worker.health == "ready"


def test_worker_with_missing_and_null_maps(rl, gateway):
    row = {k: v for k, v in ROW.items() if k not in ("labels", "control_url", "version_source", "control")}
    gateway.on("GET", f"/v1/rl/workers/{WID}", 200, {**row, "capabilities": None})
    worker = rl.worker(WID)
    assert worker.labels == {} and worker.capabilities == {}
    assert worker.control_url is None and worker.extra == {}


def test_unknown_worker_raises_rl_error_with_its_code(rl, gateway):
    payload = {"error": "worker_not_found", "message": "worker `nope` not found", "id": "nope"}
    gateway.on("GET", "/v1/rl/workers/nope", 404, payload)
    with pytest.raises(RlError) as info:
        rl.worker("nope")
    err = info.value
    assert (err.status, err.code, err.payload) == (404, "worker_not_found", payload)
    assert str(err) == "worker_not_found (HTTP 404): worker `nope` not found"


def test_auth_failure_with_a_text_body_is_an_http_error(gateway):
    gateway.on("GET", "/v1/rl/workers", 401, "Missing or invalid Authorization header", "text/plain")
    with pytest.raises(RlError) as info:
        RL(gateway.url, timeout=5).workers()
    assert info.value.code == "http_error"
    assert info.value.payload == {"error": "http_error", "message": "Missing or invalid Authorization header"}


def test_empty_404_body_is_an_http_error(rl, gateway):
    gateway.on("GET", "/v1/rl/workers", 404, b"")  # smgrl with RL disabled (D1)
    with pytest.raises(RlError) as info:
        rl.workers()
    assert (info.value.status, info.value.code) == (404, "http_error")


# -- per-worker calls -----------------------------------------------------------------------------


def test_call_returns_the_envelope_and_sends_json(rl, gateway):
    route = f"/v1/rl/workers/{WID}/engine/update_weights_from_disk"
    gateway.on("POST", route, 200, outcome(WID, body={"success": True}))
    body = {"model_path": "/ckpt/7", "weight_version": "7", "flush_cache": True}
    result = rl.call(WID, "/update_weights_from_disk", body, params={"mode": "keep"})
    assert result == CallResult(WID, f"http://{WID}:1", 200, 3, {"success": True})
    assert result.body_truncated is False
    seen = gateway.seen[0]
    assert seen.json() == body
    assert seen.headers["content-type"] == "application/json"
    assert seen.query == {"mode": ["keep"]}


@pytest.mark.parametrize("status", [400, 404, 500, 501, 503])
def test_engine_errors_come_back_as_results_not_exceptions(rl, gateway, status):
    route = f"/v1/rl/workers/{WID}/engine/update_weights_from_disk"
    engine_body = {"success": False, "message": "not implemented; supported sources: distributed"}
    gateway.on("POST", route, status, outcome(WID, status=status, body=engine_body))
    result = rl.call(WID, "update_weights_from_disk", {})
    assert result.status == status and result.body == engine_body


def test_get_call_sends_no_body(rl, gateway):
    gateway.on("GET", f"/v1/rl/workers/{WID}/engine/server_info", 200, outcome(WID, body={"tp_size": 1}))
    result = rl.call(WID, "server_info", method="GET")
    assert result.body == {"tp_size": 1}
    assert gateway.seen[0].body == b"" and "content-type" not in gateway.seen[0].headers


def test_truncated_bodies_are_flagged(rl, gateway):
    envelope = outcome(WID, body="x" * 10, body_truncated=True)
    gateway.on("GET", f"/v1/rl/workers/{WID}/engine/metrics", 200, envelope)
    result = rl.call(WID, "metrics", method="GET")
    assert result.body_truncated is True and result.body == "x" * 10


@pytest.mark.parametrize(
    ("status", "payload"),
    [
        (400, {"error": "invalid_engine_path", "message": "invalid engine path: path has an empty segment"}),
        (422, {"error": "no_control_endpoint", "message": "…", "worker_id": WID, "connection_mode": "grpc"}),
        (502, {"error": "upstream_unreachable", "message": "upstream `u` unreachable: x", "latency_ms": 1}),
        (504, {"error": "upstream_timeout", "message": "upstream `u` timed out after 1s"}),
    ],
)
def test_gateway_errors_raise_rl_error(rl, gateway, status, payload):
    gateway.on("POST", f"/v1/rl/workers/{WID}/engine/flush_cache", status, payload)
    with pytest.raises(RlError) as info:
        rl.call(WID, "flush_cache")
    assert (info.value.status, info.value.code) == (status, payload["error"])


def test_a_2xx_answer_that_is_not_an_envelope_is_unexpected(rl, gateway):
    gateway.on("POST", f"/v1/rl/workers/{WID}/engine/flush_cache", 200, {"ok": True})
    with pytest.raises(RlError) as info:
        rl.call(WID, "flush_cache")
    assert (info.value.status, info.value.code) == (200, "unexpected_response")


def test_head_call_has_no_envelope(rl, gateway):
    gateway.on("HEAD", f"/v1/rl/workers/{WID}/engine/server_info", 200, outcome(WID))
    with pytest.raises(RlError) as info:
        rl.call(WID, "server_info", method="HEAD")
    assert info.value.code == "unexpected_response"


def test_an_unreachable_gateway_is_one_clear_urlerror():
    """Connection refused: one exception that names the URL and what to check, a subclass of
    URLError (code written for smg.rl catches it), raised without urllib's chain."""
    import socket

    from smgrl.rl import GatewayUnreachable

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(urllib.error.URLError) as info:
        RL(url, timeout=2).workers()
    assert isinstance(info.value, GatewayUnreachable)
    assert info.value.url == url and info.value.__cause__ is None and info.value.__suppress_context__
    assert str(info.value).startswith(f"cannot reach the gateway at {url} (")
    assert "smgrl launch" in str(info.value)


@pytest.mark.parametrize("url", ["127.0.0.1:30000", "localhost", "ftp://127.0.0.1:30000"])
def test_a_gateway_url_without_an_http_scheme_is_refused_when_the_client_is_made(url):
    with pytest.raises(ValueError, match="needs http:// or https://"):
        RL(url)


# -- fan-out --------------------------------------------------------------------------------------


def test_fanout_200(rl, gateway):
    results = {"a": outcome("a"), "b": outcome("b")}
    gateway.on("POST", "/v1/rl/engine/flush_cache", 200, fanout_body(results, [], 2))
    result = rl.fanout("/flush_cache", {}, selector="engine=sglang", params={"level": 2})
    assert result.total == 2 and result.succeeded == 2 and result.failed == []
    assert result.results["a"] == CallResult("a", "http://a:1", 200, 3, {})
    seen = gateway.seen[0]
    assert seen.query == {"level": ["2"], "selector": ["engine=sglang"]}
    assert seen.json() == {}


def test_fanout_selector_param_wins_over_params(rl, gateway):
    gateway.on("POST", "/v1/rl/engine/flush_cache", 200, fanout_body({"a": outcome("a")}, [], 1))
    rl.fanout("flush_cache", selector="id in (a,b)", params={"selector": "ignored"})
    assert gateway.seen[0].query == {"selector": ["id in (a,b)"]}
    assert gateway.seen[0].body == b""


def test_results_are_keyed_by_worker_id_even_without_one_in_the_outcome(rl, gateway):
    bare = {k: v for k, v in outcome("a").items() if k != "worker_id"}
    gateway.on("POST", "/v1/rl/engine/flush_cache", 200, fanout_body({"a": bare}, [], 1))
    assert rl.fanout("flush_cache", selector="x=y").results["a"].worker_id == "a"


PARTIAL = fanout_body(
    {"w1": outcome("w1"), "w2": outcome("w2", status=500, body="boom")},
    [
        {
            "worker_id": "g1",
            "url": "grpc://g:1",
            "error": "no_control_endpoint",
            "message": "worker `g1` has no control endpoint (grpc)",
            "connection_mode": "grpc",
        },
        {
            "worker_id": "w2",
            "url": "http://w2:1",
            "error": "upstream_error",
            "message": "HTTP 500",
            "status": 500,
        },
        {"worker_id": "w3", "url": "http://w3:1", "error": "upstream_unreachable", "message": "unreachable"},
    ],
    4,
)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        # SGLang / TokenSpeed: {"success": false, "message": ...}
        (
            {"success": False, "message": "Failed: No such file or directory: '/x'."},
            "Failed: No such file or directory: '/x'.",
        ),
        ({"detail": "Not Found"}, "Not Found"),  # FastAPI / vLLM
        ({"error": {"message": "bad mode", "type": "BadRequestError"}}, "bad mode"),  # OpenAI-style
        ({"object": "error", "message": "validation"}, "validation"),
        ({"success": False}, '{"success":false}'),  # no message: the answer itself
        ("plain text\n", "plain text"),
        ("line1\nline2\x1b[31m", "line1\\nline2\\x1b[31m"),  # an engine's control characters are escaped
        ("x" * 600, "x" * 500 + "..."),  # bounded
        (None, "HTTP 400"),  # no body: nothing better than the status
    ],
)
def test_fanout_error_names_each_engine_s_own_reason(rl, gateway, body, reason):
    failed = [
        {
            "worker_id": "w1",
            "url": "http://w1:1",
            "error": "upstream_error",
            "message": "HTTP 400",
            "status": 400,
        }
    ]
    gateway.on("POST", "/v1/rl/engine/update_weights_from_disk", 207,
               fanout_body({"w1": outcome("w1", status=400, body=body)}, failed, 1))  # fmt: skip
    with pytest.raises(FanoutError) as info:
        rl.fanout("update_weights_from_disk", {"model_path": "/x"}, selector="engine=sglang")
    line = str(info.value).splitlines()[1]
    expected = "  w1 http://w1:1: upstream_error HTTP 400" + ("" if reason == "HTTP 400" else f": {reason}")
    assert line == expected
    assert info.value.payload == {"error": "fanout_partial", "message": "failed workers: w1"}


def test_fanout_207_raises_fanout_error_with_the_result(rl, gateway):
    gateway.on("POST", "/v1/rl/engine/pause_generation", 207, PARTIAL)
    with pytest.raises(FanoutError) as info:
        rl.fanout("pause_generation", {}, selector="worker_type=regular")
    err = info.value
    assert isinstance(err, RlError)
    assert (err.status, err.code) == (207, "fanout_partial")
    assert err.payload == {"error": "fanout_partial", "message": "failed workers: g1, w2, w3"}
    # str() adds each engine's reason (smgrl.rl only; the payload stays SMG's).
    assert str(err) == (
        "fanout_partial (HTTP 207): failed workers: g1, w2, w3\n"
        "  g1 grpc://g:1: no_control_endpoint: worker `g1` has no control endpoint (grpc)\n"
        "  w2 http://w2:1: upstream_error HTTP 500: boom\n"
        "  w3 http://w3:1: upstream_unreachable: unreachable"
    )
    result = err.result
    assert (result.total, result.succeeded) == (4, 1)
    assert [f.worker_id for f in result.failed] == ["g1", "w2", "w3"]
    assert result.failed[1] == FanoutFailure("w2", "http://w2:1", 500, "upstream_error", "HTTP 500")
    assert result.failed[0].status is None and result.failed[0].connection_mode == "grpc"
    assert result.results["w2"].status == 500


def test_fanout_allow_partial_returns_the_result(rl, gateway):
    gateway.on("POST", "/v1/rl/engine/pause_generation", 207, PARTIAL)
    result = rl.fanout("pause_generation", {}, selector="worker_type=regular", allow_partial=True)
    assert isinstance(result, FanoutResult) and len(result.failed) == 3


@pytest.mark.parametrize(
    ("status", "payload", "code"),
    [
        (
            400,
            {"error": "selector_required", "message": "a non-empty `selector` query parameter is required"},
            "selector_required",
        ),
        (
            400,
            {
                "error": "invalid_selector",
                "message": "invalid selector at byte 7: expected value",
                "offset": 7,
            },
            "invalid_selector",
        ),
        (
            400,
            {"error": "no_workers_match", "message": "no workers match selector `x=y`", "selector": "x=y"},
            "no_workers_match",
        ),
        (400, "Failed to deserialize query string: duplicate field `selector`", "http_error"),
        (403, "Admin role required for this control plane operation", "http_error"),
    ],
)
def test_fanout_errors_raise_rl_error(rl, gateway, status, payload, code):
    ctype = "application/json" if isinstance(payload, dict) else "text/plain; charset=utf-8"
    gateway.on("POST", "/v1/rl/engine/flush_cache", status, payload, ctype)
    with pytest.raises(RlError) as info:
        rl.fanout("flush_cache", selector="x=y")
    assert not isinstance(info.value, FanoutError)
    assert (info.value.status, info.value.code) == (status, code)


def test_fanout_2xx_without_results_is_unexpected(rl, gateway):
    gateway.on("POST", "/v1/rl/engine/flush_cache", 200, {"workers": []})
    with pytest.raises(RlError) as info:
        rl.fanout("flush_cache", selector="x=y")
    assert info.value.code == "unexpected_response"


# -- paused() -------------------------------------------------------------------------------------


def _pause_routes(gateway: FakeGateway, *, pause: Answer, resume: Answer) -> None:
    gateway.routes[("POST", "/v1/rl/engine/pause_generation")] = pause
    gateway.routes[("POST", "/v1/rl/engine/continue_generation")] = resume


OK = (200, fanout_body({"a": outcome("a")}, [], 1), "application/json")
UNREACHABLE = (
    207,
    fanout_body({}, [{"worker_id": "a", "url": "u", "error": "upstream_unreachable", "message": "x"}], 1),
    "application/json",
)


def _calls(gateway: FakeGateway) -> list[tuple[str, Any]]:
    return [(s.path.rsplit("/", 1)[1], s.json()) for s in gateway.seen]


def test_paused_pauses_runs_the_body_and_resumes(rl, gateway):
    _pause_routes(gateway, pause=OK, resume=OK)
    with paused(rl, "engine=sglang") as result:
        assert isinstance(result, FanoutResult) and result.succeeded == 1
        assert _calls(gateway) == [("pause_generation", {})]
    assert _calls(gateway) == [("pause_generation", {}), ("continue_generation", {})]
    assert all(s.query == {"selector": ["engine=sglang"]} for s in gateway.seen)


def test_paused_sends_the_mode(rl, gateway):
    _pause_routes(gateway, pause=OK, resume=OK)
    with paused(rl, "engine=sglang", mode="retract"):
        pass
    assert _calls(gateway) == [("pause_generation", {"mode": "retract"}), ("continue_generation", {})]


def test_paused_resumes_when_the_body_raises(rl, gateway):
    _pause_routes(gateway, pause=OK, resume=OK)
    with pytest.raises(KeyError), paused(rl, "engine=sglang"):
        raise KeyError("refit failed")
    assert [c[0] for c in _calls(gateway)] == ["pause_generation", "continue_generation"]


def test_paused_resumes_on_base_exceptions_too(rl, gateway):
    _pause_routes(gateway, pause=OK, resume=OK)
    with pytest.raises(KeyboardInterrupt), paused(rl, "engine=sglang"):
        raise KeyboardInterrupt
    assert [c[0] for c in _calls(gateway)] == ["pause_generation", "continue_generation"]


def test_a_partial_pause_is_raised_without_running_the_body_and_still_resumed(rl, gateway):
    _pause_routes(gateway, pause=UNREACHABLE, resume=OK)
    ran = False
    with pytest.raises(FanoutError) as info, paused(rl, "engine=sglang"):
        ran = True
    assert not ran
    assert info.value.result.failed[0].worker_id == "a"
    assert [c[0] for c in _calls(gateway)] == ["pause_generation", "continue_generation"]


def test_the_body_error_wins_over_a_resume_error(rl, gateway):
    _pause_routes(gateway, pause=OK, resume=UNREACHABLE)
    with pytest.raises(ZeroDivisionError) as info, paused(rl, "engine=sglang"):
        1 / 0  # noqa: B018
    assert isinstance(info.value.__context__, FanoutError)


def test_a_lone_resume_error_is_raised(rl, gateway):
    _pause_routes(gateway, pause=OK, resume=UNREACHABLE)
    with pytest.raises(FanoutError) as info, paused(rl, "engine=sglang"):
        pass
    assert info.value.payload["message"] == "failed workers: a"


def test_a_failed_pause_and_a_failed_resume_raise_the_pause_error(rl, gateway):
    _pause_routes(
        gateway,
        pause=(400, {"error": "no_workers_match", "message": "m"}, "application/json"),
        resume=UNREACHABLE,
    )
    with pytest.raises(RlError) as info, paused(rl, "x=y"):
        pass
    assert info.value.code == "no_workers_match"
    assert isinstance(info.value.__context__, FanoutError)


# -- dataclass compatibility ----------------------------------------------------------------------


def test_worker_positional_construction_and_equality_ignore_extra():
    args = [WID, "u", "b", "sglang", None, "m", "regular", "http", 1, 1, None, 1, None, "ready", None]
    w = Worker(*args)
    assert w.control_url is None and w.labels == {} and w.extra == {}
    assert Worker(*args, extra={"control": "paused"}) == w
    assert Worker.from_json(ROW) == Worker.from_json({k: v for k, v in ROW.items() if k != "control"})


PUBLIC = ["RL", "Worker", "CallResult", "FanoutResult", "FanoutFailure", "FanoutError", "RlError", "paused"]


def test_public_names():
    assert sorted(smgrl_rl.__all__) == sorted(PUBLIC)


def _load_smg_rl():
    """`smg.rl` when importable; else the file named by SMG_RL_FILE (it is stdlib-only)."""
    try:
        import smg.rl  # type: ignore[import-not-found]

        return smg.rl
    except ImportError:
        path = os.environ.get("SMG_RL_FILE")
        if not path or not os.path.exists(path):
            return None
        spec = importlib.util.spec_from_file_location("_smg_rl_reference", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up while building
        spec.loader.exec_module(module)
        return module


def _params(obj: Any) -> list[tuple[str, Any, Any]]:
    sig = inspect.signature(obj)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


def test_signatures_match_smg_rl():
    smg_rl = _load_smg_rl()
    if smg_rl is None:
        pytest.skip("smg.rl is not importable (set SMG_RL_FILE=<path to smg/rl.py> to run this)")
    for name in PUBLIC:
        ours, theirs = getattr(smgrl_rl, name), getattr(smg_rl, name)
        mine, ref = _params(ours), _params(theirs)
        # smgrl may add keyword-only parameters with defaults (e.g. Worker.extra) and nothing else.
        assert mine[: len(ref)] == ref, name
        for _, kind, default in mine[len(ref) :]:
            assert kind is inspect.Parameter.KEYWORD_ONLY and default is not inspect.Parameter.empty, name
    for method in ["workers", "worker", "call", "fanout"]:
        assert _params(getattr(smgrl_rl.RL, method)) == _params(getattr(smg_rl.RL, method)), method
    for name in ["Worker", "CallResult", "FanoutResult", "FanoutFailure"]:
        ref_fields = [f.name for f in dataclasses.fields(getattr(smg_rl, name))]
        our_fields = [f.name for f in dataclasses.fields(getattr(smgrl_rl, name))]
        assert our_fields[: len(ref_fields)] == ref_fields, name
    assert issubclass(smgrl_rl.FanoutError, smgrl_rl.RlError)


def test_behaviour_matches_smg_rl_on_the_same_answers(gateway):
    """Drive smg.rl and smgrl.rl through the same canned answers and compare what they return."""
    smg_rl = _load_smg_rl()
    if smg_rl is None:
        pytest.skip("smg.rl is not importable (set SMG_RL_FILE=<path to smg/rl.py> to run this)")
    gateway.on("GET", "/v1/rl/workers", 200, {"protocol_version": 1, "workers": [ROW], "total": 1})
    gateway.on("POST", "/v1/rl/engine/pause_generation", 207, PARTIAL)
    gateway.on("GET", "/v1/rl/workers/nope", 401, "Missing or invalid Authorization header", "text/plain")

    def run(module):
        client = module.RL(gateway.url, timeout=5)
        out = [dataclasses.asdict(client.workers()[0])]
        out[0].pop("extra", None)
        try:
            client.fanout("pause_generation", {}, selector="x=y")
        except module.FanoutError as e:
            # smgrl.rl's text adds a line per failed engine (deviations.md); the first is SMG's.
            out.append((e.status, e.code, e.payload, str(e).splitlines()[0]))
            r = dataclasses.asdict(e.result)
            for f in r["failed"]:
                f.pop("connection_mode", None)
            for c in r["results"].values():
                c.pop("body_truncated", None)
            out.append(r)
        try:
            client.worker("nope")
        except module.RlError as e:
            out.append((e.status, e.code, e.payload, str(e)))
        return out

    assert run(smgrl_rl) == run(smg_rl)


# -- explicit writes (SMG M2: set_version / set_state) ----------------------------------------------


def test_set_version_per_worker_returns_the_row(rl, gateway):
    gateway.on("POST", f"/v1/rl/workers/{WID}/version", 200, {**ROW, "weight_version": "42"})
    worker = rl.set_version("42", worker_id=WID)
    assert isinstance(worker, Worker) and worker.weight_version == "42"
    (seen,) = gateway.seen
    assert seen.json() == {"weight_version": "42"} and seen.query == {}
    assert seen.headers["content-type"] == "application/json"


def test_set_state_per_worker_returns_the_row(rl, gateway):
    gateway.on("POST", f"/v1/rl/workers/{WID}/state", 200, {**ROW, "control": "paused"})
    worker = rl.set_state("paused", worker_id=WID)
    assert worker.id == WID and worker.extra["control"] == "paused"
    assert gateway.seen[0].json() == {"control": "paused"}


@pytest.mark.parametrize(
    ("method", "value", "kind", "field"),
    [
        ("set_version", "7", "version", "weight_version"),
        ("set_state", "asleep", "state", "control"),
    ],
)
def test_fleet_writes_send_the_selector_and_return_the_rows(rl, gateway, method, value, kind, field):
    other = {**ROW, "id": "w2"}
    gateway.on("POST", f"/v1/rl/{kind}", 200, {"protocol_version": 1, "workers": [ROW, other], "total": 2})
    workers = getattr(rl, method)(value, selector="engine=sglang", timeout=3)
    assert [w.id for w in workers] == [WID, "w2"]
    (seen,) = gateway.seen
    assert seen.query == {"selector": ["engine=sglang"]} and seen.json() == {field: value}


@pytest.mark.parametrize("method", ["set_version", "set_state"])
@pytest.mark.parametrize("target", [{}, {"worker_id": WID, "selector": "a=b"}])
def test_writes_need_exactly_one_target(rl, gateway, method, target):
    with pytest.raises(ValueError, match="exactly one of worker_id and selector"):
        getattr(rl, method)("1", **target)
    assert gateway.seen == []


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "payload"),
    [
        (
            f"/v1/rl/workers/{WID}/version",
            {"worker_id": WID},
            400,
            {"error": "invalid_version", "message": "weight_version is empty"},
        ),
        (
            f"/v1/rl/workers/{WID}/version",
            {"worker_id": WID},
            404,
            {"error": "worker_not_found", "message": "no worker", "id": WID},
        ),
        (
            "/v1/rl/version",
            {"selector": "x=y"},
            400,
            {"error": "no_workers_match", "message": "no workers match selector `x=y`", "selector": "x=y"},
        ),
        ("/v1/rl/version", {"selector": "x=y"}, 503, {"error": "journal_unavailable", "message": "down"}),
    ],
)
def test_write_errors_raise_rl_error(rl, gateway, path, kwargs, status, payload):
    gateway.on("POST", path, status, payload)
    with pytest.raises(RlError) as info:
        rl.set_version("1", **kwargs)
    assert info.value.status == status and info.value.code == payload["error"]
    assert info.value.payload == payload


def test_write_text_errors_and_unexpected_answers(rl, gateway):
    gateway.on("POST", "/v1/rl/state", 403, "Admin role required", "text/plain")
    with pytest.raises(RlError) as info:
        rl.set_state("paused", selector="a=b")
    assert info.value.code == "http_error" and info.value.status == 403
    gateway.on("POST", "/v1/rl/state", 200, {"nope": 1})
    with pytest.raises(RlError, match="unexpected_response"):
        rl.set_state("paused", selector="a=b")
    gateway.on("POST", f"/v1/rl/workers/{WID}/state", 200, [1])
    with pytest.raises(RlError, match="unexpected_response"):
        rl.set_state("paused", worker_id=WID)


async def test_writes_against_the_real_gateway(monkeypatch):
    """set_version / set_state through a real gateway on loopback and fake engines."""
    import trio

    from journal import MemoryStore
    from smgrl.core.config import Config, HealthConfig, RlConfig
    from smgrl.fake import fake_fleet
    from smgrl.registry.service import Registration
    from smgrl.runtime.server import serve

    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")
    cfg = Config(
        rl=RlConfig(enabled=True),
        port=0,
        prometheus_port=0,
        health=HealthConfig(enabled=False),
        shutdown_grace_period_secs=0,
    )
    async with fake_fleet("sglang", 2) as fleet, trio.open_nursery() as nursery:
        shutdown = trio.Event()
        running = await nursery.start(
            lambda task_status: serve(cfg, shutdown=shutdown, store=MemoryStore(), task_status=task_status)
        )
        for url in fleet.urls:
            await running.gateway.registry.register(Registration(url=url), "api")
        with trio.fail_after(10):
            while sum(w.is_visible for w in running.gateway.fleet.registry) < 2:
                await trio.sleep(0.01)
        client = RL(running.urls[0], timeout=10)

        def scenario() -> None:
            first, second = sorted(client.workers(), key=lambda w: w.id)
            one = client.set_version("42", worker_id=first.id)
            assert isinstance(one, Worker) and one.id == first.id and one.weight_version == "42"
            assert one.extra["version_source"] == "api"
            rows = client.set_state("paused", selector="engine=sglang")
            assert sorted(w.id for w in rows) == sorted([first.id, second.id])
            assert {w.extra["control"] for w in rows} == {"paused"}
            assert client.set_state("active", worker_id=second.id).extra["control"] == "active"
            assert {w.id: w.extra["control"] for w in client.workers()} == {
                first.id: "paused",
                second.id: "active",
            }
            fleet_rows = client.set_version("43", selector="engine=sglang")
            assert {w.weight_version for w in fleet_rows} == {"43"}
            with pytest.raises(RlError) as info:
                client.set_state("napping", worker_id=first.id)
            assert (info.value.status, info.value.code) == (400, "invalid_body")
            with pytest.raises(RlError) as info:
                client.set_version(" ", worker_id=first.id)
            assert info.value.code == "invalid_version"
            with pytest.raises(RlError) as info:
                client.set_version("1", worker_id="nope")
            assert (info.value.status, info.value.code) == (404, "worker_not_found")
            with pytest.raises(RlError) as info:
                client.set_state("active", selector="engine=vllm")
            assert info.value.code == "no_workers_match"
            with pytest.raises(RlError) as info:
                client.set_state("active", selector="engine in (")
            assert info.value.code == "invalid_selector"

        await trio.to_thread.run_sync(scenario)
        shutdown.set()


def test_a_trainer_hand_off_is_retried_while_the_sagas_driver_is_replaced(rl, gateway):
    """503 refit_driver_unavailable twice, then the new driver answers: commit_refit returns its
    answer; any other error is raised at once, and past retry_secs the 503 is raised."""
    answers = [
        (503, {"error": "refit_driver_unavailable", "message": "retry"}, "application/json"),
        (503, {"error": "refit_driver_unavailable", "message": "retry"}, "application/json"),
        (202, {"refit_id": "r1", "state": "committing"}, "application/json"),
    ]
    gateway.routes[("POST", "/v1/rl/refits/r1/commit")] = lambda seen: answers.pop(0)
    assert rl.commit_refit("r1")["state"] == "committing"
    assert [s.path for s in gateway.seen] == ["/v1/rl/refits/r1/commit"] * 3
    gateway.on("POST", "/v1/rl/refits/r1/fail", 409, {"error": "refit_state", "message": "no"})
    with pytest.raises(RlError) as info:
        rl.fail_refit("r1", "x")
    assert info.value.code == "refit_state" and len(gateway.seen) == 4
    gateway.on(
        "POST", "/v1/rl/refits/r1/transfer", 503, {"error": "refit_driver_unavailable", "message": "r"}
    )
    with pytest.raises(RlError) as info:
        rl.refit_transfer("r1", ["w"], ["float32"], [[1]], retry_secs=0)
    assert info.value.code == "refit_driver_unavailable" and len(gateway.seen) == 5


def test_a_fanout_failed_on_every_target_says_failed_as_the_journal_does(rl, gateway):
    """A load refused by every engine is ``failed``, not ``partial``: ``FanoutError.outcome`` and
    its text say so (the journal records the operation ``failed``); the payload stays SMG's."""
    failed = [
        {
            "worker_id": w,
            "url": f"http://{w}:1",
            "error": "upstream_error",
            "message": "HTTP 400",
            "status": 400,
        }
        for w in ("w1", "w2")
    ]
    outcomes = {w: outcome(w, status=400, body={"message": "no such dir"}) for w in ("w1", "w2")}
    gateway.on("POST", "/v1/rl/engine/update_weights_from_disk", 207, fanout_body(outcomes, failed, 2))
    with pytest.raises(FanoutError) as info:
        rl.fanout("update_weights_from_disk", {"model_path": "/x"}, selector="engine=sglang")
    err = info.value
    assert err.outcome == "failed" and err.result.outcome == "failed"
    assert str(err).splitlines()[-1] == "  failed on every target (2 of 2)"
    assert err.payload == {"error": "fanout_partial", "message": "failed workers: w1, w2"}
    gateway.on("POST", "/v1/rl/engine/pause_generation", 207, PARTIAL)
    with pytest.raises(FanoutError) as info:
        rl.fanout("pause_generation", {}, selector="worker_type=regular")
    assert info.value.outcome == "partial" and "every target" not in str(info.value)

"""Fake-only surface of an engine: misbehaviour knobs, the call log, introspection.

HTTP (never clashing with engine routes, never subject to the knobs themselves):

* ``GET /_fake/knobs``; ``POST /_fake/knobs`` with any subset of the :class:`Knobs` fields
  (unknown or ill-typed keys: 400). ``down_for_s`` is an action: the answer is sent, then the
  listener and every connection close, connections are refused for that long, then the port
  listens again.
* ``GET /_fake/calls[?path=/x]`` -> ``{"calls": [RecordedCall.to_json(), ...]}``; ``DELETE /_fake/calls``
  clears the log and resets the peak-concurrency gauges.
* ``GET /_fake/state`` -> the engine's state (see ``BaseEngine.state``).
* ``GET /_fake/weights`` -> what weight transfers delivered (metadata and checksums).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import attrs

from smgrl.fake.http import Request, Response, json_response

if TYPE_CHECKING:
    from smgrl.fake.base import BaseEngine

_HUGE_CHUNK = 64 * 1024


@attrs.define
class Knobs:
    latency_ms: float = 0.0  # added before every engine answer
    token_latency_ms: float = 0.0  # per generated token: keeps generations in flight
    force_status: int | None = None  # answer every engine route with this status ...
    force_body: str | None = None  # ... and this body (JSON if it parses, else text)
    hang: bool = False  # accept requests and never answer them
    huge_body_bytes: int | None = None  # next control call streams a body this large (one-shot)
    redirect_to: str | None = None  # answer every engine route with a redirect to this base URL
    redirect_status: int = 307
    fail_loads: int = 0  # the next N weight loads from disk fail, weights untouched (refit saga tests)
    # The next N disk loads replace the weights (and set the version), then answer 500: the
    # engine's weights changed although the call failed (an engine that crashed mid-answer).
    fail_loads_after_swap: int = 0
    load_delay_ms: float = 0.0  # added to every weight load (fixed load time for benchmarks)
    corrupt_transfers: bool = False  # received tensors get wrong checksums (checksum route tests)

    def to_json(self) -> dict[str, Any]:
        return attrs.asdict(self)


_KNOB_TYPES: dict[str, tuple[type, ...]] = {
    "latency_ms": (int, float),
    "token_latency_ms": (int, float),
    "force_status": (int, type(None)),
    "force_body": (str, type(None)),
    "hang": (bool,),
    "huge_body_bytes": (int, type(None)),
    "redirect_to": (str, type(None)),
    "redirect_status": (int,),
    "fail_loads": (int,),
    "fail_loads_after_swap": (int,),
    "load_delay_ms": (int, float),
    "corrupt_transfers": (bool,),
    "down_for_s": (int, float, type(None)),
}


def validate_knobs(payload: Any) -> str | None:
    """An error message, or None when ``payload`` is a valid partial knob update."""
    if not isinstance(payload, dict):
        return "knobs must be a JSON object"
    for key, value in payload.items():
        types = _KNOB_TYPES.get(key)
        if types is None:
            return f"unknown knob {key!r}"
        if isinstance(value, bool) and bool not in types:
            return f"knob {key!r} has the wrong type"
        if not isinstance(value, types):
            return f"knob {key!r} has the wrong type"
    status = payload.get("force_status")
    if status is not None and not 200 <= status <= 999:
        return "force_status must be within 200..999"
    return None


@attrs.frozen
class RecordedCall:
    """One request an engine received (fake routes excluded)."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    ts: float  # wall clock, seconds

    def json_body(self) -> Any:
        return json.loads(self.body) if self.body else None

    def to_json(self) -> dict[str, Any]:
        try:
            body, encoding = self.body.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            body, encoding = base64.b64encode(self.body).decode("ascii"), "base64"
        return {
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "headers": self.headers,
            "body": body,
            "body_encoding": encoding,
            "ts": self.ts,
        }


def record(req: Request) -> RecordedCall:
    return RecordedCall(req.method, req.path, req.query_string, dict(req.headers), req.body, time.time())


def forced_response(knobs: Knobs) -> Response:
    body = (knobs.force_body or "").encode()
    content_type = None
    if body:
        try:
            json.loads(body)
            content_type = "application/json"
        except ValueError:
            content_type = "text/plain; charset=utf-8"
    return Response(int(knobs.force_status or 200), body, content_type)


def redirect_response(knobs: Knobs, req: Request) -> Response:
    target = knobs.redirect_to.rstrip("/") + req.path
    if req.query_string:
        target += "?" + req.query_string
    return Response(knobs.redirect_status, headers=[("location", target)])


def huge_response(size: int) -> Response:
    """Exactly ``size`` bytes, streamed; valid JSON when size >= 10 ({"pad":"xxx..."})."""

    async def chunks() -> AsyncIterator[bytes]:
        if size < 10:
            yield b"x" * size
            return
        yield b'{"pad":"'
        left = size - 10
        while left > 0:
            n = min(left, _HUGE_CHUNK)
            yield b"x" * n
            left -= n
        yield b'"}'

    return Response(200, content_type="application/json", stream=chunks(), content_length=size)


async def fake_route(engine: BaseEngine, req: Request) -> Response:
    route = (req.method, req.path)
    if route == ("GET", "/_fake/knobs"):
        return json_response(engine.knobs.to_json())
    if route == ("POST", "/_fake/knobs"):
        try:
            payload = req.json()
        except ValueError:
            return json_response({"error": "body must be JSON"}, 400)
        error = validate_knobs(payload)
        if error:
            return json_response({"error": error}, 400)
        down = payload.pop("down_for_s", None)
        engine.set_knobs(**payload)
        response = json_response(engine.knobs.to_json())
        if down is not None:
            # After the answer is written: the client that asked must learn it worked.
            response.after_send = lambda: engine.go_down(down)
        return response
    if route == ("GET", "/_fake/calls"):
        only = req.arg("path")
        calls = [c.to_json() for c in engine.calls if only is None or c.path == only]
        return json_response({"calls": calls})
    if route == ("DELETE", "/_fake/calls"):
        engine.clear_calls()
        return json_response({"cleared": True})
    if route == ("GET", "/_fake/state"):
        return json_response(engine.state())
    if route == ("GET", "/_fake/weights"):
        return json_response(engine.weight_transfers())
    return json_response({"error": f"no fake route {req.method} {req.path}"}, 404)

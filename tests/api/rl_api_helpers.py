"""Shared helpers of the /v1/rl and /workers contract tests (a uniquely named module rather than
conftest: test directories here have no __init__.py).

Assertions are exact: ``assert_json`` compares the parsed body field by field AND in wire order
(SMG serialises fields in a fixed order and clients may depend on it), with ``latency_ms`` values
checked to be non-negative ints and then replaced by ``MS``.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from smgrl.core.auth import ControlPlaneKey, TenantKey
from smgrl.core.config import Config, RlConfig

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
MS = "<ms>"
GENERATED_ID = re.compile(r"^req-[A-Za-z0-9]{24}$")
GENERATED_GNT_ID = re.compile(r"^gnt-[A-Za-z0-9]{24}$")
UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")

ADMIN_KEY, USER_KEY, TENANT_KEY = "admin-secret", "user-secret", "tenant-secret"
ADMIN = {"authorization": f"Bearer {ADMIN_KEY}"}
USER = {"authorization": f"Bearer {USER_KEY}"}
KEYS = (
    ControlPlaneKey("adm", "Admin", "admin", ADMIN_KEY),
    ControlPlaneKey("usr", "User", "user", USER_KEY),
)
TENANTS = (TenantKey("t1", TENANT_KEY),)


def rl_cfg(*, timeout: int = 5, concurrency: int = 32, **kw: Any) -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=timeout, fanout_concurrency=concurrency), **kw
    )


def ordered(value: Any) -> Any:
    """A comparable form that keeps dict key order (dict equality ignores it)."""
    if isinstance(value, dict):
        return [("{", k, ordered(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [ordered(v) for v in value]
    return value


def _mask_latency(value: Any) -> Any:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k == "latency_ms":
                assert isinstance(v, int) and not isinstance(v, bool) and v >= 0, v
                out[k] = MS
            else:
                out[k] = _mask_latency(v)
        return out
    if isinstance(value, list):
        return [_mask_latency(v) for v in value]
    return value


def body_of(r) -> Any:
    return _mask_latency(json.loads(r.content))


def assert_json(r, status: int, expected: Any, headers: set[str] | None = None) -> None:
    """Status, content-type, body (values and key order) and, when given, the exact header names."""
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == JSON
    got = body_of(r)
    assert got == expected
    assert ordered(got) == ordered(expected)
    assert r.headers["content-length"] == str(len(r.content))
    if headers is not None:
        assert set(r.headers) == headers, set(r.headers)


def assert_text(r, status: int, text: str, headers: set[str] | None = None) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == TEXT
    assert r.content == text.encode()
    if headers is not None:
        assert set(r.headers) == headers, set(r.headers)


def assert_generated_id(r, pattern: re.Pattern = GENERATED_ID) -> None:
    assert pattern.match(r.headers["x-request-id"]), r.headers["x-request-id"]


def openai_error(code: str, message: str) -> dict:
    return {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": None}}


def rl_error(code: str, message: str, **context: Any) -> dict:
    return {"error": code, "message": message, **context}


def sent_headers(call) -> dict[str, str]:
    """What an engine received, without ``host`` (its port differs per run)."""
    return {k: v for k, v in call.headers.items() if k != "host"}


async def row_ids(gw, headers: dict | None = None) -> list[str]:
    r = await gw.client.get("/v1/rl/workers", headers=headers or {})
    return [w["id"] for w in r.json()["workers"]]


def engine_for(fleet, url: str):
    """The fake engine serving a worker URL (``@rank`` suffix ignored)."""
    base = url.rsplit("@", 1)[0] if "@" in url.rsplit("/", 1)[-1] else url
    return next(e for e in fleet.engines if e.url == base)


def journal(gw, *types: str) -> list:
    return [rec.event for rec in gw.store.read(types=list(types) or None)]


async def audit_counts(gw) -> dict[tuple[str, str, str, str | None], int]:
    """Flush the audited reads and denials counted so far; every count journaled, summed per
    (principal, family, outcome, reason)."""
    await gw.gateway.audit.flush(gw.writer)
    totals: dict[tuple[str, str, str, str | None], int] = {}
    for event in journal(gw, "audit.control_plane_counts"):
        for c in event.counts:
            key = (c["principal"], c["family"], c["outcome"], c["reason"])
            totals[key] = totals.get(key, 0) + c["count"]
    return totals


def op_events(gw, op_id: str) -> list:
    return [rec.event for rec in gw.store.read(stream=f"op:{op_id}")]


class RawEngine:
    """A tiny HTTP/1.1 engine whose control answers are exact bytes (status, headers, body), for
    what the fake engines cannot produce: any content-type, invalid UTF-8, a body cut short.
    It answers the registration probe like a minimal SGLang and records every request line."""

    PROBE: ClassVar[dict[str, bytes]] = {
        "/health": b"",
        "/v1/models": json.dumps({"object": "list", "data": [{"id": "raw", "owned_by": "sglang"}]}).encode(),
        "/server_info": json.dumps(
            {"model_path": "raw", "tp_size": 1, "dp_size": 1, "version": "0.5.23"}
        ).encode(),
        "/model_info": json.dumps({"model_path": "raw"}).encode(),
    }

    def __init__(self) -> None:
        self.status = 200
        self.headers: list[tuple[str, str]] = []
        self.body = b""
        self.declared_length: int | None = None  # lie about the length: the body is cut short
        self.targets: list[str] = []
        self.url = ""

    def answer(
        self,
        status: int,
        body: bytes = b"",
        content_type: str | None = None,
        declared_length: int | None = None,
    ) -> None:
        self.status, self.body, self.declared_length = status, body, declared_length
        self.headers = [("content-type", content_type)] if content_type is not None else []

    async def serve(self, *, task_status) -> None:
        import trio

        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream) -> None:
        from smgrl.fake.scripted import read_requests

        async with stream:
            async for raw in read_requests(stream):
                method, target = raw.method, raw.target
                path = target.split("?", 1)[0]
                if path in self.PROBE:
                    status, headers, body = 200, [("content-type", "application/json")], self.PROBE[path]
                else:
                    self.targets.append(f"{method} {target}")
                    status, headers, body = self.status, self.headers, self.body
                declared = self.declared_length if path not in self.PROBE else None
                out = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in headers]
                if method != "HEAD" or path in self.PROBE:
                    out.append(f"content-length: {declared if declared is not None else len(body)}")
                await stream.send_all(
                    ("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + (b"" if method == "HEAD" else body)
                )
                if declared is not None:
                    return  # close mid-body

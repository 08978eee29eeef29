"""Discovery (``GET``/``HEAD /v1/rl/workers``) served as raw ASGI in front of Quart.

Trainers poll discovery; measured (``benchmarks/profile.py discovery``, docs/benchmarks.md),
Quart's request and response machinery was about half of such a request. The answer itself is a
render cached by projection revision (``RlApi.workers_body``), so this front answers the plain
case directly: same headers (content-type, content-length, ``x-request-id`` by SMG's rules), same
audit (``Guard.allowed_read``). Anything else goes on to Quart unchanged, so every other outcome
keeps its one implementation there: a denied key (its envelope and count), a request carrying a
body (the declared-length 413), another method (405), any other path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from smgrl.api import envelopes as env
from smgrl.api.scope import header_text
from smgrl.auth import READ, Denied

PATH = "/v1/rl/workers"
RAW_PATH = PATH.encode()
JSON_CT = env.JSON.encode()


class DiscoveryFront:
    def __init__(self, inner: Callable[..., Awaitable[None]], gateway, rl_api) -> None:
        self.inner = inner
        self.gw = gateway
        self.rl = rl_api

    async def __call__(self, scope, receive, send) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != PATH
            or scope.get("raw_path", RAW_PATH) != RAW_PATH
            or scope["method"] not in ("GET", "HEAD")
            or any(key in (b"content-length", b"transfer-encoding") for key, _ in scope["headers"])
        ):
            await self.inner(scope, receive, send)
            return
        decision = self.gw.auth.check(header_text(scope, b"authorization"), READ)
        if isinstance(decision, Denied):
            await self.inner(scope, receive, send)  # Quart answers (and counts) every refusal
            return
        caller = env.caller_request_id(lambda name: header_text(scope, name.encode()))
        request_id, _ = env.request_id_for(caller, PATH)
        body = self.rl.workers_body()
        head = [
            (b"content-type", JSON_CT),
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", request_id.encode("latin-1")),
        ]
        self.rl.guard.allowed_read(decision, scope["method"], PATH, request_id)
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})

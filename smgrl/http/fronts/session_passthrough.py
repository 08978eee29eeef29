"""The rest of a session's OpenAI surface: what an agent pointed at ``/sessions/{sid}/v1`` asks
besides its chat turns (docs/psrl.md).

PSRL's SessionRouter passes any other ``/sessions/{sid}/{path}`` on to the gateway's ``/{path}``
with the session's headers, so agents that list models first, or run a plain completion, work
behind it. Here ``GET /sessions/{sid}/v1/models`` and ``POST /sessions/{sid}/v1/completions`` are
served by the data plane's own ``/v1/models`` and ``/v1/completions``, with the session's default
routing headers under the request's own (the request's win, as in the SessionRouter). Not
captured: token-exact capture is for chat turns (``x-smg-tito-session-id`` is never passed).
"""

from __future__ import annotations

import trio

TAILS = {"v1/models": "/v1/models", "v1/completions": "/v1/completions"}
TEMPLATES = {f"/sessions/{{sid}}/{tail}": path for tail, path in TAILS.items()}
_DROPPED = frozenset({b"x-smg-tito-session-id", b"content-length"})


def scope_for(scope, path: str, defaults: dict[str, str], body: bytes) -> dict:
    """The data-plane request a session path stands for: ``path``, the session's default
    headers under the request's own, the body as read."""
    own = [(k, v) for k, v in scope["headers"] if k not in _DROPPED]
    names = {k for k, _ in own}
    added = [
        (k.encode("latin-1"), v.encode("latin-1"))
        for k, v in defaults.items()
        if k.encode("latin-1") not in names and k != "x-smg-tito-session-id"
    ]
    headers = own + added
    if body:
        headers.append((b"content-length", str(len(body)).encode()))
    return {**scope, "path": path, "raw_path": path.encode(), "query_string": scope.get("query_string", b""),
            "headers": headers}  # fmt: skip


def replay(body: bytes):
    """A ``receive`` that gives the already-read body once, then waits for the disconnect."""
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await trio.sleep_forever()

    return receive

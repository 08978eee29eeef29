"""What every raw ASGI front shares: reading a request's headers (one, or several in one scan), its
body (one reader for the rollout routes, the engine front and sessions), and a call cancelled when
the client disconnects (one watcher for the same three)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from smgrl.http.server import DISCONNECT_EXTENSION

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def header(scope: Scope, name: bytes) -> bytes | None:
    """A request header (names are lower-case bytes, as servers pass them); the first occurrence
    wins, as Quart's ``request.headers.get`` does."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def header_text(scope: Scope, name: bytes) -> str | None:
    """The header decoded as latin-1 (what Quart hands its routes), or None."""
    value = header(scope, name)
    return None if value is None else value.decode("latin-1")


def headers_of(scope: Scope, wanted: frozenset[bytes]) -> dict[bytes, bytes]:
    """The ``wanted`` headers of a request from one scan (the first occurrence of each wins, as
    for every other header: ``header``)."""
    found: dict[bytes, bytes] = {}
    for key, value in scope["headers"]:
        if key in wanted and key not in found:
            found[key] = value
    return found


async def until_disconnect(scope: Scope, receive: Receive, fn: Callable[..., Awaitable[Any]], *args) -> Any:
    """``await fn(*args)``, cancelled when the client disconnects (then None). What ``fn`` raises
    comes out as itself, never wrapped in an exception group. The one disconnect watcher of the
    raw fronts: rollout routes, sessions (turns and forwarded requests), the engine front."""
    hook = scope.get("extensions", {}).get(DISCONNECT_EXTENSION)
    if hook is not None:
        # smgrl's server (smgrl.http.server's DisconnectHook) cancels this scope itself on a
        # disconnect: no task per request.
        with trio.CancelScope() as cancel:
            hook.cancel_on_disconnect(cancel)
            try:
                return await fn(*args)
            finally:
                hook.cancel_on_disconnect(None)
        return None
    # Any other server (the in-process test client): a task waiting in receive() cancels the
    # nursery when the disconnect arrives; the call's own end cancels that task.
    result = error = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch_disconnect, receive, nursery.cancel_scope)
        try:
            result = await fn(*args)
        except Exception as exc:  # noqa: BLE001 - raised below as itself, not inside the nursery's group
            error = exc
        finally:
            nursery.cancel_scope.cancel()
    if error is not None:
        try:
            raise error
        finally:
            # The traceback holds this frame, whose ``error`` holds the traceback: a cycle only a
            # full collection frees (rare with the gateway's gc tuning), keeping whatever the
            # failed call's frames held (a long turn's parsed body and prompt ids) alive.
            error = None
    return result


async def watch_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


class BodyDisconnected(Exception):
    """The client left before its request body ended."""


class BodyTooLarge(Exception):
    """The request body passed the front's limit (each front answers its own 413)."""


async def read_body(
    receive: Receive, max_body: int, *, first: dict[str, Any] | None = None, take=None
) -> bytes:
    """The request body, message by message until the last. ``first``: its first message, already
    taken (``RECEIVE_NOWAIT``); ``take(n)``: called for each chunk before it is kept (a memory
    budget, which may refuse). Raises ``BodyDisconnected`` or ``BodyTooLarge`` (past
    ``max_body`` bytes); the deadline, if any, is the caller's scope around it."""
    chunks = []
    size = 0
    message = first
    while True:
        if message is None:
            message = await receive()
        if message["type"] == "http.disconnect":
            raise BodyDisconnected
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > max_body:
                raise BodyTooLarge
            if take is not None:
                take(len(chunk))
            chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        message = None

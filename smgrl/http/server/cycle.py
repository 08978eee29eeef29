"""One request on a connection of smgrl's server and its answer (``RequestCycle``): what was parsed
of it, the queue its app reads the body from, and the app's ASGI ``send``, which turns the answer
into the bytes ``ClientConnection.write_body`` puts on the wire."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from smgrl.http.server import wire
from smgrl.http.server.appqueue import AppQueue, DisconnectHook

if TYPE_CHECKING:
    from smgrl.http.server.connection import ClientConnection

REQUEST, RESPONSE, DONE = 0, 1, 2  # a cycle's state: no answer yet, answer started, answer complete


class UnexpectedMessage(Exception):
    """An ASGI message the answer's state does not allow (a second start, a body before it)."""


class RequestCycle:
    """One request and its answer."""

    __slots__ = (
        "complete",
        "conn",
        "expect",
        "framing",
        "head",
        "head_done",
        "headers",
        "hook",
        "http11",
        "keep_alive",
        "method",
        "pending",
        "queue",
        "remaining",
        "started",
        "state",
        "target",
    )

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.method = "GET"
        self.http11 = True
        self.keep_alive = True
        self.expect = False
        self.head_done = False
        self.complete = False  # the request body has all arrived
        self.pending: list[bytes] = []  # body bytes parsed, not yet queued for the app
        self.queue = AppQueue(conn.server.max_app_queue)
        self.hook = DisconnectHook()
        self.started = False
        self.state = REQUEST
        self.head: bytes | None = None  # the answer's head, held back for its first body bytes
        self.framing = wire.NO_BODY
        self.remaining = 0

    async def send(self, message: dict[str, Any]) -> None:
        """The app's ASGI ``send``."""
        kind = message["type"]
        if kind == "http.response.start" and self.state == REQUEST:
            status = message["status"]
            head = wire.response_head(
                status,
                message.get("headers", []),
                head_request=self.method == "HEAD",
                http11=self.http11,
                keep_alive=self.keep_alive,
                early=not self.complete,
            )
            self.state = RESPONSE
            self.framing = head.framing
            self.remaining = head.length
            if head.close:
                self.keep_alive = False
            self.head = head.data
            return
        if kind == "http.response.body" and self.state == RESPONSE:
            body = message.get("body", b"")
            await self.conn.write_body(
                self, body if type(body) is bytes else bytes(body), message.get("more_body", False)
            )
            return
        if self.conn.closed:
            return  # the connection is gone: nothing to answer on
        raise UnexpectedMessage(
            f"{kind} after {('the request', 'the answer start', 'the answer')[self.state]}"
        )


def declared_length(cycle: RequestCycle) -> int | None:
    """The request body's Content-Length (0 without one), or None for a chunked body."""
    length = 0
    for name, value in cycle.headers:
        if name == b"transfer-encoding":
            return None
        if name == b"content-length":
            length = int(value) if value.isdigit() else 0
    return length

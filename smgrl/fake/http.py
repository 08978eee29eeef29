"""A lean HTTP/1.1 server on trio + h11 for the fake engines.

Why not Quart/hypercorn here: one fake process must serve hundreds of engine ports at a few
hundred microseconds of CPU per request (hypercorn costs 700-900 us, see
docs/hypercorn-patches.md). So: one trio task per connection, no task per request,
the response head and body written with one ``send_all``.

The server knows nothing about engines. It parses a request into a frozen :class:`Request`,
awaits ``handler(request)`` and writes the :class:`Response` (a full body or an async iterator
of chunks, sent chunked). Two fake-only behaviours live here because they are about sockets:
``HANG`` (read and discard until the client goes away, never answer) and :meth:`HttpServer.go_down`
(close the listener and every connection, refuse connections for a while, then listen again on
the same port).
"""

from __future__ import annotations

import contextlib
import functools
import http
import json
import math
import sys
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

import attrs
import h11
import trio

from smgrl.core.wire import json_bytes

MAX_BODY_BYTES = 64 * 1024 * 1024
_RECV_BYTES = 65536
_REASONS = {s.value: s.phrase.encode() for s in http.HTTPStatus}


@attrs.frozen
class Request:
    method: str
    path: str
    query_string: str
    query: tuple[tuple[str, str], ...]
    headers: Mapping[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes

    def header(self, name: str, default: str | None = None) -> str | None:
        return self.headers.get(name, default)

    def arg(self, name: str, default: str | None = None) -> str | None:
        """The last value of a query parameter (FastAPI's rule for scalar params)."""
        found = default
        for key, value in self.query:
            if key == name:
                found = value
        return found

    def args(self, name: str) -> list[str]:
        return [value for key, value in self.query if key == name]

    def json(self) -> Any:
        return json.loads(self.body)


Handler = Callable[[Request], Awaitable["Response"]]


@attrs.define
class Response:
    status: int = 200
    body: bytes = b""
    content_type: str | None = None
    headers: list[tuple[str, str]] = attrs.Factory(list)
    # A streamed body: sent chunked unless ``content_length`` is known.
    stream: AsyncIterator[bytes] | None = None
    content_length: int | None = None
    # Run after the response was written (e.g. take the listener down once the client has
    # its answer).
    after_send: Callable[[], None] | None = None


# Sentinel: accept the request and never answer it.
HANG = Response(status=0)


def json_response(obj: Any, status: int = 200, headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, json_bytes(obj), "application/json", headers or [])


def text_response(text: str, status: int = 200) -> Response:
    return Response(status, text.encode(), "text/plain; charset=utf-8")


def empty_response(status: int = 200) -> Response:
    return Response(status)


def sse_response(events: AsyncIterator[bytes]) -> Response:
    return Response(200, content_type="text/event-stream", stream=events)


def _build_request(event: h11.Request, body: bytes) -> Request:
    target = event.target.decode("latin-1")
    path, _, query_string = target.partition("?")
    headers: dict[str, str] = {}
    for name, value in event.headers:
        key = name.decode("latin-1")
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    query = tuple(parse_qsl(query_string, keep_blank_values=True))
    return Request(event.method.decode("ascii"), path, query_string, query, headers, body)


class _ClientGone(Exception):
    """The peer closed the connection or sent garbage: stop serving it."""


@attrs.define(eq=False)
class HttpServer:
    """One listening port. ``run`` serves until cancelled; ``go_down`` takes it off the air."""

    handler: Handler
    port: int = 0
    host: str = "127.0.0.1"
    _serve_scope: trio.CancelScope | None = None
    accepted: int = 0  # connections accepted so far (keep-alive checks)
    open_connections: int = 0
    _down_until: float = 0.0
    _listening: bool = False
    _wake: trio.Event = attrs.Factory(trio.Event)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def run(self, *, task_status: trio.TaskStatus[HttpServer] = trio.TASK_STATUS_IGNORED) -> None:
        started = False
        while True:
            try:
                listeners = await trio.open_tcp_listeners(self.port, host=self.host)
            except OSError:
                if not started:
                    raise  # the first bind failing is the caller's error (port in use, ...)
                # Coming back up: someone else may briefly hold the port; keep trying until
                # it is free again or we are cancelled.
                await trio.sleep(0.1)
                continue
            # Port 0 binds an ephemeral port once; every later restart reuses that number.
            self.port = listeners[0].socket.getsockname()[1]
            # This scope owns the listener and every connection task: cancelling it (go_down)
            # closes the listening socket (new connections are refused) and drops kept-alive
            # connections, which is what a crashed engine looks like to a gateway's pool.
            with trio.CancelScope() as scope:
                self._serve_scope = scope
                async with trio.open_nursery() as connections:
                    serve = functools.partial(trio.serve_listeners, handler_nursery=connections)
                    await connections.start(serve, self._serve_connection, listeners)
                    self._listening = not scope.cancel_called
                    if not started:
                        started = True
                        task_status.started(self)
            self._serve_scope = None
            # Down: wait until the deadline, or until ``come_up`` wakes us early.
            with trio.move_on_at(self._down_until):
                await self._wake.wait()
            self._wake = trio.Event()

    def go_down(self, seconds: float | None) -> None:
        """Stop listening and drop every connection now; listen again after ``seconds``."""
        self._down_until = trio.current_time() + (math.inf if seconds is None else max(0.0, seconds))
        self._listening = False
        if self._serve_scope is not None:
            self._serve_scope.cancel()

    def come_up(self) -> None:
        self._down_until = 0.0
        self._wake.set()

    @property
    def is_down(self) -> bool:
        """True from ``go_down`` until the listener accepts connections again."""
        return not self._listening

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        self.accepted += 1
        self.open_connections += 1
        try:
            while True:
                request = await _read_request(conn, stream)
                if request is None:
                    return
                try:
                    response = await self.handler(request)
                except Exception:  # noqa: BLE001 - a handler bug must not take the port down
                    # Connection tasks live in the listener's nursery: an escaping exception
                    # would cancel every connection and the listener. Answer 500 instead.
                    traceback.print_exc(file=sys.stderr)
                    response = Response(500, b"Internal Server Error", "text/plain; charset=utf-8")
                if response is HANG:
                    await _drain_until_eof(stream)
                    return
                await _send_response(conn, stream, request, response)
                if response.after_send is not None:
                    response.after_send()
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (_ClientGone, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            # The client went away or broke the protocol mid-exchange: there is nobody to answer.
            return
        except Exception:  # noqa: BLE001 - e.g. a streamed body failing half-way
            # Too late for a status line: log and drop this connection only.
            traceback.print_exc(file=sys.stderr)
        finally:
            self.open_connections -= 1


async def _read_request(conn: h11.Connection, stream: trio.SocketStream) -> Request | None:
    head: h11.Request | None = None
    parts: list[bytes] = []
    size = 0
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            data = await stream.receive_some(_RECV_BYTES)
            conn.receive_data(data)  # b"" tells h11 the peer closed its side
            continue
        if isinstance(event, h11.Request):
            head = event
            if conn.they_are_waiting_for_100_continue:
                await stream.send_all(conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if size > MAX_BODY_BYTES:
                raise _ClientGone("request body too large")
            parts.append(event.data)
        elif isinstance(event, h11.EndOfMessage):
            assert head is not None
            return _build_request(head, b"".join(parts))
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            return None


async def _send_response(
    conn: h11.Connection, stream: trio.SocketStream, request: Request, response: Response
) -> None:
    headers: list[tuple[str, str]] = []
    if response.content_type is not None:
        headers.append(("content-type", response.content_type))
    headers.extend(response.headers)
    bodyless = response.status in (204, 304)
    if bodyless:
        response.body, response.stream = b"", None
    elif response.stream is None:
        headers.append(("content-length", str(len(response.body))))
    elif response.content_length is not None:
        headers.append(("content-length", str(response.content_length)))
    # else: no framing header, so h11 sends the body chunked to an HTTP/1.1 client.
    head = h11.Response(
        status_code=response.status, headers=headers, reason=_REASONS.get(response.status, b"")
    )
    out = conn.send(head)
    if request.method == "HEAD":
        # Same head as the GET would have, and no body (h11 frames HEAD answers as empty).
        if response.stream is not None:
            await _aclose(response.stream)
        await stream.send_all(out + conn.send(h11.EndOfMessage()))
        return
    if response.stream is None:
        if response.body:
            out += conn.send(h11.Data(data=response.body))
        await stream.send_all(out + conn.send(h11.EndOfMessage()))
        return
    try:
        async for chunk in response.stream:
            if not chunk:
                continue
            # The head travels with the first chunk: one write, as a real server would.
            await stream.send_all(out + conn.send(h11.Data(data=chunk)))
            out = b""
        await stream.send_all(out + conn.send(h11.EndOfMessage()))
    finally:
        # A client that disconnects mid-stream must not leave the generator (and the fake
        # generation it drives) suspended forever: close it so its ``finally`` blocks run.
        await _aclose(response.stream)


async def _aclose(it: AsyncIterator[bytes]) -> None:
    aclose = getattr(it, "aclose", None)
    if aclose is not None:
        # Shielded: this runs in ``finally`` paths that may already be cancelled, and the
        # generator's cleanup (unregistering a request) must still happen.
        with trio.CancelScope(shield=True), contextlib.suppress(Exception):
            await aclose()


async def _drain_until_eof(stream: trio.SocketStream) -> None:
    # A hung engine keeps the connection open and never answers. Reading until EOF (instead of
    # sleeping forever) lets the task end as soon as the client gives up.
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        while await stream.receive_some(_RECV_BYTES):
            pass

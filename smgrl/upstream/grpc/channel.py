"""``Channel``: gRPC calls to one engine over one lazily opened, reopened HTTP/2 connection.

    ch = Channel("127.0.0.1", 30001, max_message_bytes=16 << 20, keepalive_secs=30)
    info = await ch.unary("/pkg.Service/Method", request, ResponseType, timeout=0.2)
    async with ch.server_stream("/pkg.Service/Method", request, ResponseType) as stream:
        async for message in stream: ...
    await ch.aclose()

The first call connects; a connection that failed or got GOAWAY is replaced at the next call
(calls it was serving end as the server or the failure decides). A call's ``timeout`` is sent
as ``grpc-timeout`` and enforced locally too (DEADLINE_EXCEEDED either way). Leaving a
``server_stream`` block early, or being cancelled inside it, resets the stream (RST_STREAM
CANCEL): the server sees the call cancelled.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator
from typing import Any

import trio

from smgrl.upstream.grpc.connection import GrpcCall, GrpcConnection
from smgrl.upstream.grpc.framing import DEFAULT_MAX_MESSAGE_BYTES, encode, request_headers
from smgrl.upstream.grpc.status import (
    DeadlineExceeded,
    GrpcError,
    StatusCode,
    Unavailable,
    error_for,
)

DEADLINE_MESSAGE = "Deadline Exceeded"
# A call the server refused before processing it (REFUSED_STREAM: its stream limit was reached
# while streams were ending) is sent again, after a pause that doubles from RESTART_PAUSE up to
# RESTART_PAUSE_MAX: resent at once, many refused calls met the same full limit again and ran out
# of tries together (seen with 1,200 streams under a 100-stream limit on a quiet machine).
MAX_RESTARTS = 30
RESTART_PAUSE, RESTART_PAUSE_MAX = 0.001, 0.05


class Stream:
    """The response side of a server-streaming call: iterate for messages; a status other than
    OK raises :class:`GrpcError` after the messages that came before it."""

    def __init__(self, call: GrpcCall, response_type: Any, deadline: float, restart=None):
        self._call = call
        self._restart = restart
        self._restarts = 0
        self._parse = response_type.FromString
        self._deadline = deadline

    @property
    def initial_metadata(self) -> tuple[tuple[str, str], ...]:
        return tuple((k, v) for k, v in self._call.state.headers if not k.startswith(":"))

    @property
    def trailers(self) -> tuple[tuple[str, str], ...]:
        return self._call.state.trailers

    @property
    def status(self) -> tuple[StatusCode, str] | None:
        return self._call.state.status

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Any:
        data = await self.read()
        if data is None:
            raise StopAsyncIteration
        return data

    def close(self) -> None:
        """Leaving before the end (break, an exception, a cancel): the server must stop the call.
        A synchronous RST_STREAM, so it also happens inside a cancelled scope."""
        call = self._call
        if not call.state.done:
            call.cancel()
            call.state.finish(StatusCode.CANCELLED, "Locally cancelled by application!")

    async def read(self) -> Any:
        """The next message, None at a clean end."""
        try:
            data = await self._call.next_message(self._deadline)
            while (
                data is None and self._call.state.refused and self._restart and self._restarts < MAX_RESTARTS
            ):
                # REFUSED_STREAM before any answer: the server never processed the call (its
                # stream limit was reached as streams ended), so it is sent again, as grpcio's
                # transparent retry does.
                pause = min(RESTART_PAUSE * 2**self._restarts, RESTART_PAUSE_MAX)
                self._restarts += 1
                with trio.fail_at(self._deadline):
                    await trio.sleep(pause)
                    self._call = await self._restart()
                data = await self._call.next_message(self._deadline)
        except trio.TooSlowError:
            self._call.cancel()
            self._call.state.finish(StatusCode.DEADLINE_EXCEEDED, DEADLINE_MESSAGE)
            raise DeadlineExceeded(StatusCode.DEADLINE_EXCEEDED, DEADLINE_MESSAGE) from None
        if data is not None:
            try:
                return self._parse(data)
            except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
                self._call.cancel()
                self._call.state.finish(StatusCode.INTERNAL, f"Exception deserializing response: {exc}")
                raise GrpcError(StatusCode.INTERNAL, "Exception deserializing response!") from None
        code, message = self._call.state.status or (StatusCode.UNKNOWN, "")
        if code != StatusCode.OK:
            raise error_for(code, message, self._call.state.trailers)
        return None


class Channel:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        keepalive_secs: float | None = None,
        keepalive_timeout_secs: float = 20.0,
        connect_timeout_secs: float = 5.0,
    ):
        self.host = host
        self.port = port
        self.authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.max_message_bytes = max_message_bytes
        self.keepalive_secs = keepalive_secs
        self.keepalive_timeout_secs = keepalive_timeout_secs
        self.connect_timeout_secs = connect_timeout_secs
        self.connections_opened = 0
        self._conn: GrpcConnection | None = None
        self._lock = trio.Lock()
        self._headers: dict[str, list] = {}  # per method path, for calls without timeout or metadata
        self._closed = False

    async def _connection(self) -> GrpcConnection:
        conn = self._conn
        if conn is not None and conn.usable:
            return conn
        # One connect at a time: callers that arrive meanwhile share the new connection.
        async with self._lock:
            if self._closed:
                raise Unavailable(StatusCode.UNAVAILABLE, "channel closed")
            conn = self._conn
            if conn is not None and conn.usable:
                return conn
            try:
                with trio.fail_after(self.connect_timeout_secs):
                    stream = await trio.open_tcp_stream(self.host, self.port)
            except (OSError, trio.TooSlowError) as exc:
                raise Unavailable(
                    StatusCode.UNAVAILABLE, f"failed to connect to {self.authority}: {exc}"
                ) from None
            conn = GrpcConnection(
                stream,
                self.authority,
                max_message_bytes=self.max_message_bytes,
                keepalive_secs=self.keepalive_secs,
                keepalive_timeout_secs=self.keepalive_timeout_secs,
            )
            conn.start()
            self.connections_opened += 1
            self._conn = conn
            return conn

    async def _start(self, path: str, request: Any, timeout: float | None, metadata: tuple) -> GrpcCall:
        body = encode(request.SerializeToString())
        if timeout is None and not metadata:
            # The usual engine call: the same headers every time for a method.
            headers = self._headers.get(path)
            if headers is None:
                headers = self._headers[path] = request_headers(self.authority, path, None)
        else:
            headers = request_headers(self.authority, path, timeout, metadata)
        for attempt in (1, 2):
            conn = await self._connection()
            try:
                return await conn.open(headers, body)
            except Unavailable:
                # The connection went away before this call's stream started (GOAWAY, a
                # failure): nothing reached the server, so once more on a fresh connection.
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def open_stream(
        self,
        path: str,
        request: Any,
        response_type: Any,
        *,
        timeout: float | None = None,
        metadata: tuple = (),
    ) -> Stream:
        """A server-streaming call, for a caller that ends it itself with :meth:`Stream.close`
        in a ``finally`` (``server_stream`` without its context manager layer: a buffered
        Generate call's path)."""
        if timeout is None:
            deadline = math.inf
            call = await self._start(path, request, timeout, metadata)
        else:
            deadline = trio.current_time() + timeout
            try:
                with trio.fail_at(deadline):
                    call = await self._start(path, request, timeout, metadata)
            except trio.TooSlowError:
                raise DeadlineExceeded(StatusCode.DEADLINE_EXCEEDED, DEADLINE_MESSAGE) from None

        async def restart() -> GrpcCall:
            return await self._start(path, request, timeout, metadata)

        return Stream(call, response_type, deadline, restart)

    @contextlib.asynccontextmanager
    async def server_stream(
        self,
        path: str,
        request: Any,
        response_type: Any,
        *,
        timeout: float | None = None,
        metadata: tuple = (),
    ) -> AsyncIterator[Stream]:
        stream = await self.open_stream(path, request, response_type, timeout=timeout, metadata=metadata)
        try:
            yield stream
        finally:
            # Left early (break, an exception, a cancel): the server must stop the call.
            stream.close()

    async def unary(
        self,
        path: str,
        request: Any,
        response_type: Any,
        *,
        timeout: float | None = None,
        metadata: tuple = (),
    ) -> Any:
        async with self.server_stream(
            path, request, response_type, timeout=timeout, metadata=metadata
        ) as stream:
            first = await stream.read()
            if first is None:
                raise GrpcError(StatusCode.UNIMPLEMENTED, "No message returned for unary request")
            extra = await stream.read()
            if extra is not None:
                raise GrpcError(StatusCode.UNIMPLEMENTED, "More than one message returned for unary request")
            return first

    async def aclose(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
            await conn.wait_closed()

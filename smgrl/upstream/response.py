"""The response to one exchange: its head, and its body read on demand from the connection.

A ``Response`` owns its connection from the moment the head is parsed until the body ends (then
the connection goes back to the pool at once, if it may be reused) or the exchange is
interrupted (then it is closed at once). Every hand-back goes through ``EnginePool._release``,
synchronously.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from smgrl.upstream.connection import RECEIVE_SIZE, STREAM_ERRORS, Connection
from smgrl.upstream.errors import ReadError
from smgrl.upstream.http11 import NEED_DATA, Data, EndOfMessage, Head, ResponseParser

if TYPE_CHECKING:
    from smgrl.upstream.pool import EnginePool

__all__ = ["Response"]


class Response:
    """A response whose head has been read; the body is read (once) with one of the methods."""

    __slots__ = (
        "_broken",
        "_complete",
        "_connection",
        "_keep_alive",
        "_parser",
        "_pool",
        "headers",
        "http_version",
        "reason",
        "status",
        "trailers",
    )

    def __init__(
        self, pool: EnginePool, connection: Connection, parser: ResponseParser, head: Head, keep_alive: bool
    ) -> None:
        self.status = head.status
        self.reason = head.reason
        self.http_version = head.http_version
        self.headers = head.headers
        self.trailers: list[tuple[bytes, bytes]] = []
        self._pool = pool
        self._connection: Connection | None = connection
        self._parser = parser
        self._keep_alive = keep_alive
        self._complete = False
        self._broken: str | None = None

    def __repr__(self) -> str:
        return f"<Response {self.status} {self.reason.decode('latin-1')!r} from {self._pool.origin}>"

    def header(self, name: bytes) -> bytes | None:
        """The first value of header ``name`` (lower-case), or None."""
        for key, value in self.headers:
            if key == name:
                return value
        return None

    async def aread(self) -> bytes:
        """The whole body (unbounded: prefer ``read_bounded`` for anything an engine controls)."""
        pieces = []
        while (data := await self._next_data()) is not None:
            pieces.append(data)
        return b"".join(pieces)

    async def read_bounded(
        self, limit: int, on_data: Callable[[int], None] | None = None
    ) -> tuple[bytes, bool]:
        """At most ``limit`` bytes of body, and whether the body had more.

        When it had more, reading stops at once (nothing is drained: the body may be huge) and
        the connection is closed, which also tells the engine to stop sending. (If the whole
        body had already arrived, nothing needed draining and the connection was pooled.)
        ``on_data(n)`` is told of each piece before it is kept; an exception it raises stops the
        read the same way and propagates (the data plane's memory budget).
        """
        pieces = []
        size = 0
        while (data := await self._next_data()) is not None:
            if on_data is not None:
                try:
                    on_data(len(data))
                except Exception:
                    self._drop("the body read was refused by read_bounded(on_data)")
                    raise
            pieces.append(data)
            size += len(data)
            if size > limit:
                self._drop("the body was truncated by read_bounded()")
                return b"".join(pieces)[:limit], True
        return b"".join(pieces), False

    def aiter_chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (each non-empty), e.g. to relay server-sent events."""
        return _Chunks(self)

    # -- internals -------------------------------------------------------------------------

    async def _next_data(self) -> bytes | None:
        """Every body byte available now, waiting for some if none is; None at the end."""
        if self._complete:
            return None
        connection = self._connection
        if connection is None:
            raise RuntimeError(f"cannot read the response body: {self._broken or 'the exchange has ended'}")
        parser = self._parser
        pieces: list[bytes] = []
        try:
            while True:
                event = parser.next_event()
                if type(event) is Data:
                    pieces.append(event.data)
                elif type(event) is EndOfMessage:
                    self.trailers = event.trailers
                    self._finish()
                    break
                elif pieces:
                    break  # deliver what we have before waiting for more
                else:
                    try:
                        data = await connection.receive(RECEIVE_SIZE)
                    except STREAM_ERRORS as exc:
                        raise ReadError(
                            f"connection to {self._pool.origin} broke inside the body: {exc}"
                        ) from exc
                    if data:
                        parser.feed(data)
                    else:
                        parser.feed_eof()  # ends a read-until-close body, else ReadError next
        except BaseException:
            # Cancelled or failed mid-body: the stream position is lost (bytes may have been
            # consumed into `pieces` that the caller will never see), so neither this Response
            # nor its connection can go on. Close now rather than at context exit so the
            # engine stops sending immediately.
            self._drop("an earlier read of the body was interrupted")
            raise
        if not pieces:
            return None
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _finish(self) -> None:
        # The body ended. Give the connection back right away (not at context exit) so the
        # next request to this engine can use it even if the caller lingers in the block.
        connection, self._connection = self._connection, None
        self._complete = True
        reusable = self._keep_alive and self._parser.reusable
        self._pool._release(connection, reusable=reusable)  # type: ignore[arg-type]

    def _drop(self, why: str) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            self._broken = why
            self._pool._release(connection, reusable=False)

    def _settle(self, clean: bool) -> None:
        """At context exit: pool the connection if the exchange is complete, else close it."""
        if self._connection is None:
            return  # already finished (and pooled or closed) or dropped
        if clean:
            # The caller may not have read a body that is already buffered in full (a 204, a
            # small JSON that came with the head). Consuming it needs no I/O, so do it and
            # keep the connection; a body still in flight is NOT waited for.
            try:
                while True:
                    event = self._parser.next_event()
                    if type(event) is EndOfMessage:
                        self._finish()
                        return
                    if event is NEED_DATA:
                        break
            except ReadError:
                pass
        self._drop("the exchange ended before the body was read")


class _Chunks:
    """Async iterator over a response body (a class, not an async generator: nothing to
    finalize when the caller stops early, and no generator machinery on the hot path)."""

    __slots__ = ("_response",)

    def __init__(self, response: Response) -> None:
        self._response = response

    def __aiter__(self) -> _Chunks:
        return self

    async def __anext__(self) -> bytes:
        data = await self._response._next_data()
        if data is None:
            raise StopAsyncIteration
        return data

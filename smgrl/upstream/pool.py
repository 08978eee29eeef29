"""Per-engine keep-alive pools: the trio I/O shell around the pure ``http11`` module.

One ``EnginePool`` per engine origin, because a pool shared by hundreds of engines is what made
the gateway's fan-out slow (see docs/architecture.md). An exchange is::

    async with pool.stream("POST", "/flush_cache", headers=[(b"accept", b"*/*")]) as response:
        body, truncated = await response.read_bounded(1 << 20)

Ownership is the whole design. A connection belongs to exactly one party: the pool's idle stack,
or one exchange (first the code here that sends the request and reads the head, then the
``Response`` of ``response.py``). Whoever owns it either hands it on or closes it, in the same
synchronous step: there is never an ``await`` between taking a connection and being inside the
``try`` that closes it, so a cancellation at any checkpoint leaves nothing half-owned. A
connection goes back to the idle stack only when its response was read to the end, keep-alive
allows it, and not a single byte is left over; any interruption (a cancel, an error, a body not
fully read, a ``read_bounded`` cut short before the body ended) closes it. There is no limit on
connections and no waiting for a slot (the caller bounds concurrency), so the only accounting
is the idle stack and a count of connections in use, both updated without awaits.

Timeouts are the caller's: wrap calls in ``trio.move_on_after`` / ``fail_after``.
"""

from __future__ import annotations

import contextlib
import ssl
import urllib.parse
from collections.abc import Callable, Sequence

import trio

from smgrl.core import origin_key
from smgrl.upstream.connection import RECEIVE_SIZE, STREAM_ERRORS, Connection, open_connection
from smgrl.upstream.errors import ConnectError, ReadError
from smgrl.upstream.http11 import NEED_DATA, Head, ResponseParser, request_wants_close, serialize_request
from smgrl.upstream.response import Response

__all__ = ["EnginePool", "PoolSet"]


class _StaleConnection(Exception):
    """Internal: a REUSED connection died before any response byte; retry on a fresh one."""


class EnginePool:
    """Keep-alive HTTP/1.1 connections to one engine origin (``http://host:port``, ``https://``).

    Idle connections are reused LIFO (the warmest first, the coldest expire), at most
    ``max_idle`` are kept, and none idle longer than ``idle_timeout`` seconds is reused.
    """

    def __init__(
        self,
        origin: str,
        *,
        max_idle: int = 16,
        idle_timeout: float = 60.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        scheme, host, port, authority = _parse_origin(origin)
        self.origin = f"{scheme}://{authority}"
        self._host = host
        self._port = port
        self._host_header = authority.encode("ascii")
        if scheme == "https":
            ssl_context = ssl_context or ssl.create_default_context()
        elif ssl_context is not None:
            raise ValueError(f"ssl_context given for a plain http origin {origin!r}")
        self._ssl_context = ssl_context
        self._max_idle = max_idle
        self._idle_timeout = idle_timeout
        self._idle: list[Connection] = []  # a stack: the most recently used on top
        self._active = 0
        self._opened = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"<EnginePool {self.origin} idle={len(self._idle)} active={self._active}>"

    # -- observability (tests, metrics) ----------------------------------------------------

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    @property
    def active_connections(self) -> int:
        """Connections owned by an exchange right now."""
        return self._active

    @property
    def connections_opened(self) -> int:
        return self._opened

    @property
    def closed(self) -> bool:
        return self._closed

    # -- the API ---------------------------------------------------------------------------

    def stream(
        self,
        method: str,
        target: str,
        *,
        headers: Sequence[tuple[bytes, bytes]] = (),
        body: bytes | None = None,
    ) -> contextlib.AbstractAsyncContextManager[Response]:
        """Send a request; the context manager yields the ``Response`` once its head is read.

        ``target`` is path plus optional query, already encoded, sent verbatim. The client
        adds only ``host`` and, when ``body`` is not None, ``content-length``. Redirects are
        returned as they are; 1xx interim responses are skipped.
        """
        if method == "CONNECT":
            raise ValueError("CONNECT (tunnels) is not supported")
        return _Exchange(self, method, target, headers, body)

    async def request(
        self,
        method: str,
        target: str,
        *,
        headers: Sequence[tuple[bytes, bytes]] = (),
        body: bytes | None = None,
        limit: int | None = None,
    ) -> tuple[Response, bytes, bool]:
        """One whole exchange: ``(response, body, truncated)``; ``limit`` bounds the body read."""
        async with self.stream(method, target, headers=headers, body=body) as response:
            if limit is None:
                return response, await response.aread(), False
            data, truncated = await response.read_bounded(limit)
            return response, data, truncated

    async def aclose(self) -> None:
        """Close the idle connections; connections in use are closed when their exchange ends."""
        self.close_idle()
        await trio.lowlevel.checkpoint()

    def close_idle(self) -> None:
        """``aclose`` without the checkpoint: the pool is closed and its idle sockets too."""
        # Everything happens before any checkpoint, so even a cancelled aclose() has closed
        # every idle socket, and exchanges still running see _closed and close theirs.
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()

    # -- for a Batch (batch.py): one task driving many exchanges ---------------------------

    @property
    def host_header(self) -> bytes:
        return self._host_header

    def take_idle(self, quiet: Callable[[Connection], bool] | None = None) -> Connection | None:
        """An idle plain-TCP connection, now owned by the caller (counted as in use), or None:
        nothing idle, a TLS pool, or a closed one. It goes back through ``give_back`` only.

        ``quiet(connection)``: True when the caller has just seen the connection silent (a
        fan-out's batch polls its kept registrations at once: smgrl/upstream/batch.py); its own
        idle check (a syscall per connection) is then skipped."""
        if self._closed or self._ssl_context is not None:
            return None
        connection = self._checkout(quiet)
        if connection is not None:
            self._active += 1
        return connection

    def give_back(self, connection: Connection, *, reusable: bool) -> None:
        """End a ``take_idle`` ownership: pooled again when ``reusable``, else closed."""
        self._release(connection, reusable=reusable)

    # -- connection ownership --------------------------------------------------------------

    async def _open_exchange(self, request: bytes, method: str, keep_alive: bool) -> Response:
        if self._closed:
            raise ConnectError(f"the connection pool for {self.origin} is closed")
        connection = self._checkout()
        while True:
            reused = connection is not None
            if connection is None:
                # Cancellation-safe by itself (see connection.py) and nothing is counted yet.
                connection = await open_connection(self.origin, self._host, self._port, self._ssl_context)
                self._opened += 1
            # No await between getting the connection and this try: from here, this frame owns
            # it and every way out of the try either hands it to a Response or closes it.
            self._active += 1
            try:
                parser, head = await self._send_and_read_head(connection, request, method, reused)
            except _StaleConnection:
                self._release(connection, reusable=False)
                # Loop once more with a FRESH connection: reused is then False, so
                # _send_and_read_head never raises _StaleConnection again. At most one retry.
                connection = None
                continue
            except BaseException:
                # Cancelled, ConnectError, ReadError, KeyboardInterrupt...: the exchange was
                # interrupted mid-way, so the connection's state is unknown. Never pool it.
                self._release(connection, reusable=False)
                raise
            return Response(self, connection, parser, head, keep_alive)

    async def _send_and_read_head(
        self, connection: Connection, request: bytes, method: str, reused: bool
    ) -> tuple[ResponseParser, Head]:
        # The stale-connection retry, and why it is safe. Engines close kept-alive connections
        # that sat idle past their keep-alive timeout. _checkout() discards connections that
        # are already closed, but the engine can close one between that check and our request
        # reaching it. Then the write fails (RST), or succeeds into a socket nobody will read
        # and we get EOF or a reset before any response byte. In both cases the engine closed
        # the connection in its IDLE state, i.e. without reading our request (a server does
        # not time out a connection as idle while it holds a request it has read; and a close
        # with our bytes still unread in its buffer is what turns into the RST). So the request
        # was never processed and sending it again, once, on a fresh connection is safe
        # whatever the method. Never on a fresh connection (it had no idle time to race with:
        # EOF there means the engine read the request and hung up, a real ReadError), and
        # never once a response byte has arrived (the engine answered; it did act).
        # Residual risk, accepted: an engine that reads a request on a reused connection and
        # then dies without a byte of answer looks the same; the retry then usually meets a
        # refused connection, but a non-idempotent request could run twice if it came back.
        try:
            await connection.send(request)
        except STREAM_ERRORS as exc:
            if reused:
                raise _StaleConnection from exc
            raise ConnectError(f"cannot send the request to {self.origin}: {exc}") from exc
        parser = ResponseParser(method)
        received = False
        event = NEED_DATA  # nothing to parse before the first receive
        while True:
            if event is NEED_DATA:
                try:
                    data = await connection.receive(RECEIVE_SIZE)
                except STREAM_ERRORS as exc:
                    if reused and not received:
                        raise _StaleConnection from exc
                    raise ReadError(
                        f"connection to {self.origin} broke before the response head: {exc}"
                    ) from exc
                if data:
                    received = True
                    parser.feed(data)
                elif received:
                    parser.feed_eof()  # the next event raises ReadError: the head was cut short
                elif reused:
                    raise _StaleConnection
                else:
                    raise ReadError(f"{self.origin} closed the connection without answering")
            elif event.status >= 200:  # type: ignore[union-attr]  (only Head comes before the body)
                return parser, event  # type: ignore[return-value]
            # Bytes were fed, or a 1xx interim response (100 Continue, 103 Early Hints) is
            # skipped: parse on.
            event = parser.next_event()

    def _checkout(self, quiet: Callable[[Connection], bool] | None = None) -> Connection | None:
        idle = self._idle
        if not idle:
            return None
        now = trio.current_time()
        while idle:
            connection = idle.pop()  # LIFO: the most recently used is the likeliest alive
            if now - connection.idle_since < self._idle_timeout and (
                (quiet is not None and quiet(connection)) or not connection.readable_while_idle()
            ):
                return connection
            connection.close()
        return None

    def _release(self, connection: Connection, *, reusable: bool) -> None:
        """The one way an exchange gives up its connection: back to the idle stack, or closed.

        Synchronous, so no cancellation can land between the accounting and the hand-over.
        """
        self._active -= 1
        if reusable:
            self._checkin(connection)
        else:
            connection.close()

    def _checkin(self, connection: Connection) -> None:
        if self._closed or self._max_idle <= 0 or self._idle_timeout <= 0:
            connection.close()
            return
        idle = self._idle
        now = trio.current_time()
        # The bottom of the stack idled longest: expire from there, then make room.
        while idle and now - idle[0].idle_since >= self._idle_timeout:
            idle.pop(0).close()
        if len(idle) >= self._max_idle:
            idle.pop(0).close()
        connection.idle_since = now
        idle.append(connection)


class _Exchange(contextlib.AbstractAsyncContextManager["Response"]):
    """What ``EnginePool.stream`` returns: sends on enter, settles the connection on exit."""

    __slots__ = ("_body", "_headers", "_method", "_pool", "_response", "_target")

    def __init__(
        self,
        pool: EnginePool,
        method: str,
        target: str,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes | None,
    ) -> None:
        # Attribute assignments, shaped like other constructors: nothing to share.
        self._pool = pool
        self._method = method
        self._target = target
        self._headers = headers
        self._body = body
        self._response: Response | None = None

    async def __aenter__(self) -> Response:
        pool = self._pool
        request = serialize_request(self._method, self._target, pool._host_header, self._headers, self._body)
        # A caller-sent "connection: close" means the engine will close after answering, even
        # if its response forgets to say so: never pool such a connection.
        keep_alive = not request_wants_close(self._headers) if self._headers else True
        self._response = await pool._open_exchange(request, self._method, keep_alive)
        return self._response

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        # No await here: settling the connection must not be a checkpoint that a pending
        # cancellation could interrupt.
        response, self._response = self._response, None
        if response is not None:
            response._settle(clean=exc_type is None)


class PoolSet:
    """EnginePools keyed by origin, created on first use.

    Keys are normalised to ``scheme://authority`` (case-folded; a path, query or trailing
    slash is ignored) so that ``discard(worker.base_url)`` finds the pool that
    ``get("scheme://authority")`` created. ``get`` itself still rejects a URL with a path, as
    ``EnginePool`` does: a pool is per origin, the path belongs in each request's target.
    """

    def __init__(
        self, *, max_idle: int = 16, idle_timeout: float = 60.0, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self._max_idle = max_idle
        self._idle_timeout = idle_timeout
        self._ssl_context = ssl_context
        self._pools: dict[str, EnginePool] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._pools)

    def __contains__(self, origin: object) -> bool:
        return isinstance(origin, str) and "://" in origin and origin_key(origin) in self._pools

    def get(self, origin: str) -> EnginePool:
        key = origin_key(origin)
        pool = self._pools.get(key)
        if pool is None:
            if self._closed:
                raise RuntimeError("the PoolSet is closed")
            https = key.startswith("https:")
            pool = EnginePool(
                origin,
                max_idle=self._max_idle,
                idle_timeout=self._idle_timeout,
                ssl_context=self._ssl_context if https else None,
            )
            self._pools[key] = pool
        return pool

    async def discard(self, origin: str) -> None:
        """Forget an engine's pool and close it (in-flight exchanges finish, then close)."""
        pool = self._pools.pop(origin_key(origin), None)
        if pool is not None:
            pool.close_idle()
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        self._closed = True
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close_idle()  # all synchronous, before the checkpoint (see EnginePool.close_idle)
        await trio.lowlevel.checkpoint()


def _parse_origin(origin: str) -> tuple[str, str, int, str]:
    """``scheme://host[:port]`` -> (scheme, host for connecting, port, authority for ``host:``)."""
    parts = urllib.parse.urlsplit(origin)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"engine origin must be http:// or https://, got {origin!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"engine origin must be scheme://host[:port] only, got {origin!r}")
    host = parts.hostname
    if not host:
        raise ValueError(f"engine origin has no host: {origin!r}")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"engine origin has an invalid port: {origin!r}") from None
    try:
        parts.netloc.encode("ascii")
    except UnicodeEncodeError:
        raise ValueError(f"engine origin must be ASCII (IDNA-encode it): {origin!r}") from None
    return scheme, host, port or (443 if scheme == "https" else 80), parts.netloc

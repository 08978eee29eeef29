"""EnginePool against small scripted trio servers on 127.0.0.1 that misbehave on purpose.

Every server here is a coroutine ``script(peer, index)`` run per accepted connection (``index``
counts connections from 0); the server records each raw request it reads. No test asserts on
wall-clock time: ``trio.fail_after`` only turns a would-be hang into a failure.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
from collections.abc import Awaitable, Callable
from functools import partial

import pytest
import trio

from smgrl.upstream import ConnectError, EnginePool, PoolSet, ProtocolError, ReadError, UpstreamError
from smgrl.upstream import connection as connection_module
from smgrl.upstream.connection import Connection

SAFETY = 10  # seconds before a hang becomes a failure; never reached when things work


class Peer:
    """The server's side of one connection, with a tiny request reader (head + content-length)."""

    def __init__(self, stream: trio.abc.Stream, server: Server) -> None:
        self.stream = stream
        self.server = server
        self._buffer = b""

    async def _fill(self) -> bool:
        data = await self.stream.receive_some(65536)
        self._buffer += data
        return bool(data)

    async def read_request(self) -> bytes | None:
        """The next raw request (head and body), or None if the client closed."""
        while b"\r\n\r\n" not in self._buffer:
            if not await self._fill():
                return None
        end = self._buffer.index(b"\r\n\r\n") + 4
        length = 0
        for line in self._buffer[:end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        while len(self._buffer) < end + length:
            if not await self._fill():
                return None
        request, self._buffer = self._buffer[: end + length], self._buffer[end + length :]
        self.server.requests.append(request)
        return request

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def wait_for_client_close(self) -> None:
        """Read and discard until the client closes (EOF or reset)."""
        try:
            while await self._fill():
                pass
        except trio.BrokenResourceError:
            pass
        self.server.client_closed += 1
        self.server.client_closed_event.set()


Script = Callable[[Peer, int], Awaitable[None]]


class Server:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.client_closed = 0
        self.client_closed_event = trio.Event()

    async def handle(self, stream: trio.abc.Stream) -> None:
        index = self.connections
        self.connections += 1
        try:
            await self.script(Peer(stream, self), index)
        except trio.BrokenResourceError:
            pass  # the client hung up on a misbehaving script: that is what the tests provoke


async def start(nursery: trio.Nursery, script: Script, host: str = "127.0.0.1") -> tuple[Server, str]:
    server = Server(script)
    listeners = await nursery.start(partial(trio.serve_tcp, server.handle, 0, host=host))
    port = listeners[0].socket.getsockname()[1]
    return server, f"http://{'[::1]' if host == '::1' else host}:{port}"


def ok(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + extra + b"content-length: %d\r\n\r\n" % len(body) + body


async def keep_alive(peer: Peer, index: int) -> None:
    """A well-behaved engine: answers every request with 200 "ok" until the client closes."""
    while await peer.read_request() is not None:
        await peer.send(ok())


async def cancel_when(event: trio.Event, scope: trio.CancelScope) -> None:
    await event.wait()
    scope.cancel()


def assert_settled(pool: EnginePool, idle: int = 0) -> None:
    assert pool.active_connections == 0
    assert pool.idle_connections == idle


# -- keep-alive ----------------------------------------------------------------------------------


async def test_sequential_requests_share_one_connection(nursery):
    server, origin = await start(nursery, keep_alive)
    pool = EnginePool(origin)
    for _ in range(10):
        response, body, truncated = await pool.request("POST", "/flush_cache")
        assert (response.status, body, truncated) == (200, b"ok", False)
    assert server.connections == 1
    assert len(server.requests) == 10
    assert pool.connections_opened == 1
    assert_settled(pool, idle=1)


async def test_a_request_larger_than_the_socket_buffer_arrives_whole(nursery):
    """Connection.send writes what the kernel takes at once and hands the rest to trio's
    send_all: 8 MiB (well past a loopback socket buffer) arrive byte for byte, twice on the
    same connection."""
    server, origin = await start(nursery, keep_alive)
    pool = EnginePool(origin)
    body = bytes(range(256)) * (8 * 4096)
    for _ in range(2):
        with trio.fail_after(SAFETY):
            response, answer, _ = await pool.request("POST", "/update_weights", body=body)
        assert (response.status, answer) == (200, b"ok")
    assert [r[r.index(b"\r\n\r\n") + 4 :] == body for r in server.requests] == [True, True]
    assert server.connections == 1
    assert_settled(pool, idle=1)


async def test_connection_returns_to_the_pool_when_the_body_ends_not_at_exit(nursery):
    server, origin = await start(nursery, keep_alive)
    pool = EnginePool(origin)
    async with pool.stream("GET", "/a") as response:
        assert await response.aread() == b"ok"
        assert_settled(pool, idle=1)
        # ...so a nested request to the same engine reuses it.
        _, body, _ = await pool.request("GET", "/b")
        assert body == b"ok"
    assert server.connections == 1


async def test_small_body_left_unread_but_already_received_keeps_the_connection(nursery):
    server, origin = await start(nursery, keep_alive)
    pool = EnginePool(origin)
    async with pool.stream("GET", "/status-only") as response:
        assert response.status == 200
    assert_settled(pool, idle=1)
    await pool.request("GET", "/again")
    assert server.connections == 1


async def test_idle_connections_are_reused_lifo_and_capped(nursery):
    arrived = trio.Event()

    async def hold_until_three(peer: Peer, index: int) -> None:
        while await peer.read_request() is not None:
            if peer.server.connections == 3:
                arrived.set()
            await arrived.wait()
            await peer.send(ok())

    server, origin = await start(nursery, hold_until_three)
    pool = EnginePool(origin, max_idle=2)
    async with trio.open_nursery() as inner:
        for _ in range(3):
            inner.start_soon(pool.request, "GET", "/")
    assert server.connections == 3
    assert_settled(pool, idle=2)


async def test_expired_idle_connections_are_closed_on_checkin(nursery):
    arrived = trio.Event()

    async def hold_until_two(peer: Peer, index: int) -> None:
        while await peer.read_request() is not None:
            if peer.server.connections == 2:
                arrived.set()
            await arrived.wait()
            await peer.send(ok())

    server, origin = await start(nursery, hold_until_two)
    pool = EnginePool(origin, idle_timeout=60)
    async with trio.open_nursery() as inner:
        for _ in range(2):
            inner.start_soon(pool.request, "GET", "/")
    assert_settled(pool, idle=2)
    pool._idle[0].idle_since -= 120  # the bottom of the stack has idled past the timeout
    await pool.request("GET", "/")  # reuses the top one; its checkin expires the bottom one
    assert_settled(pool, idle=1)
    assert server.connections == 2


async def test_idle_timeout_zero_never_reuses(nursery):
    server, origin = await start(nursery, keep_alive)
    pool = EnginePool(origin, idle_timeout=0)
    await pool.request("GET", "/")
    await pool.request("GET", "/")
    assert server.connections == 2
    assert_settled(pool)


# -- stale connections and the one retry ---------------------------------------------------------


async def test_engine_closing_an_idle_connection_is_noticed_before_reuse(nursery):
    closed = trio.Event()

    async def one_request_per_connection(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(ok(b"conn %d" % index))  # no "connection: close": a silent idle close
        await peer.stream.aclose()
        closed.set()

    server, origin = await start(nursery, one_request_per_connection)
    pool = EnginePool(origin)
    assert (await pool.request("GET", "/"))[1] == b"conn 0"
    with trio.fail_after(SAFETY):
        await closed.wait()
    # The FIN makes the idle socket readable: discarded at checkout, never written to.
    assert (await pool.request("GET", "/"))[1] == b"conn 1"
    assert server.connections == 2
    assert len(server.requests) == 2


async def test_unsolicited_bytes_on_an_idle_connection_discard_it(nursery):
    first_done = trio.Event()
    sent_garbage = trio.Event()

    async def chatty(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(ok(b"conn %d" % index))
        if index == 0:
            await first_done.wait()  # only once the connection is idle in the pool
            await peer.send(b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\n\r\n")
            sent_garbage.set()
            await peer.wait_for_client_close()

    server, origin = await start(nursery, chatty)
    pool = EnginePool(origin)
    assert (await pool.request("GET", "/"))[1] == b"conn 0"
    assert_settled(pool, idle=1)
    first_done.set()
    with trio.fail_after(SAFETY):
        await sent_garbage.wait()
        while not pool._idle[0].readable_while_idle():  # bounded by fail_after: loopback delivers at once
            await trio.sleep(0.001)
    response, body, _ = await pool.request("GET", "/")
    assert (response.status, body) == (200, b"conn 1")
    assert server.connections == 2


def _reset(peer: Peer) -> None:
    """Close the server's socket with an RST (SO_LINGER 0) instead of a FIN."""
    sock = peer.stream.socket
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()


async def test_reused_connection_closed_after_the_request_is_retried_once(nursery):
    async def first_survives_one_request(peer: Peer, index: int) -> None:
        if index == 0:
            await peer.read_request()
            await peer.send(ok(b"first"))
            await peer.read_request()  # the race: the engine closes just as our request lands
            return
        await keep_alive(peer, index)

    server, origin = await start(nursery, first_survives_one_request)
    pool = EnginePool(origin)
    assert (await pool.request("POST", "/a"))[1] == b"first"
    assert (await pool.request("POST", "/b"))[1] == b"ok"
    assert server.connections == 2
    assert [r.split(b" ")[1] for r in server.requests] == [b"/a", b"/b", b"/b"]
    assert_settled(pool, idle=1)


async def test_reused_connection_reset_before_the_write_is_retried(nursery, monkeypatch):
    reset = trio.Event()

    async def reset_after_one(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(ok(b"conn %d" % index))
        if index == 0:
            _reset(peer)  # the client's next write then fails outright
            reset.set()
        else:
            await keep_alive(peer, index)

    server, origin = await start(nursery, reset_after_one)
    pool = EnginePool(origin)
    await pool.request("GET", "/")
    with trio.fail_after(SAFETY):
        await reset.wait()
        while not pool._idle[0].readable_while_idle():
            await trio.sleep(0.001)
    # Lose the race on purpose: pretend the idle check saw nothing.
    monkeypatch.setattr(Connection, "readable_while_idle", lambda self: False)
    assert (await pool.request("GET", "/"))[1] == b"conn 1"
    assert server.connections == 2


async def test_reused_connection_reset_after_the_request_is_retried(nursery):
    async def reset_second_request(peer: Peer, index: int) -> None:
        if index == 0:
            await peer.read_request()
            await peer.send(ok(b"first"))
            await peer.read_request()
            _reset(peer)  # an RST instead of a FIN: the client's read fails rather than ends
            return
        await keep_alive(peer, index)

    server, origin = await start(nursery, reset_second_request)
    pool = EnginePool(origin)
    await pool.request("GET", "/")
    assert (await pool.request("GET", "/"))[1] == b"ok"
    assert server.connections == 2


async def test_failed_write_on_a_fresh_connection_is_a_connect_error(nursery, monkeypatch):
    server, origin = await start(nursery, keep_alive)

    def broken_write(fd: int, data: bytes) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    # Connection.send writes a plain TCP socket's fd directly (smgrl/upstream/connection.py).
    monkeypatch.setattr(connection_module, "_write", broken_write)
    pool = EnginePool(origin)
    with pytest.raises(ConnectError, match="cannot send"):
        await pool.request("POST", "/", body=b"x")
    assert server.connections == 1  # no retry: the connection was fresh
    assert_settled(pool)


@pytest.mark.parametrize("how", ["fin", "rst"])
async def test_fresh_connection_closed_without_an_answer_is_a_read_error_not_retried(nursery, how):
    async def hang_up(peer: Peer, index: int) -> None:
        await peer.read_request()
        if how == "rst":
            _reset(peer)

    server, origin = await start(nursery, hang_up)
    pool = EnginePool(origin)
    with pytest.raises(ReadError) as info:
        await pool.request("POST", "/update_weights")
    assert not isinstance(info.value, ProtocolError)
    assert server.connections == 1
    assert len(server.requests) == 1
    assert_settled(pool)


async def test_the_retry_happens_only_once(nursery):
    async def answer_once_then_hang_up(peer: Peer, index: int) -> None:
        if index == 0:
            await peer.read_request()
            await peer.send(ok())
        await peer.read_request()

    server, origin = await start(nursery, answer_once_then_hang_up)
    pool = EnginePool(origin)
    await pool.request("GET", "/")
    with pytest.raises(ReadError):
        await pool.request("GET", "/")
    assert server.connections == 2
    assert len(server.requests) == 3
    assert_settled(pool)


async def test_no_retry_once_a_response_byte_arrived(nursery):
    async def half_a_head(peer: Peer, index: int) -> None:
        if index == 0:
            await peer.read_request()
            await peer.send(ok())
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 O")

    server, origin = await start(nursery, half_a_head)
    pool = EnginePool(origin)
    await pool.request("GET", "/")
    with pytest.raises(ReadError):
        await pool.request("GET", "/")
    assert server.connections == 1
    assert_settled(pool)


# -- errors --------------------------------------------------------------------------------------


async def test_connection_refused_is_a_connect_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    pool = EnginePool(f"http://127.0.0.1:{port}")
    with pytest.raises(ConnectError) as info:
        await pool.request("GET", "/")
    assert f"127.0.0.1:{port}" in str(info.value)
    assert_settled(pool)
    assert pool.connections_opened == 0


async def test_malformed_response_is_a_protocol_error_and_the_connection_is_dropped(nursery):
    async def garbage(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\nhello")
        await peer.wait_for_client_close()

    server, origin = await start(nursery, garbage)
    pool = EnginePool(origin)
    with pytest.raises(ProtocolError):
        await pool.request("GET", "/")
    assert_settled(pool)
    with trio.fail_after(SAFETY):
        await server.client_closed_event.wait()


async def test_body_cut_short_is_a_read_error(nursery):
    async def short(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")

    _, origin = await start(nursery, short)
    pool = EnginePool(origin)
    async with pool.stream("GET", "/") as response:
        with pytest.raises(ReadError, match="7 bytes missing"):
            await response.aread()
        with pytest.raises(RuntimeError):
            await response.aread()  # the stream position is lost: no second try
    assert_settled(pool)


async def test_reset_inside_the_body_is_a_read_error(nursery):
    async def reset_midway(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
        _reset(peer)

    _, origin = await start(nursery, reset_midway)
    pool = EnginePool(origin)
    with pytest.raises(ReadError, match="broke inside the body"):
        await pool.request("GET", "/")
    assert_settled(pool)


async def test_malformed_body_left_unread_drops_the_connection(nursery):
    async def bad_chunk(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n")
        await peer.wait_for_client_close()

    server, origin = await start(nursery, bad_chunk)
    pool = EnginePool(origin)
    async with pool.stream("GET", "/") as response:
        assert response.status == 200
    assert_settled(pool)
    with trio.fail_after(SAFETY):
        await server.client_closed_event.wait()


async def test_errors_share_one_root():
    assert issubclass(ConnectError, UpstreamError)
    assert issubclass(ProtocolError, ReadError)
    assert issubclass(ReadError, UpstreamError)


# -- framing and status handling -----------------------------------------------------------------


async def test_connection_close_from_the_engine_is_honoured(nursery):
    async def closing(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(ok(extra=b"connection: close\r\n"))

    server, origin = await start(nursery, closing)
    pool = EnginePool(origin)
    await pool.request("GET", "/")
    assert_settled(pool)
    await pool.request("GET", "/")
    assert server.connections == 2


async def test_connection_close_from_the_caller_is_honoured(nursery):
    server, origin = await start(nursery, keep_alive)
    pool = EnginePool(origin)
    await pool.request("GET", "/", headers=[(b"connection", b"close")])
    assert_settled(pool)
    with trio.fail_after(SAFETY):
        await server.client_closed_event.wait() if server.client_closed else None
    await pool.request("GET", "/")
    assert server.connections == 2


async def test_http10_body_is_read_until_close(nursery):
    async def http10(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.0 200 OK\r\ncontent-type: text/plain\r\n\r\nuntil ")
        await peer.send(b"the end")

    _, origin = await start(nursery, http10)
    pool = EnginePool(origin)
    response, body, truncated = await pool.request("GET", "/")
    assert (response.http_version, body, truncated) == (b"1.0", b"until the end", False)
    assert_settled(pool)


async def test_http10_keep_alive_is_reused(nursery):
    async def http10(peer: Peer, index: int) -> None:
        while await peer.read_request() is not None:
            await peer.send(b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 2\r\n\r\nok")

    server, origin = await start(nursery, http10)
    pool = EnginePool(origin)
    for _ in range(3):
        assert (await pool.request("GET", "/"))[1] == b"ok"
    assert server.connections == 1


async def test_chunked_body_streams_as_it_arrives(nursery):
    first_seen = trio.Event()

    async def sse(peer: Peer, index: int) -> None:
        while await peer.read_request() is not None:
            await peer.send(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
                b"\r\n\r\n9;ext=1\r\ndata: 1\n\n\r\n"
            )
            await first_seen.wait()  # the second chunk exists only after the client saw the first
            await peer.send(b"9\r\ndata: 2\n\n\r\n0\r\nx-done: yes\r\n\r\n")

    _, origin = await start(nursery, sse)
    pool = EnginePool(origin)
    chunks = []
    async with pool.stream("POST", "/generate", body=b"{}") as response:
        assert response.header(b"content-type") == b"text/event-stream"
        with trio.fail_after(SAFETY):
            async for chunk in response.aiter_chunks():
                chunks.append(chunk)
                first_seen.set()
    assert chunks == [b"data: 1\n\n", b"data: 2\n\n"]
    assert response.trailers == [(b"x-done", b"yes")]
    assert_settled(pool, idle=1)


@pytest.mark.parametrize("framing", ["content-length", "chunked", "until-close"])
async def test_read_bounded_stops_early_on_a_huge_body_and_drops_the_connection(nursery, framing):
    total = 50 * 1024 * 1024
    block = b"x" * (1024 * 1024)
    progress = {"sent": 0}
    finished = trio.Event()

    async def huge(peer: Peer, index: int) -> None:
        await peer.read_request()
        head = {
            "content-length": b"content-length: %d\r\n" % total,
            "chunked": b"transfer-encoding: chunked\r\n",
            "until-close": b"",
        }[framing]
        await peer.send(b"HTTP/1.1 200 OK\r\n" + head + b"\r\n")
        try:
            while progress["sent"] < total:  # bounded: 50 blocks at most
                piece = b"100000\r\n" + block + b"\r\n" if framing == "chunked" else block
                await peer.send(piece)
                progress["sent"] += len(block)
        finally:
            finished.set()

    _, origin = await start(nursery, huge)
    pool = EnginePool(origin)
    async with pool.stream("GET", "/big") as response:
        body, truncated = await response.read_bounded(1024 * 1024)
        assert (len(body), truncated) == (1024 * 1024, True)
        assert_settled(pool)  # closed at once, not at context exit
    with trio.fail_after(SAFETY):
        await finished.wait()  # the server's send broke: we stopped reading and closed
    assert progress["sent"] < total


async def test_read_bounded_at_exactly_the_limit_is_not_truncated(nursery):
    server, origin = await start(nursery, keep_alive)
    pool = EnginePool(origin)
    _, body, truncated = await pool.request("GET", "/", limit=2)
    assert (body, truncated) == (b"ok", False)
    _, body, truncated = await pool.request("GET", "/", limit=1)
    assert (body, truncated) == (b"o", True)
    # The whole body had arrived with the head, so nothing is left to drain: the connection
    # is as good as after a full read and stays pooled (only an unfinished body drops it).
    assert_settled(pool, idle=1)
    await pool.request("GET", "/")
    assert server.connections == 1


async def test_head_request_has_no_body(nursery):
    async def with_length(peer: Peer, index: int) -> None:
        while (request := await peer.read_request()) is not None:
            if request.startswith(b"HEAD "):
                await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n")
            else:
                await peer.send(ok())

    server, origin = await start(nursery, with_length)
    pool = EnginePool(origin)
    response, body, _ = await pool.request("HEAD", "/")
    assert (response.header(b"content-length"), response.header(b"x-absent"), body) == (b"1000", None, b"")
    assert repr(response) == f"<Response 200 'OK' from {origin}>"
    assert (await pool.request("GET", "/"))[1] == b"ok"
    assert server.connections == 1


@pytest.mark.parametrize("status", [b"204 No Content", b"304 Not Modified"])
async def test_bodyless_statuses(nursery, status):
    async def bodyless(peer: Peer, index: int) -> None:
        while await peer.read_request() is not None:
            await peer.send(b"HTTP/1.1 " + status + b"\r\ncontent-length: 3\r\n\r\n")

    server, origin = await start(nursery, bodyless)
    pool = EnginePool(origin)
    for _ in range(2):
        response, body, _ = await pool.request("GET", "/")
        assert (response.status, body) == (int(status[:3]), b"")
    assert server.connections == 1


async def test_interim_responses_are_skipped(nursery):
    async def interim(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        await peer.send(b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n" + ok(b"final"))

    _, origin = await start(nursery, interim)
    pool = EnginePool(origin)
    response, body, _ = await pool.request("POST", "/", headers=[(b"expect", b"100-continue")], body=b"x")
    assert (response.status, response.reason, body) == (200, b"OK", b"final")


async def test_redirects_are_not_followed(nursery):
    async def redirect(peer: Peer, index: int) -> None:
        while await peer.read_request() is not None:
            await peer.send(
                b"HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:1/x\r\n"
                b"content-length: 0\r\n\r\n"
            )

    server, origin = await start(nursery, redirect)
    pool = EnginePool(origin)
    response, body, _ = await pool.request("POST", "/flush_cache")
    assert (response.status, response.header(b"location"), body) == (307, b"http://127.0.0.1:1/x", b"")
    assert len(server.requests) == 1


async def test_headers_are_sent_exactly(nursery):
    server, origin = await start(nursery, keep_alive)
    authority = origin.removeprefix("http://").encode()
    pool = EnginePool(origin)
    await pool.request("GET", "/v1/models?x=%2F", headers=[(b"accept", b"*/*")])
    await pool.request("POST", "/flush_cache")
    await pool.request("POST", "/update", headers=[(b"content-type", b"application/json")], body=b"{}")
    assert server.requests == [
        b"GET /v1/models?x=%2F HTTP/1.1\r\nhost: " + authority + b"\r\naccept: */*\r\n\r\n",
        b"POST /flush_cache HTTP/1.1\r\nhost: " + authority + b"\r\n\r\n",
        b"POST /update HTTP/1.1\r\nhost: " + authority + b"\r\ncontent-type: application/json\r\n"
        b"content-length: 2\r\n\r\n{}",
    ]


async def test_ipv6_literal_origin(nursery):
    try:
        server, origin = await start(nursery, keep_alive, host="::1")
    except OSError:
        pytest.skip("no IPv6 loopback")
    pool = EnginePool(origin)
    await pool.request("GET", "/")
    assert server.requests[0].split(b"\r\n")[1] == b"host: " + origin.removeprefix("http://").encode()


# -- cancellation --------------------------------------------------------------------------------


async def test_cancel_during_connect(nursery, monkeypatch):
    _, origin = await start(nursery, keep_alive)
    connecting = trio.Event()
    real_open = trio.open_tcp_stream

    async def stuck_open(host: str, port: int) -> trio.SocketStream:
        connecting.set()
        await trio.sleep_forever()
        return await real_open(host, port)  # pragma: no cover

    monkeypatch.setattr(trio, "open_tcp_stream", stuck_open)
    pool = EnginePool(origin)
    with trio.CancelScope() as scope:
        nursery.start_soon(cancel_when, connecting, scope)
        await pool.request("GET", "/")
    assert scope.cancelled_caught
    assert_settled(pool)
    assert pool.connections_opened == 0
    monkeypatch.undo()
    assert (await pool.request("GET", "/"))[1] == b"ok"


async def test_cancel_during_tls_handshake_closes_the_socket(nursery):
    hello = trio.Event()

    async def silent(peer: Peer, index: int) -> None:
        await peer._fill()  # the ClientHello
        hello.set()
        await peer.wait_for_client_close()

    server, origin = await start(nursery, silent)
    pool = EnginePool(origin.replace("http://", "https://"))
    with trio.CancelScope() as scope:
        nursery.start_soon(cancel_when, hello, scope)
        await pool.request("GET", "/")
    assert scope.cancelled_caught
    assert_settled(pool)
    with trio.fail_after(SAFETY):
        await server.client_closed_event.wait()


async def test_cancel_while_waiting_for_the_head(nursery):
    waiting = trio.Event()

    async def slow_first(peer: Peer, index: int) -> None:
        if index == 0:
            await peer.read_request()
            waiting.set()
            await peer.wait_for_client_close()
        else:
            await keep_alive(peer, index)

    server, origin = await start(nursery, slow_first)
    pool = EnginePool(origin)
    with trio.CancelScope() as scope:
        nursery.start_soon(cancel_when, waiting, scope)
        await pool.request("GET", "/slow")
    assert scope.cancelled_caught
    assert_settled(pool)
    with trio.fail_after(SAFETY):
        await server.client_closed_event.wait()
    assert (await pool.request("GET", "/"))[1] == b"ok"
    assert server.connections == 2


async def test_cancel_while_reading_the_body(nursery):
    partway = trio.Event()

    async def stalls_midway(peer: Peer, index: int) -> None:
        if index == 0:
            await peer.read_request()
            await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nfirst part")
            partway.set()
            await peer.wait_for_client_close()
        else:
            await keep_alive(peer, index)

    server, origin = await start(nursery, stalls_midway)
    pool = EnginePool(origin)
    async with pool.stream("GET", "/") as response:
        with trio.CancelScope() as scope:
            nursery.start_soon(cancel_when, partway, scope)
            await response.aread()
        assert scope.cancelled_caught
        assert_settled(pool)  # dropped at once, inside the block
        with pytest.raises(RuntimeError):
            await response.aread()
    assert_settled(pool)
    with trio.fail_after(SAFETY):
        await server.client_closed_event.wait()
    assert (await pool.request("GET", "/"))[1] == b"ok"


@pytest.mark.parametrize("exit_by", ["exception", "leaving the block"])
async def test_body_in_flight_at_exit_drops_the_connection(nursery, exit_by):
    started = trio.Event()

    async def endless(peer: Peer, index: int) -> None:
        await peer.read_request()
        await peer.send(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n")
        started.set()
        await peer.wait_for_client_close()

    server, origin = await start(nursery, endless)
    pool = EnginePool(origin)
    with pytest.raises(KeyError) if exit_by == "exception" else contextlib.nullcontext():
        async with pool.stream("GET", "/"):
            if exit_by == "exception":
                raise KeyError("caller bug")
    assert_settled(pool)
    with trio.fail_after(SAFETY):
        await server.client_closed_event.wait()


async def test_many_cancelled_exchanges_leak_nothing(nursery):
    async def never_answers(peer: Peer, index: int) -> None:
        await peer.wait_for_client_close()

    server, origin = await start(nursery, never_answers)
    pool = EnginePool(origin)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as inner:
            for _ in range(20):
                inner.start_soon(pool.request, "GET", "/")
            with trio.fail_after(SAFETY):
                while server.connections < 20:  # bounded by fail_after
                    await trio.sleep(0.001)
            scope.cancel()
    assert_settled(pool)


# -- closing -------------------------------------------------------------------------------------


async def test_aclose_closes_idle_and_in_flight_connections(nursery):
    in_flight = trio.Event()
    release = trio.Event()

    async def script(peer: Peer, index: int) -> None:
        while await peer.read_request() is not None:
            if index == 1:
                in_flight.set()
                await release.wait()
            await peer.send(ok())
        peer.server.client_closed += 1

    server, origin = await start(nursery, script)
    pool = EnginePool(origin)
    await pool.request("GET", "/")  # leaves connection 0 idle
    async with pool.stream("GET", "/") as _:  # reuses connection 0
        pass
    assert pool.idle_connections == 1

    async def in_flight_request() -> None:
        async with pool.stream("GET", "/") as response:
            await response.aread()

    async with trio.open_nursery() as inner:
        # Take the idle connection away first so the in-flight request opens connection 1.
        async with pool.stream("GET", "/") as response:
            inner.start_soon(in_flight_request)
            with trio.fail_after(SAFETY):
                await in_flight.wait()
            await response.aread()
        await pool.aclose()
        assert pool.closed and pool.idle_connections == 0
        release.set()
    assert_settled(pool)
    with pytest.raises(ConnectError, match="closed"):
        await pool.request("GET", "/")
    with trio.fail_after(SAFETY):
        while server.client_closed < 2:
            await trio.sleep(0.001)


async def test_poolset(nursery):
    _, origin_a = await start(nursery, keep_alive)
    _, origin_b = await start(nursery, keep_alive)
    pools = PoolSet(max_idle=4)
    assert pools.get(origin_a) is pools.get(origin_a)
    assert pools.get(origin_a) is not pools.get(origin_b)
    assert len(pools) == 2 and origin_a in pools
    await pools.get(origin_a).request("GET", "/")
    first = pools.get(origin_a)
    await pools.discard(origin_a)
    await pools.discard(origin_a)  # unknown origins are fine
    assert first.closed and origin_a not in pools
    assert pools.get(origin_a) is not first
    # Keys are per origin: a base URL with a path or a trailing slash names the same pool.
    second = pools.get(origin_a)
    assert pools.get(origin_a.upper().replace("HTTP:", "http:")) is second
    assert origin_a + "/" in pools
    await pools.discard(origin_a.upper() + "/some/base/")
    assert second.closed and len(pools) == 1
    with pytest.raises(ValueError):
        pools.get(origin_a + "/with/a/path")
    await pools.aclose()
    with pytest.raises(RuntimeError):
        pools.get(origin_a)


@pytest.mark.parametrize(
    "origin",
    [
        "ftp://127.0.0.1:1",
        "http://127.0.0.1:1/path",
        "http://127.0.0.1:1?q",
        "http://user@127.0.0.1:1",
        "http://:80",
        "http://h:99999",
        "http://\u00e9t\u00e9.example",
    ],
)
async def test_bad_origins(origin):
    with pytest.raises(ValueError):
        EnginePool(origin)


async def test_bad_arguments():
    with pytest.raises(ValueError, match="ssl_context"):
        EnginePool("http://127.0.0.1:1", ssl_context=ssl.create_default_context())
    pool = EnginePool("http://127.0.0.1:1/")
    assert pool.origin == "http://127.0.0.1:1"
    assert repr(pool) == "<EnginePool http://127.0.0.1:1 idle=0 active=0>"
    with pytest.raises(ValueError, match="CONNECT"):
        pool.stream("CONNECT", "127.0.0.1:1")
    with pytest.raises(ValueError, match="set by the client"):
        await pool.request("POST", "/", headers=[(b"content-length", b"1")], body=b"x")
    assert_settled(pool)


# -- TLS -----------------------------------------------------------------------------------------


@pytest.fixture
def tls_pair(tmp_path):
    """A self-signed certificate for 127.0.0.1: (server context, client context)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not available")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    return server, ssl.create_default_context(cafile=str(cert))


async def test_https_keep_alive_and_handshake_failure(nursery, tls_pair):
    server_context, client_context = tls_pair
    server = Server(keep_alive)
    listeners = await nursery.start(
        partial(
            trio.serve_ssl_over_tcp, server.handle, 0, server_context, host="127.0.0.1", https_compatible=True
        )
    )
    origin = f"https://127.0.0.1:{listeners[0].transport_listener.socket.getsockname()[1]}"
    pool = EnginePool(origin, ssl_context=client_context)
    for _ in range(3):
        assert (await pool.request("GET", "/"))[1] == b"ok"
    assert pool.connections_opened <= 2  # a late TLS session ticket may retire the first one
    untrusting = EnginePool(origin)  # default context: the self-signed certificate is refused
    with pytest.raises(ConnectError, match="TLS"):
        await untrusting.request("GET", "/")
    assert_settled(untrusting)

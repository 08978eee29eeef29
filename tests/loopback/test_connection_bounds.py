"""SMG's connection bounds on the gateway's listener (``--header-read-timeout-secs``,
``--idle-connection-timeout-secs``), on a real smgrl server on 127.0.0.1: raw sockets, so the
half-sent heads are really half-sent.

Measured on SMG 1.13.0 (header 2 s, idle 4 s): a connection that sends nothing, a half head or a
head trickled byte by byte is closed 2 s after the accept; a keep-alive connection idle after its
answer 4 s after it; a keep-alive connection whose next head stalls 2 s after its first byte.
Each close is silent (no answer). The waits below are for the server's close (an event), bounded
by ``fail_after``; a connection that must survive is checked against a probe connection whose
close proves the bound has passed."""

import pytest
import trio

from journal import MemoryStore
from smgrl.core.config import Config, HealthConfig, RlConfig
from smgrl.core.errors import ConfigError
from smgrl.http.routes import stream as stream_api
from smgrl.runtime.server import serve
from tests.loopback.server_kit import read_until_closed

SHORT = 0.3  # the bound under test
LONG = 60.0  # a bound that must not be the one closing the connection
HEALTH = b"GET /health HTTP/1.1\r\nhost: t\r\n\r\n"


async def start(nursery, *, header: float, idle: float):
    cfg = Config(
        rl=RlConfig(enabled=True),
        port=0,
        prometheus_port=None,
        health=HealthConfig(enabled=False),
        shutdown_grace_period_secs=0,
        header_read_timeout_secs=header,
        idle_connection_timeout_secs=idle,
    )
    shutdown = trio.Event()
    running = await nursery.start(
        lambda task_status: serve(cfg, shutdown=shutdown, store=MemoryStore(), task_status=task_status)
    )
    port = int(running.urls[0].rsplit(":", 1)[1])
    return port, shutdown


async def answer(stream, request: bytes) -> bytes:
    await stream.send_all(request)
    buf = b""
    with trio.fail_after(10):
        while b"\r\n\r\n" not in buf:
            chunk = await stream.receive_some(65536)
            assert chunk, "closed before an answer"
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        while len(rest) < length:
            rest += await stream.receive_some(65536)
    return head.split(b"\r\n")[0]


@pytest.mark.parametrize("sent", [b"", b"GET /health HTTP/1.1\r\nhost: t\r\n"], ids=["nothing", "half-head"])
async def test_a_connection_without_a_complete_head_is_closed_silently_after_the_header_read_bound(sent):
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, header=SHORT, idle=LONG)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(sent)
        assert await read_until_closed(stream) == b""  # closed, no answer (as SMG)
        shutdown.set()


async def test_a_head_trickled_byte_by_byte_is_bounded_from_the_accept():
    """Progress does not extend the first head's bound (a slowloris client is cut)."""
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, header=SHORT, idle=LONG)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        head = b"GET /health HTTP/1.1\r\nhost: t\r\nx-pad: " + b"a" * 1000
        with trio.fail_after(10):
            for i in range(len(head)):
                try:
                    await stream.send_all(head[i : i + 1])
                except trio.BrokenResourceError:
                    break
                with trio.move_on_after(SHORT / 10):  # pacing of the client, not a wait for the server
                    if await stream.receive_some(100) == b"":
                        break
            else:
                pytest.fail("a head trickled for longer than the bound was not cut")
        shutdown.set()


async def test_a_keep_alive_connection_is_closed_after_the_idle_bound_not_the_header_one():
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, header=LONG, idle=SHORT)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        assert (await answer(stream, HEALTH)).startswith(b"HTTP/1.1 200")
        assert await read_until_closed(stream) == b""
        shutdown.set()


async def test_the_next_head_on_a_keep_alive_connection_has_the_header_read_bound():
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, header=SHORT, idle=LONG)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        assert (await answer(stream, HEALTH)).startswith(b"HTTP/1.1 200")
        # Served and idle: the header bound no longer applies until bytes of a next head come.
        probe = await trio.open_tcp_stream("127.0.0.1", port)  # accepted after the answer
        assert await read_until_closed(probe) == b""
        await stream.send_all(b"GET /health HTTP/1.1\r\n")
        assert await read_until_closed(stream) == b""
        shutdown.set()


async def test_a_slow_but_progressing_body_is_not_cut_by_either_bound():
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, header=SHORT, idle=SHORT)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        body = b'{"text": "hello", "sampling_params": {"max_new_tokens": 1}}'
        await stream.send_all(b"POST /generate HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n" % len(body))
        await stream.send_all(body[:10])
        # Both bounds have passed for the request once a connection opened after it is closed
        # (the probe's idle bound, header bound and the request's start all equal SHORT).
        for bound in ("header", "idle"):
            probe = await trio.open_tcp_stream("127.0.0.1", port)
            if bound == "idle":
                await answer(probe, HEALTH)
            assert await read_until_closed(probe) == b""
        status = await answer(stream, body[10:])
        assert status.startswith(b"HTTP/1.1 ")  # the gateway answered (no worker: an error answer)
        assert (await answer(stream, HEALTH)).startswith(b"HTTP/1.1 200")  # and kept the connection
        shutdown.set()


async def test_an_idle_sse_stream_is_not_cut(monkeypatch):
    """The journal stream sends nothing while the journal is quiet (but a keep-alive comment);
    an open stream is a request in flight, never idle."""
    monkeypatch.setattr(stream_api, "KEEPALIVE_SECS", SHORT * 4)
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, header=SHORT, idle=SHORT)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /v1/rl/journal/stream HTTP/1.1\r\nhost: t\r\n\r\n")
        received = b""
        with trio.fail_after(10):
            # Two keep-alive comments: the stream outlived both bounds (SHORT) several times.
            while received.count(b": keepalive") < 2:
                chunk = await stream.receive_some(65536)
                assert chunk, "the SSE stream was closed"
                received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        shutdown.set()


@pytest.mark.parametrize("field", ["header_read_timeout_secs", "idle_connection_timeout_secs"])
def test_a_negative_bound_is_refused(field):
    from smgrl.runtime.startup import validate

    with pytest.raises(ConfigError, match=field.replace("_", "-").removesuffix("-secs")):
        validate(Config(**{field: -1.0}))

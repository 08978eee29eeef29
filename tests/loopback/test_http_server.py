"""smgrl's HTTP/1.1 server (``smgrl.http.server``) on its own, on 127.0.0.1: what the wire
differential and the patches' behaviour tests (which run on it too) do not reach."""

import pytest
import trio

from smgrl.http.server import connection as server_connection
from tests.loopback.server_kit import lifespan, start_server

GET = b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n"


async def ok_app(scope, receive, send):
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def start(nursery, app=ok_app):
    return await start_server(nursery, app, grace=2)


async def get(port: int) -> bytes:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    with trio.fail_after(5):
        await stream.send_all(GET)
        answer = b""
        while not answer.endswith(b"ok"):
            data = await stream.receive_some(1024)
            assert data, answer
            answer += data
    await stream.aclose()
    return answer


@pytest.mark.parametrize("where", ["construction", "run"])
async def test_a_connection_that_fails_is_closed_and_the_server_serves_on(monkeypatch, where):
    """A connection gone before it is served (getpeername raising ENOTCONN), or a bug in one
    connection, ends that connection only: the listener's nursery holds every connection."""
    failures = []
    if where == "construction":
        real = server_connection._addr

        def failing_addr(name):
            if not failures:
                failures.append(name)
                raise OSError(107, "Transport endpoint is not connected")
            return real(name)

        monkeypatch.setattr(server_connection, "_addr", failing_addr)
    else:
        real_run = server_connection.ClientConnection.run

        async def failing_run(self):
            if not failures:
                failures.append(self)
                raise RuntimeError("a bug in one connection")
            await real_run(self)

        monkeypatch.setattr(server_connection.ClientConnection, "run", failing_run)
    async with trio.open_nursery() as nursery:
        port, stop = await start(nursery)
        first = await trio.open_tcp_stream("127.0.0.1", port)
        with trio.fail_after(5):
            await first.send_all(GET)
            assert await first.receive_some(1024) == b""  # closed without an answer
        assert failures
        assert (await get(port)).startswith(b"HTTP/1.1 200 ")
        stop.set()


async def test_an_interrupt_beside_an_app_error_is_not_swallowed(caplog):
    """An app whose task ends with its own error and a BaseException beside it (an interrupt, or
    trio's Cancelled) in one group: the error is logged with the request, the rest goes on up."""

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            return await ok_app(scope, receive, send)
        raise BaseExceptionGroup("app", [ValueError("bad"), KeyboardInterrupt()])

    with pytest.raises(BaseExceptionGroup) as info:
        async with trio.open_nursery() as nursery:
            port, _stop = await start(nursery, app)
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(GET)
            with trio.fail_after(5):
                await trio.sleep_forever()
    assert info.value.subgroup(KeyboardInterrupt) is not None
    assert info.value.subgroup(trio.TooSlowError) is None
    assert "error in the ASGI application (GET /x)" in caplog.text

"""hypercorn with smgrl's patches still speaks correct HTTP/1.1 and keeps its keep-alive rules.

Real sockets on 127.0.0.1; the raw bytes on the wire are checked."""

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from smgrl import hypercorn_patches


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if scope["path"] == "/stream":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        for part in (b"one", b"two", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    if scope["path"] == "/empty":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    payload = b"echo:" + body
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def read_response(stream, buf=b"", head_only=False):
    with trio.fail_after(5):
        while b"\r\n\r\n" not in buf:
            chunk = await stream.receive_some(65536)
            assert chunk, "connection closed before a response head"
            buf += chunk
        raw_head, _, rest = buf.partition(b"\r\n\r\n")
        lines = raw_head.split(b"\r\n")
        headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
        if head_only:
            return lines[0], headers, b"", rest
        if b"content-length" in headers:
            n = int(headers[b"content-length"])
            while len(rest) < n:
                rest += await stream.receive_some(65536)
            return lines[0], headers, rest[:n], rest[n:]
        if headers.get(b"transfer-encoding") == b"chunked":
            while not rest.endswith(b"0\r\n\r\n"):
                rest += await stream.receive_some(65536)
            return lines[0], headers, rest, b""
        return lines[0], headers, b"", rest


async def start(nursery, keep_alive=5.0):
    assert hypercorn_patches.apply()
    cfg = Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.keep_alive_timeout = keep_alive
    cfg.accesslog = None
    cfg.errorlog = None
    shutdown = trio.Event()
    urls = await nursery.start(
        lambda task_status: serve(app, cfg, shutdown_trigger=shutdown.wait, task_status=task_status)
    )
    port = int(urls[0].rsplit(":", 1)[1])
    return port, shutdown


async def test_requests_on_one_connection_head_and_body_arrive_together():
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        for i in range(3):
            body = f"n{i}".encode()
            await stream.send_all(
                b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
            status, headers, payload, rest = await read_response(stream)
            assert status == b"HTTP/1.1 200 " or status.startswith(b"HTTP/1.1 200")
            assert payload == b"echo:" + body and rest == b""
        await stream.send_all(b"HEAD /x HTTP/1.1\r\nhost: t\r\n\r\n")
        status, headers, payload, _ = await read_response(stream, head_only=True)
        assert status.startswith(b"HTTP/1.1 200") and payload == b"" and headers[b"content-length"] == b"5"
        await stream.send_all(b"GET /empty HTTP/1.1\r\nhost: t\r\n\r\n")
        status, headers, payload, _ = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 204")
        await stream.send_all(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
        status, headers, payload, _ = await read_response(stream)
        assert headers[b"transfer-encoding"] == b"chunked"
        assert payload == b"3\r\none\r\n3\r\ntwo\r\n5\r\nthree\r\n0\r\n\r\n"
        await stream.aclose()
        shutdown.set()


async def test_idle_connections_close_after_keep_alive_and_busy_ones_do_not():
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, keep_alive=0.3)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
        await read_response(stream)
        with trio.fail_after(5):
            assert await stream.receive_some(10) == b""  # closed by the server once idle
        shutdown.set()


async def test_graceful_shutdown_closes_idle_connections():
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, keep_alive=60)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
        await read_response(stream)
        shutdown.set()
        with trio.fail_after(5):
            assert await stream.receive_some(10) == b""

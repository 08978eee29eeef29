"""hypercorn with smgrl's patches still speaks correct HTTP/1.1 and keeps its keep-alive rules,
and each patch does what it claims (these tests fail on stock hypercorn 0.18.0, except where a
test says it guards the patch itself). Every behaviour test runs twice: on the patched hypercorn
and on smgrl's own server (``smgrl.http.server``, the gateway's listener), which keeps each of
these behaviours; a test of hypercorn's own internals says so and runs on hypercorn only.

Real sockets on 127.0.0.1; the raw bytes on the wire are checked."""

import hashlib
import inspect
import os

import pytest
import trio
import trio.testing
from hypercorn.config import Config
from hypercorn.trio import serve
from quart_trio import QuartTrio

from smgrl.http import hypercorn_patches
from smgrl.http.server import connection as smgrl_connection
from tests.loopback.server_kit import lifespan, start_server

SERVERS = ["patched hypercorn", "smgrl server"]
_server = {"kind": SERVERS[0]}


@pytest.fixture(autouse=True, params=SERVERS)
def server_kind(request):
    """Which server ``start`` starts (each test runs on both)."""
    _server["kind"] = request.param
    yield request.param
    _server["kind"] = SERVERS[0]


def server_module():
    """The module holding the server's own bounds and socket calls (``DRAIN_*``, ``_write``)."""
    return hypercorn_patches if _server["kind"] == SERVERS[0] else smgrl_connection


def hypercorn_only(kind: str) -> None:
    """A test of hypercorn's own internals (or of the patches as code): not smgrl's server."""
    if kind != SERVERS[0]:
        pytest.skip("tests hypercorn's own internals")


SLOW_SECS = 2.0
TOO_LARGE = b'{"error":"too large"}'
BIG = bytes(range(256)) * (16 * 1024)  # 4 MiB, no two neighbouring KiB alike


async def early_413(send) -> None:
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(TOO_LARGE)).encode())]
    await send({"type": "http.response.start", "status": 413, "headers": head})
    await send({"type": "http.response.body", "body": TOO_LARGE})


async def app(scope, receive, send):
    if scope["type"] == "http" and scope["path"] == "/early":
        await early_413(send)  # answered before a byte of the body is read
        return
    if scope["type"] == "http" and scope["path"] == "/late":
        # Answered without reading, once the unread body filled hypercorn's queue to the app.
        await trio.testing.wait_all_tasks_blocked()
        await early_413(send)
        return
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if scope["path"] == "/split":
        # The head, then (once every task, the client's included, waits) the body: stock
        # hypercorn has written the head alone by then.
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"4")]})
        await trio.testing.wait_all_tasks_blocked()
        await send({"type": "http.response.body", "body": b"body"})
        return
    if scope["path"] == "/slow":
        await trio.sleep(SLOW_SECS)  # the work this request models: longer than keep-alive
    if scope["path"] == "/stream":
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        for part in (b"one", b"two", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return
    if scope["path"] == "/big":
        # More than the socket buffers hold: the direct write takes part, send_all the rest.
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(BIG))]}
        )
        await send({"type": "http.response.body", "body": BIG})
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


async def start(nursery, keep_alive=5.0, asgi=None):
    if _server["kind"] != SERVERS[0]:
        return await start_smgrl(nursery, keep_alive, asgi)
    assert hypercorn_patches.apply()
    cfg = Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.keep_alive_timeout = keep_alive
    cfg.accesslog = None
    cfg.errorlog = None
    shutdown = trio.Event()
    urls = await nursery.start(
        lambda task_status: serve(asgi or app, cfg, shutdown_trigger=shutdown.wait, task_status=task_status)
    )
    port = int(urls[0].rsplit(":", 1)[1])
    return port, shutdown


async def start_smgrl(nursery, keep_alive, asgi):
    return await start_server(nursery, asgi or app, keep_alive=keep_alive)


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


# -- the pin -------------------------------------------------------------------------------------


def test_every_replaced_hypercorn_function_is_the_pinned_stock_source():
    """An upgrade (or a distro patch) of hypercorn changes one of these sources: the patches were
    written against exactly these, so it must fail here, loudly, before anything runs on it."""
    replaced = {
        f"{owner.__module__}.{owner.__qualname__}.{name}"
        for owner, name, _ in hypercorn_patches._replacements()
    }
    assert replaced <= set(hypercorn_patches.STOCK_SOURCES) | hypercorn_patches.ADDED
    # An added attribute must not replace a stock one.
    assert not any(hypercorn_patches.STOCK_DEFINES.values()), hypercorn_patches.STOCK_DEFINES
    for qualname, digest in hypercorn_patches.STOCK_SOURCES.items():
        source = inspect.getsource(hypercorn_patches.stock_function(qualname))
        assert hashlib.sha256(source.encode()).hexdigest()[:16] == digest, f"{qualname} changed upstream"


# -- what each patch does (fails on stock hypercorn) -----------------------------------------------


async def test_one_recv_carries_the_head_and_the_body():
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /split HTTP/1.1\r\nhost: t\r\n\r\n")
        with trio.fail_after(5):
            first = await stream.receive_some(65536)
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"\r\n\r\nbody")
        await stream.aclose()
        shutdown.set()


class _Spawns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task) -> None:
        self.count += 1


async def test_a_keep_alive_connection_spawns_only_the_app_task_per_request():
    """Stock hypercorn also starts a new keep-alive task per request (lock, cancel, nursery.start);
    the patched one keeps one watcher per connection."""
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
        await read_response(stream)
        spawns = _Spawns()
        trio.lowlevel.add_instrument(spawns)
        try:
            for _ in range(20):
                await stream.send_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
                status, _, payload, _ = await read_response(stream)
                assert status.startswith(b"HTTP/1.1 200") and payload == b"echo:"
        finally:
            trio.lowlevel.remove_instrument(spawns)
        assert spawns.count == 20
        await stream.aclose()
        shutdown.set()


async def test_a_busy_connection_is_not_closed_by_the_idle_watcher():
    """Guards the watcher itself (stock hypercorn passes too): a request that takes longer than
    keep_alive_timeout must get its answer, and the connection must serve the next one."""
    async with trio.open_nursery() as nursery:
        # Keep-alive well under the slow request, but long enough that a busy test machine
        # never lets it expire between one request and the next.
        port, shutdown = await start(nursery, keep_alive=SLOW_SECS / 2)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        for path in (b"/slow", b"/x"):
            await stream.send_all(b"GET %s HTTP/1.1\r\nhost: t\r\n\r\n" % path)
            status, _, payload, _ = await read_response(stream)
            assert status.startswith(b"HTTP/1.1 200") and payload == b"echo:"
        # The idle bound passed while /slow was in flight (the watcher woke and kept waiting);
        # once idle again the connection has a fresh bound, and it closes.
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""
        await stream.aclose()
        shutdown.set()


def _live_tasks() -> int:
    count = 0

    def walk(task) -> None:
        nonlocal count
        count += 1
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    walk(trio.lowlevel.current_root_task())
    return count


async def test_a_connection_whose_client_left_mid_request_leaves_no_task_behind():
    """A rollout client that gives up while its request is in flight: its connection's tasks
    must end (the first idle watcher held them until shutdown)."""
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, keep_alive=60)
        await trio.testing.wait_all_tasks_blocked()
        before = _live_tasks()
        for _ in range(3):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            # A body promised and never sent: the app waits in receive() until the disconnect.
            await stream.send_all(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\n")
            await trio.testing.wait_all_tasks_blocked()
            await stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        assert _live_tasks() == before
        shutdown.set()


async def _send_body_slowly_then_read(port: int, path: bytes, total: int) -> bytes:
    """A client that sends its whole body, in pieces, after the head, and only then reads: as
    urllib3/requests do. Returns everything the server sent up to its close."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    piece = b"x" * 65536
    with trio.fail_after(30):
        await stream.send_all(b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n" % (path, total))
        for _ in range(total // len(piece)):
            await stream.send_all(piece)  # a reset here: the answer is lost to this client
            await trio.sleep(0.002)  # pacing: a client on a slower link
        received = b""
        while chunk := await stream.receive_some(65536):
            received += chunk
    await stream.aclose()
    return received


@pytest.mark.parametrize("path", [b"/early", b"/late"])
async def test_an_answer_sent_before_the_body_is_read_reaches_a_client_still_sending(path):
    """RFC 9112 section 9.6: half-close, drain, then close. Stock hypercorn closed with the body
    unread, the kernel reset the connection, and the client's next send failed (/early); when
    the unread body had filled the app's queue first, the connection never closed at all (/late)."""
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        received = await _send_body_slowly_then_read(port, path, 2 * 1024 * 1024)
        head, _, body = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413") and body == TOO_LARGE
        shutdown.set()


async def test_the_drain_is_bounded_in_bytes(monkeypatch):
    monkeypatch.setattr(server_module(), "DRAIN_BYTES", 256 * 1024)
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 100000000\r\n\r\n")
        status, _, payload, rest = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 413") and payload == TOO_LARGE
        with trio.fail_after(10):
            assert rest + await stream.receive_some(100) == b""  # our half-close
            sent = 0
            try:
                while sent < 64 * 1024 * 1024:
                    await stream.send_all(b"x" * 65536)
                    sent += 65536
            except trio.BrokenResourceError:
                pass  # closed once the bound was read: the rest is refused
        assert 256 * 1024 <= sent < 64 * 1024 * 1024
        shutdown.set()


async def test_an_early_quart_answer_with_the_body_still_to_come_closes_the_connection():
    """The keep-alive hang (docs/hypercorn-patches.md): quart-trio answers a POST to an unknown
    URL before its body arrives, then cancels the app task; stock hypercorn's close was cancelled
    with it, and the connection neither closed nor served its next request."""
    quart = QuartTrio("t")
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, asgi=quart)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /nope HTTP/1.1\r\nhost: t\r\ncontent-length: 8\r\n\r\n")
        status, _, _, rest = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 404")
        await stream.send_all(b'{"a": 1}')  # the body, after the answer
        with trio.fail_after(5):
            assert rest + await stream.receive_some(100) == b""  # closed, not wedged
        await stream.aclose()
        shutdown.set()


async def test_an_answer_sent_before_the_body_arrived_says_the_connection_closes():
    """RFC 9112 section 9.6: a server that will close after its answer says `connection: close`.
    An answer that starts before the request body has arrived ends the connection (the body is
    never read); stock hypercorn closed it without saying so, so a keep-alive client (requests)
    sent its next request on it and, when our close came a moment later, got
    `RemoteDisconnected` (tests/e2e/test_faults.py, once in four runs under load). A body that
    came with its head is read by then: that connection stays alive (patch 13)."""
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 8\r\n\r\n")
        status, headers, payload, rest = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 413") and payload == TOO_LARGE
        assert headers.get(b"connection") == b"close"
        await stream.send_all(b'{"a": 1}')  # the body, after the answer
        await stream.send_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")  # not served: we said close
        with trio.fail_after(5):
            assert rest + await stream.receive_some(100) == b""
        await stream.aclose()
        # The same early answer to a body that came with its head: kept alive, nothing announced.
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b'POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 8\r\n\r\n{"a": 1}')
        status, headers, _, rest = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 413") and b"connection" not in headers and rest == b""
        await stream.send_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
        status, _, payload, _ = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 200") and payload == b"echo:"
        await stream.aclose()
        shutdown.set()


async def test_the_drain_is_bounded_in_time(monkeypatch):
    monkeypatch.setattr(server_module(), "DRAIN_SECS", 0.2)
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /early HTTP/1.1\r\nhost: t\r\ncontent-length: 1000000\r\n\r\n")
        status, _, _, _ = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 413")
        # A client that trickles its body forever: closed once the drain's time is up (well
        # before the 5 s default would allow).
        with trio.fail_after(4), pytest.raises(trio.BrokenResourceError):
            while True:
                await stream.send_all(b"x")
                await trio.sleep(0.05)
        shutdown.set()


async def test_the_disconnect_hook_cancels_only_when_the_client_leaves_before_its_answer():
    hooks: dict[str, object] = {}
    cancelled: dict[str, bool] = {}
    entered = trio.Event()

    async def hooked(scope, receive, send):
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        while (await receive()).get("more_body"):
            pass
        hook = hooks[scope["path"]] = scope["extensions"][hypercorn_patches.DISCONNECT_EXTENSION]
        with trio.CancelScope() as cancel:
            hook.cancel_on_disconnect(cancel)
            if scope["path"] == "/wait":
                entered.set()
                await trio.sleep_forever()  # until the client leaves
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
            await send({"type": "http.response.body", "body": b"ok"})
            await trio.lowlevel.checkpoint()  # a cancellation would land here
        cancelled[scope["path"]] = cancel.cancelled_caught

    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, asgi=hooked)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /done HTTP/1.1\r\nhost: t\r\n\r\n")
        status, _, payload, _ = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 200")
        assert payload == b"ok"
        await stream.send_all(b"GET /wait HTTP/1.1\r\nhost: t\r\n\r\n")
        with trio.fail_after(5):
            await entered.wait()
            await stream.aclose()
            while "/wait" not in cancelled:
                await trio.testing.wait_all_tasks_blocked()
        assert cancelled == {"/done": False, "/wait": True}
        shutdown.set()


async def test_a_small_body_and_its_end_reach_the_app_in_one_receive():
    """hypercorn queues a body chunk and then an empty end-of-body message: two receive() calls,
    each a scheduler pass. The patched receive() joins what is already queued. A body that
    arrives in pieces still arrives whole and in order."""
    seen = []

    async def recording(scope, receive, send):
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        messages = [await receive()]
        while messages[-1].get("more_body"):
            messages.append(await receive())
        seen.append([(m["type"], m.get("body", b""), m.get("more_body", False)) for m in messages])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, asgi=recording)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 11\r\n\r\nhello world")
        status, _, _, _ = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 200")
        assert seen.pop() == [("http.request", b"hello world", False)]
        # In pieces: the app may see several messages, but the same bytes in order.
        await stream.send_all(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 11\r\n\r\nhello")
        await trio.testing.wait_all_tasks_blocked()
        await stream.send_all(b" world")
        status, _, _, _ = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 200")
        messages = seen.pop()
        assert b"".join(body for _, body, _ in messages) == b"hello world"
        assert [more for _, _, more in messages] == [True] * (len(messages) - 1) + [False]
        await stream.aclose()
        shutdown.set()


class _Steps(trio.abc.Instrument):
    """Task steps of every task but ``skip`` (the test's client), by the task's coroutine name."""

    def __init__(self, skip) -> None:
        self.skip = skip
        self.steps: dict[str, int] = {}

    def before_task_step(self, task) -> None:
        if task is not self.skip:
            name = task.coro.cr_code.co_name
            self.steps[name] = self.steps.get(name, 0) + 1


async def test_a_kept_alive_request_costs_the_server_two_task_steps():
    """A small POST answered at once: the reader wakes once (reads, parses, hands the body
    over) and the app runs once, from its first receive() to its answer, without a schedule
    point. Stock hypercorn yields in every hand-off (the channel's send and receive, the send
    lock, send_all): 8 steps per request."""
    requests = 20
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        request = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\nhello"
        await stream.send_all(request)
        await read_response(stream)
        await trio.testing.wait_all_tasks_blocked()
        steps = _Steps(trio.lowlevel.current_task())
        trio.lowlevel.add_instrument(steps)
        try:
            for _ in range(requests):
                await stream.send_all(request)
                status, _, payload, _ = await read_response(stream)
                assert status.startswith(b"HTTP/1.1 200") and payload == b"echo:hello"
                await trio.testing.wait_all_tasks_blocked()
        finally:
            trio.lowlevel.remove_instrument(steps)
        # hypercorn: its connection reader and its app runner; smgrl's server: its connection
        # reader and its app runner.
        expected = ("_run_handler", "_handle") if _server["kind"] == SERVERS[0] else ("handle", "_app")
        assert steps.steps == dict.fromkeys(expected, requests)
        await stream.aclose()
        shutdown.set()


async def test_a_response_larger_than_the_socket_buffer_arrives_whole_and_in_order():
    """Guards the direct write (stock passes too): bytes the kernel did not take go out through
    the locked send_all, before the next response."""
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /big HTTP/1.1\r\nhost: t\r\n\r\nGET /x HTTP/1.1\r\nhost: t\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()  # the server is stuck on a full socket
        status, _, payload, rest = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 200") and payload == BIG
        status, _, payload, _ = await read_response(stream, rest)
        assert status.startswith(b"HTTP/1.1 200") and payload == b"echo:"
        await stream.aclose()
        shutdown.set()


async def test_an_answer_to_a_client_that_reset_the_connection_fails_quietly(monkeypatch):
    """Guards the direct write (stock passes too): the client resets its connection while the
    app works; the answer's write fails (EPIPE/ECONNRESET) and is dropped as stock drops a
    send on a broken stream; the server serves on."""
    import socket
    import struct

    released = trio.Event()
    answered = trio.Event()
    errors = []

    def spying_write(fd, data):
        try:
            return os.write(fd, data)
        except OSError as exc:
            errors.append(exc)
            raise

    async def held(scope, receive, send):
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["path"] == "/held":
            await released.wait()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
        answered.set()

    monkeypatch.setattr(server_module(), "_write", spying_write)
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, asgi=held)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /held HTTP/1.1\r\nhost: t\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()
        # A reset, not a FIN: SO_LINGER with a zero timeout.
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await stream.aclose()
        await trio.testing.wait_all_tasks_blocked()
        released.set()
        with trio.fail_after(5):
            await answered.wait()
        if _server["kind"] == SERVERS[0]:
            assert [type(e) for e in errors] in ([BrokenPipeError], [ConnectionResetError])
        else:  # smgrl's server: its reader saw the reset first, and the answer is not written
            assert errors == []
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
        status, _, payload, _ = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 200") and payload == b"ok"
        await stream.aclose()
        shutdown.set()


async def test_a_kept_alive_request_leaves_no_garbage_for_the_cycle_collector():
    """A request's stream, scope and queue are freed by reference counting: left in a cycle
    (the stream keeps app_put, app_put kept the stream) they made the cycle collector run every
    30-odd requests, with a full collection (90 ms) every few thousand."""
    import gc

    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        request = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 5\r\n\r\nhello"
        await stream.send_all(request)
        await read_response(stream)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(20):
                await stream.send_all(request)
                status, _, payload, _ = await read_response(stream)
                assert status.startswith(b"HTTP/1.1 200") and payload == b"echo:hello"
            await trio.testing.wait_all_tasks_blocked()
            gc.collect()
            garbage = [type(o).__qualname__ for o in gc.garbage]
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            gc.enable()
        assert garbage == []
        await stream.aclose()
        shutdown.set()


async def test_receive_nowait_gives_what_arrived_and_never_waits():
    """The ``smgrl.receive_nowait`` extension (guards the patch): a body that came with its
    head is there whole; a body still on its way is None, then arrives through receive()."""
    seen = []

    async def peeking(scope, receive, send):
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        first = scope["extensions"][hypercorn_patches.RECEIVE_NOWAIT]()
        messages = [first]
        while messages[-1] is None or messages[-1].get("more_body"):
            messages.append(await receive())
        seen.append(messages)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})

    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, asgi=peeking)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 11\r\n\r\nhello world")
        status, _, _, _ = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 200")
        assert seen.pop() == [{"type": "http.request", "body": b"hello world", "more_body": False}]
        await stream.send_all(b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 11\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()
        await stream.send_all(b"hello world")
        status, _, _, _ = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 200")
        messages = seen.pop()
        assert messages[0] is None
        assert b"".join(m.get("body", b"") for m in messages[1:]) == b"hello world"
        await stream.aclose()
        shutdown.set()


async def test_a_quart_app_whose_task_is_cancelled_after_each_answer_keeps_its_connection_alive():
    """Guards the unshielded recycle (stock passes too): quart-trio cancels its task once the
    answer is sent, and the kept-alive path after it (the next cycle, the idle watcher's restart)
    still runs whole: the next requests are served, then the idle bound closes the connection."""
    quart = QuartTrio("t")

    @quart.route("/")
    async def index():
        return "hi"

    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, keep_alive=0.5, asgi=quart)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        for _ in range(3):
            await stream.send_all(b"GET / HTTP/1.1\r\nhost: t\r\n\r\n")
            status, _, payload, rest = await read_response(stream)
            assert status.startswith(b"HTTP/1.1 200") and payload == b"hi" and rest == b""
        with trio.fail_after(5):
            assert await stream.receive_some(100) == b""  # the idle watcher was restarted
        await stream.aclose()
        shutdown.set()


async def test_a_write_the_kernel_took_only_part_of_completes_even_if_the_app_is_cancelled():
    """Guards the direct write: once part of a message is on the wire the rest follows, even
    when the app's scope is cancelled (stock shields its send_all the same way)."""
    finished = trio.Event()

    async def cancelled(scope, receive, send):
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        with trio.CancelScope() as cancel:
            cancel.cancel()  # every checkpoint from here raises Cancelled
            head = [(b"content-length", b"%d" % len(BIG))]
            await send({"type": "http.response.start", "status": 200, "headers": head})
            await send({"type": "http.response.body", "body": BIG})
        finished.set()

    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, asgi=cancelled)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /x HTTP/1.1\r\nhost: t\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()  # the kernel took part; the rest waits
        status, _, payload, _ = await read_response(stream)
        assert status.startswith(b"HTTP/1.1 200") and payload == BIG
        with trio.fail_after(5):
            await finished.wait()
        await stream.aclose()
        shutdown.set()


async def test_a_client_that_half_closes_after_its_request_still_reads_the_answer():
    # ``shutdown(SHUT_WR)`` once the request is sent (``printf ... | nc``, some proxies): the FIN
    # arrives while the app works; the app's answer is still written, then the connection ends.
    async def answer_once_the_fin_is_read(scope, receive, send):
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        await trio.testing.wait_all_tasks_blocked()  # the server has read the client's FIN
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, asgi=answer_once_the_fin_is_read)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /a HTTP/1.1\r\nhost: t\r\n\r\n")
        await stream.send_eof()
        received = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                received += chunk
        assert received.startswith(b"HTTP/1.1 200 ") and received.endswith(b"\r\n\r\nok")
        await stream.aclose()
        shutdown.set()

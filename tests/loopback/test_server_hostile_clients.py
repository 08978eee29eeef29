"""smgrl's HTTP/1.1 server against unusual or hostile clients: pipelining floods, a bad request
behind a good one, ``Expect: 100-continue`` behind an answer being written, a chunked body's
framing without end. Real sockets on 127.0.0.1, raw bytes on the wire; each wait is for an event
(the server's answer or close), bounded by ``fail_after``."""

import trio
import trio.testing

from smgrl.http.server import connection as smgrl_connection
from tests.loopback.server_kit import lifespan, read_until_closed, start_server

HUGE = b"x" * (64 << 20)
LARGE = b"y" * (8 << 20)


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        await lifespan(receive, send)
        return
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            break
    if scope["path"] == "/stream":
        # One part, then (once every task waits: the client has sent what it sends next and the
        # server has read it) the rest.
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"one", "more_body": True})
        await trio.testing.wait_all_tasks_blocked()
        await send({"type": "http.response.body", "body": b"two", "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] in ("/huge", "/large"):  # more than every socket buffer between the two
        answer = HUGE if scope["path"] == "/huge" else LARGE
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", b"%d" % len(answer))],
            }
        )
        await send({"type": "http.response.body", "body": answer})
        return
    if scope["path"] == "/wait":
        await trio.testing.wait_all_tasks_blocked()  # the server has read what followed
    payload = b"echo:" + scope["path"].encode() + b":" + body
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(payload))]}
    )
    await send({"type": "http.response.body", "body": payload})


async def start(nursery, grace: float = 5):
    return await start_server(nursery, app, grace=grace)


async def exchange(data: bytes) -> bytes:
    """``data`` sent on a fresh connection; everything the server sends until it closes."""
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(data)
        out = await read_until_closed(stream)
        await stream.aclose()
        shutdown.set()
    return out


async def test_a_flood_of_pipelined_requests_is_answered_in_order_with_one_read_parsed_at_most(
    monkeypatch,
):
    count = 10_000
    requests = b"".join(b"GET /%d HTTP/1.1\r\nhost: t\r\n\r\n" % i for i in range(count))
    held = [0]
    start_app = smgrl_connection.ClientConnection._start

    def counting_start(self, cycle):
        held[0] = max(held[0], len(self.cycles))
        start_app(self, cycle)

    monkeypatch.setattr(smgrl_connection.ClientConnection, "_start", counting_start)
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        nursery.start_soon(stream.send_all, requests)  # one write, read by the server as it goes
        received = b""
        with trio.fail_after(60):
            while received.count(b"HTTP/1.1 200") < count or not received.endswith(b":"):
                chunk = await stream.receive_some(1 << 16)
                assert chunk, "closed before every answer"
                received += chunk
        await stream.aclose()
        shutdown.set()
    paths = [part.split(b":", 1)[0] for part in received.split(b"echo:")[1:]]
    assert paths == [b"/%d" % i for i in range(count)]
    # Requests parsed and waiting: never more than one read of the socket holds (before the
    # fix, every request the client had written: the whole flood).
    shortest = len(b"GET /0 HTTP/1.1\r\nhost: t\r\n\r\n")
    assert held[0] <= smgrl_connection.MAX_RECV // shortest + 3


async def test_a_bad_request_pipelined_behind_a_good_one_is_refused_after_its_answer():
    out = await exchange(b"POST /wait HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\n\r\nabcXYZ\r\n\r\n")
    assert out == (
        b"HTTP/1.1 200 \r\ncontent-length: 14\r\n\r\necho:/wait:abc"
        b"HTTP/1.1 400 \r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    out = await exchange(b"GET /wait HTTP/1.1\r\nhost: t\r\n\r\nGET /two HTTP/1.1\r\n\r\n")  # no host
    assert out == (
        b"HTTP/1.1 200 \r\ncontent-length: 11\r\n\r\necho:/wait:"
        b"HTTP/1.1 400 \r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )


async def test_a_pipelined_100_continue_comes_after_the_answer_being_written():
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /stream HTTP/1.1\r\nhost: t\r\n\r\n")
        received = b""
        with trio.fail_after(10):
            while b"3\r\none\r\n" not in received:
                received += await stream.receive_some(65536)
            # The answer is half written: a request asking to continue, pipelined behind it.
            await stream.send_all(
                b"POST /p HTTP/1.1\r\nhost: t\r\nexpect: 100-continue\r\ncontent-length: 3\r\n\r\n"
            )
            while not received.endswith(b"0\r\n\r\nHTTP/1.1 100 \r\n\r\n"):
                received += await stream.receive_some(65536)
            await stream.send_all(b"abc")
            while not received.endswith(b"echo:/p:abc"):
                received += await stream.receive_some(65536)
        await stream.aclose()
        shutdown.set()
    assert received == (
        b"HTTP/1.1 200 \r\nTransfer-Encoding: chunked\r\n\r\n3\r\none\r\n3\r\ntwo\r\n0\r\n\r\n"
        b"HTTP/1.1 100 \r\n\r\nHTTP/1.1 200 \r\ncontent-length: 11\r\n\r\necho:/p:abc"
    )


async def test_a_chunked_body_whose_trailer_never_ends_is_refused_past_16_kib():
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(
            b"POST /wait HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nx-t: "
        )
        out = b""
        with trio.fail_after(10):
            # Before the fix the server read (and httptools kept) every trailer byte: 64 MiB.
            for _ in range(1024):
                try:
                    await stream.send_all(b"a" * 65536)
                except trio.BrokenResourceError:
                    break
            else:
                raise AssertionError("an endless trailer was read whole")
            while chunk := await stream.receive_some(65536):
                out += chunk
        await stream.aclose()
        shutdown.set()
    assert out == b"HTTP/1.1 431 \r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


async def test_a_body_of_many_tiny_chunks_and_long_extensions_is_read_whole():
    # The bound on a body's framing counts only reads that bring no body byte.
    body = b"".join(b"1;e=%s\r\n%c\r\n" % (b"x" * 100, 97 + i % 26) for i in range(5000))
    out = await exchange(
        b"POST /c HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        + body
        + b"0\r\nx-t: 1\r\n\r\n"
    )
    expected = bytes(97 + i % 26 for i in range(5000))
    assert out.endswith(b"\r\n\r\necho:/c:" + expected)


async def test_a_graceful_stop_ends_within_its_grace_even_with_a_client_that_does_not_read(
    autojump_clock,
):
    grace = 1.0
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery, grace=grace)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /huge HTTP/1.1\r\nhost: t\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked()  # the answer fills the buffers, stalls
        stopped = trio.current_time()
        shutdown.set()
    # Before the fix the rest of the answer's write, shielded, waited WRITE_STALL_SECS.
    assert trio.current_time() - stopped <= grace + 0.5
    await stream.aclose()


async def test_a_client_reading_a_large_answer_slowly_but_steadily_gets_all_of_it(monkeypatch):
    """The write-stall bound is on a client that stops reading, not on a long answer: a client
    that keeps taking bytes, each pause shorter than the bound, reads the whole of an answer
    that takes several bounds to read (the bound once applied to the whole rest of the
    message, and cut such a reader mid-answer). The client's pacing is the subject here, in
    real time: the server writes to a real socket whose buffers only the reading drains."""
    monkeypatch.setattr(smgrl_connection, "WRITE_STALL_SECS", 0.2)
    async with trio.open_nursery() as nursery:
        port, shutdown = await start(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(b"GET /large HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        received = 0
        started = trio.current_time()
        with trio.fail_after(30):
            while chunk := await stream.receive_some(1 << 16):
                received += len(chunk)
                await trio.sleep(0.01)  # a slow reader: a pause well under the 0.2 s bound
        took = trio.current_time() - started
        assert took > 4 * 0.2  # it took several bounds to read: the bound is not on the whole rest
        head = b"HTTP/1.1 200 \r\ncontent-length: %d\r\nConnection: close\r\n\r\n" % len(LARGE)
        assert received == len(head) + len(LARGE)
        shutdown.set()

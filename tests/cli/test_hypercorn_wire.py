"""Differential: stock hypercorn 0.18.0, hypercorn with smgrl's patches and smgrl's own HTTP/1.1
server (``smgrl.http.server``, the gateway's listener) put the same bytes on the wire for the same
requests (keep-alive, pipelining, chunked and Expect: 100-continue bodies, HEAD, 204, a streamed
and a large answer, refused answer headers, broken answer framing, a malformed request, one
pipelined behind a good one, a head and a trailer past their bounds, an early answer), except where one deliberately differs (``DELIBERATE``, ``OWN_CASES``: each case said
explicitly). Each server runs in its own process (``apply()`` patches the classes of the process
it runs in), on loopback."""

import subprocess
import sys

import pytest
import trio

SERVER = r"""
import sys, trio
from hypercorn.config import Config
from hypercorn.trio import serve
if sys.argv[1] == "patched":
    from smgrl.http import hypercorn_patches
    assert hypercorn_patches.apply()

BIG = bytes(range(256)) * 4096  # 1 MiB
MANY = [(b"X-Mixed-Case", b"v"), (b"x-dup", b"1"), (b"x-dup", b"2"), (b"x-empty", b""),
        (b"x-inner-space", b"a b"), (b"x-tab", b"a\tb"), (b"content-length", b"2")]
HEADERS = {
    "/headers": MANY, "/headers-again": MANY,  # the second time, the names are known good
    "/bad-value": [(b"x-bad", b"a\r\nx-injected: 1"), (b"content-length", b"2")],
    "/bad-name": [(b"x bad", b"v"), (b"content-length", b"2")],
    "/bad-ctl": [(b"x-bad", b"a\x00b"), (b"content-length", b"2")],
    "/bad-length": [(b"content-length", b"2"), (b"content-length", b"3")],
}

async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            m = await receive()
            if m["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/early":  # answered before the body is read (an early 404/401/413)
        await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"4")]})
        await send({"type": "http.response.body", "body": b"nope"})
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    path = scope["path"]
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for part in (b"one", b"two", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/empty":
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if path in FRAMED:  # a body that breaks its declared length, or none declared (chunked)
        length, payload = FRAMED[path]
        head = [] if length is None else [(b"content-length", length)]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        await send({"type": "http.response.body", "body": payload})
        return
    if path in HEADERS:  # many headers, or one h11 refuses: the same answer or the same refusal
        await send({"type": "http.response.start", "status": 200, "headers": HEADERS[path]})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    payload = BIG if path == "/big" else b"%s %s %d:" % (scope["method"].encode(), path.encode(), len(body)) + body
    head = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(payload))]
    await send({"type": "http.response.start", "status": 200, "headers": head})
    await send({"type": "http.response.body", "body": payload})

FRAMED = {"/short": (b"10", b"12345"), "/long": (b"2", b"12345"), "/chunked-once": (None, b"abc")}


async def own():
    import socket
    from smgrl.http.server import serve as own_serve
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(100)
    sock.setblocking(False)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(lambda task_status: own_serve(app, [sock], shutdown_trigger=stop.wait, graceful_timeout=1, task_status=task_status))
        print(urls[0].rsplit(":", 1)[1], flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)
        stop.set()


async def main():
    if sys.argv[1] == "own":
        return await own()
    cfg = Config()
    cfg.bind = ["127.0.0.1:0"]
    cfg.accesslog = None
    cfg.errorlog = None
    cfg.include_date_header = False
    cfg.include_server_header = False
    async with trio.open_nursery() as nursery:
        urls = await nursery.start(lambda task_status: serve(app, cfg, task_status=task_status))
        print(urls[0].rsplit(":", 1)[1], flush=True)
        await trio.to_thread.run_sync(sys.stdin.read)  # until the test closes our stdin
        nursery.cancel_scope.cancel()

trio.run(main)
"""

H = b"host: t\r\n"
CASES = {
    "keep-alive, then close": [
        b"GET /a HTTP/1.1\r\n" + H + b"\r\n",
        b"POST /b HTTP/1.1\r\n" + H + b"content-length: 5\r\n\r\nhello",
        b"GET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n",
    ],
    "pipelined": [
        b"POST /a HTTP/1.1\r\n" + H + b"content-length: 3\r\n\r\nabc"
        b"GET /stream HTTP/1.1\r\n" + H + b"\r\nHEAD /b HTTP/1.1\r\n" + H + b"\r\n"
        b"GET /empty HTTP/1.1\r\n" + H + b"\r\nGET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n",
    ],
    "chunked body": [
        b"POST /chunked HTTP/1.1\r\n" + H + b"transfer-encoding: chunked\r\n\r\n",
        b"5\r\nhello\r\n",
        b"6\r\n world\r\n0\r\n\r\n",
        b"GET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n",
    ],
    "expect 100-continue": [
        b"POST /expect HTTP/1.1\r\n" + H + b"expect: 100-continue\r\ncontent-length: 4\r\n\r\n",
        b"body",
        b"GET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n",
    ],
    "response headers": [
        b"GET /headers HTTP/1.1\r\n" + H + b"\r\n",
        b"GET /headers-again HTTP/1.1\r\n" + H + b"\r\n",
        b"GET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n",
    ],
    **{
        f"refused response header {path}": [
            b"GET %s HTTP/1.1\r\n" % path.encode() + H + b"\r\n",
            b"GET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n",
        ]
        for path in ("/bad-value", "/bad-name", "/bad-ctl", "/bad-length")
    },
    "early answer, body still to come": [b"POST /early HTTP/1.1\r\n" + H + b"content-length: 8\r\n\r\n"],
    "early answer, body came with the head": [
        b"POST /early HTTP/1.1\r\n" + H + b"content-length: 8\r\n\r\n12345678",
        b"GET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n",
    ],
    **{
        f"answer framing {path}": [
            b"GET %s HTTP/1.1\r\n" % path.encode() + H + b"\r\n",
            b"GET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n",
        ]
        for path in ("/short", "/long", "/chunked-once")
    },
    "h2c upgrade asked with a body (answered over HTTP/1.1)": [
        b"POST /a HTTP/1.1\r\n" + H + b"connection: Upgrade, HTTP2-Settings\r\nupgrade: h2c\r\n"
        b"http2-settings: AAMAAABkAAQAAP__\r\ncontent-length: 3\r\n\r\nabc",
        b"GET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n",
    ],
    "websocket upgrade (stock's WebSocket stream; this app refuses it)": [
        b"GET /ws HTTP/1.1\r\n" + H + b"connection: Upgrade\r\nupgrade: websocket\r\n"
        b"sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\nsec-websocket-version: 13\r\n\r\n",
    ],
    "large answer": [b"GET /big HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n"],
    "malformed request": [b"GET / HTTP/1.1\r\nbad header line\r\n\r\n"],
    "a bad request pipelined behind a good one": [
        b"POST /a HTTP/1.1\r\n" + H + b"content-length: 3\r\n\r\nabcXYZ\r\n\r\n"
    ],
    "a request without host pipelined behind a good one": [
        b"GET /a HTTP/1.1\r\n" + H + b"\r\nGET /b HTTP/1.1\r\n\r\n"
    ],
    "chunk extensions and a trailer": [
        b"POST /chunked HTTP/1.1\r\n" + H + b"transfer-encoding: chunked\r\n\r\n"
        b'3;ext=1;e2="q"\r\nabc\r\n0\r\nx-trailer: 1\r\n\r\n',
        b"GET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n",
    ],
    "a head over 64 KiB in one write": [b"GET / HTTP/1.1\r\n" + H + b"x: " + b"a" * 70000 + b"\r\n\r\n"],
    "a trailer over 16 KiB": [
        b"POST /chunked HTTP/1.1\r\n" + H + b"transfer-encoding: chunked\r\n\r\n3\r\nabc\r\n",
        b"0\r\nx-t: " + b"a" * 40000,
    ],
}

# Where the patched server deliberately differs from stock: case -> stock's bytes made into the
# patched server's. Patch 13 (docs/hypercorn-patches.md): an answer that starts before the
# request body has arrived says `connection: close` (both servers close after it; stock did not
# say so, and a keep-alive client's next request raced the close).
DELIBERATE = {
    "early answer, body still to come": lambda stock: stock.replace(
        b"\r\n\r\n", b"\r\nconnection: close\r\n\r\n", 1
    ),
}


async def exchange(port: int, pieces: list[bytes]) -> bytes:
    """Send each piece once the server has gone quiet after the previous one; return everything
    the server sent until it closed."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    received = b""
    with trio.fail_after(20):
        for piece in pieces:
            await stream.send_all(piece)
            while True:  # read until quiet (the server has answered what it can)
                # Real time: the server is another process on a real socket (a mock clock's
                # jump would not make it answer sooner), and its silence is the only signal.
                with trio.move_on_after(0.3):
                    data = await stream.receive_some(1 << 20)
                    if not data:
                        return received
                    received += data
                    continue
                break
        while data := await stream.receive_some(1 << 20):
            received += data
    return received


def start(kind: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return proc, int(proc.stdout.readline())


@pytest.fixture(scope="module")
def servers():
    stock, patched, own = start("stock"), start("patched"), start("own")
    try:
        yield {"stock": stock[1], "patched": patched[1], "own": own[1]}
    finally:
        for proc, _ in (stock, patched, own):
            proc.stdin.close()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("case", list(CASES))
def test_stock_and_patched_hypercorn_answer_the_same_bytes(servers, case):
    stock = trio.run(exchange, servers["stock"], CASES[case])
    patched = trio.run(exchange, servers["patched"], CASES[case])
    assert stock  # the server answered something
    if case in DELIBERATE:
        assert patched != stock and patched == DELIBERATE[case](stock)
    else:
        assert patched == stock


WEBSOCKET = "websocket upgrade (stock's WebSocket stream; this app refuses it)"
# smgrl's server speaks HTTP/1.1 only: a request asking to upgrade to WebSocket is answered over
# HTTP/1.1, as the same request without its upgrade headers (the gateway has no WebSocket
# route), and the connection stays usable. Case -> (its pieces, the same request without them).
OWN_CASES = {
    "websocket upgrade answered over HTTP/1.1": (
        [CASES[WEBSOCKET][0] + b"GET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n"],
        [b"GET /ws HTTP/1.1\r\n" + H + b"\r\nGET /c HTTP/1.1\r\n" + H + b"connection: close\r\n\r\n"],
    ),
}


@pytest.mark.parametrize("case", [c for c in CASES if c != WEBSOCKET])
def test_smgrl_server_and_patched_hypercorn_answer_the_same_bytes(servers, case):
    patched = trio.run(exchange, servers["patched"], CASES[case])
    own = trio.run(exchange, servers["own"], CASES[case])
    assert patched
    assert own == patched


@pytest.mark.parametrize("case", list(OWN_CASES))
def test_smgrl_server_answers_an_upgrade_request_over_http11(servers, case):
    pieces, plain = OWN_CASES[case]
    own = trio.run(exchange, servers["own"], pieces)
    assert own.startswith(b"HTTP/1.1 200 ") and own == trio.run(exchange, servers["patched"], plain)

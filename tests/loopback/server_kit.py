"""What the tests of smgrl's HTTP/1.1 server share: the ASGI lifespan an app answers, and the
server started on a fresh loopback socket."""

import socket

import trio

from smgrl.http import server as smgrl_server


async def lifespan(receive, send):
    """An app's answers to the lifespan protocol (startup, then shutdown)."""
    while True:
        msg = await receive()
        if msg["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif msg["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def start_server(nursery, app, *, grace: float = 5, keep_alive: float | None = None):
    """smgrl's server for ``app`` on 127.0.0.1 (a free port), in ``nursery``: (port, an event
    whose setting stops it). ``keep_alive`` sets both connection bounds (else none)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(100)
    sock.setblocking(False)
    shutdown = trio.Event()
    bounds = (
        {} if keep_alive is None else {"keep_alive_timeout": keep_alive, "header_read_timeout": keep_alive}
    )
    await nursery.start(
        lambda task_status: smgrl_server.serve(
            app,
            [sock],
            shutdown_trigger=shutdown.wait,
            graceful_timeout=grace,
            task_status=task_status,
            **bounds,
        )
    )
    return sock.getsockname()[1], shutdown


async def read_until_closed(stream) -> bytes:
    """Everything the server sent until it closed the connection (fails if it never does)."""
    received = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some(65536):
            received += chunk
    return received

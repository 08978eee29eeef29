"""The Prometheus listener (``--prometheus-host``/``--prometheus-port``): ``GET /metrics`` only.

A separate port, as in SMG (the main port has no ``/metrics``). It is a few lines of trio + h11
rather than a second ASGI app: prometheus_client's own servers are thread- or asyncio-based, and
hypercorn's dispatcher middleware is asyncio-only and silently breaks lifespan under trio.
"""

from __future__ import annotations

import inspect
from functools import partial

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST

MAX_REQUEST_BYTES = 64 * 1024
READ_TIMEOUT_SECS = 10.0


async def _handle(render, stream: trio.SocketStream) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_BYTES)
    # A scraper that stalls cannot hold the connection forever.
    with trio.move_on_after(READ_TIMEOUT_SECS):
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await stream.receive_some(16384)
                    conn.receive_data(data)
                    if not data:
                        return
                    continue
                if isinstance(event, h11.Request):
                    if event.target.split(b"?")[0] == b"/metrics" and event.method in (b"GET", b"HEAD"):
                        body, status, ctype = render(), 200, CONTENT_TYPE_LATEST.encode()
                        if inspect.isawaitable(body):  # the --workers supervisor scrapes its workers
                            body = await body
                    else:
                        body, status, ctype = b"not found\n", 404, b"text/plain; charset=utf-8"
                    headers = [
                        (b"content-type", ctype),
                        (b"content-length", str(len(body)).encode()),
                        (b"connection", b"close"),
                    ]
                    out = conn.send(h11.Response(status_code=status, headers=headers))
                    if event.method != b"HEAD":
                        out += conn.send(h11.Data(data=body))
                    out += conn.send(h11.EndOfMessage())
                    await stream.send_all(out)
                    return
                if isinstance(event, h11.ConnectionClosed):
                    return
        except (h11.RemoteProtocolError, trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await trio.aclose_forcefully(stream)


async def serve_metrics(render, listeners, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``GET /metrics`` on ``listeners``, bound by the caller (``smgrl.runtime.listeners.bind_metrics``:
    before the journal is opened, so a port in use changes nothing)."""
    # serve_listeners runs one task per connection inside its own nursery, owned by this task
    # (itself a child of the gateway's root nursery): cancelling the root stops the listener.
    await trio.serve_listeners(partial(_handle, render), listeners, task_status=task_status)

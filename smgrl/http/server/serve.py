"""smgrl's HTTP/1.1 server: accept on the given sockets, run the app's lifespan, serve each
connection (``connection.ClientConnection``), stop gracefully.

A graceful stop: no new connection is accepted, idle connections close at once, a connection
with a request in flight closes after its answer; past ``graceful_timeout`` whatever is left is
cancelled. Then the app's lifespan shutdown runs."""

from __future__ import annotations

import errno
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from smgrl.core import hostport
from smgrl.http.server.connection import ClientConnection

log = logging.getLogger("smgrl.http.server")

App = Callable[..., Awaitable[None]]


class Server:
    """What every connection of one server shares: the app, the bounds, the stop."""

    def __init__(
        self,
        app: App,
        *,
        header_read_timeout: float = math.inf,
        keep_alive_timeout: float = math.inf,
        max_app_queue: int = 10,
        max_head_bytes: int = 16 * 1024,
    ) -> None:
        self.app = app
        self.header_read_timeout = header_read_timeout
        self.keep_alive_timeout = keep_alive_timeout
        self.max_app_queue = max_app_queue
        self.max_head_bytes = max_head_bytes
        self.state: dict[str, Any] = {}  # the lifespan state, copied into every request's scope
        self.connections: set[ClientConnection] = set()
        self.terminated = False
        # When a stop's grace period ends: no write outlives it, however shielded.
        self.stop_deadline = math.inf

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            connection = ClientConnection(self, stream)
        except OSError:
            # Gone before it was served (getpeername: ENOTCONN after a reset in the backlog).
            await stream.aclose()
            return
        self.connections.add(connection)
        try:
            await connection.run()
        except Exception:
            # A connection's failure is its own: logged and closed, never the listener's end
            # (this task runs in the nursery of every connection).
            log.exception("a connection failed")
        finally:
            connection.close_socket()
            self.connections.discard(connection)

    def terminate(self, deadline: float = math.inf) -> None:
        """Stop: idle connections close now, busy ones after their answer, none outlives
        ``deadline`` (the end of the grace period)."""
        self.terminated = True
        self.stop_deadline = deadline
        for connection in list(self.connections):
            connection.shutdown(deadline)


class Lifespan:
    """The ASGI lifespan protocol: startup before the first request, shutdown after the last.
    The app's lifespan call stays running in between (Quart-trio keeps the app's background
    nursery open in it)."""

    def __init__(self, app: App, state: dict[str, Any]) -> None:
        self.app = app
        self.state = state
        self.started = trio.Event()
        self.stopped = trio.Event()
        self.stopping = trio.Event()
        self.failure: str | None = None
        self._asked = 0

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        scope = {"type": "lifespan", "asgi": {"spec_version": "2.0", "version": "3.0"}, "state": self.state}
        task_status.started()
        try:
            await self.app(scope, self._receive, self._send)
        except Exception:
            if not self.started.is_set():
                # An app without lifespan support raises on its scope: served without one.
                log.debug("the app has no lifespan support", exc_info=True)
        finally:
            self.started.set()
            self.stopped.set()

    async def _receive(self) -> dict[str, str]:
        self._asked += 1
        if self._asked == 1:
            return {"type": "lifespan.startup"}
        await self.stopping.wait()
        return {"type": "lifespan.shutdown"}

    async def _send(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "lifespan.startup.failed":
            self.failure = str(message.get("message", "")) or "the app's startup failed"
        if kind in ("lifespan.startup.complete", "lifespan.startup.failed"):
            self.started.set()
        elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
            self.stopped.set()


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{hostport(host, port)}"


async def serve(
    app: App,
    sockets: list[socket.socket],
    *,
    shutdown_trigger: Callable[[], Awaitable[Any]],
    graceful_timeout: float,
    header_read_timeout: float = math.inf,
    keep_alive_timeout: float = math.inf,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``sockets`` (bound and listening) until ``shutdown_trigger`` returns, then
    stop gracefully; ``task_status.started`` gets the URLs, once the lifespan startup is done."""
    server = Server(app, header_read_timeout=header_read_timeout, keep_alive_timeout=keep_alive_timeout)
    lifespan = Lifespan(app, server.state)
    # The lifespan's own nursery, outside the connections': the app's lifespan call (and the
    # background work Quart-trio runs in it) outlives every connection, and ends last.
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.run)
        await lifespan.started.wait()
        if lifespan.failure is not None:
            raise RuntimeError(lifespan.failure)
        listeners = [trio.SocketListener(trio.socket.from_stdlib_socket(sock)) for sock in sockets]
        # The connections' nursery outlives the accept loop: a stop cancels accepting first,
        # then gives the connections in flight the grace period.
        async with trio.open_nursery() as connections:
            async with trio.open_nursery() as accepting:
                for listener in listeners:
                    accepting.start_soon(_accept, listener, server, connections)
                task_status.started([url_of(sock) for sock in sockets])
                await shutdown_trigger()
                accepting.cancel_scope.cancel()
            deadline = trio.current_time() + graceful_timeout
            server.terminate(deadline)
            connections.cancel_scope.deadline = deadline
        lifespan.stopping.set()
        # The app's lifespan shutdown gets a grace period of its own (a hung shutdown handler
        # must not keep the process up); then its call, still parked in the lifespan nursery
        # with whatever background work it left, is cancelled so the server returns.
        with trio.move_on_after(graceful_timeout):
            await lifespan.stopped.wait()
        lifespan_nursery.cancel_scope.cancel()


# Accept errors that mean "out of something, for now" (trio's serve_listeners list): wait, retry.
_RESOURCE_ERRORS = {"EMFILE", "ENFILE", "ENOMEM", "ENOBUFS"}


async def _accept(listener: trio.SocketListener, server: Server, connections: trio.Nursery) -> None:
    while True:
        try:
            stream = await listener.accept()
        except OSError as exc:
            if errno.errorcode.get(exc.errno or 0) in _RESOURCE_ERRORS:
                log.warning("accept: %s; waiting 100 ms", exc.strerror)
                await trio.sleep(0.1)
                continue
            raise
        connections.start_soon(server.handle, stream)

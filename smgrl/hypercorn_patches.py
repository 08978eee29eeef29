"""Two measured speed-ups for hypercorn 0.18's trio worker (``shared/design/hypercorn-perf.md``), and
one fix (3, below).

hypercorn is pinned to 0.18.0 in pyproject.toml because the patches replace internals:

1. **One idle watcher per connection.** Stock hypercorn, on every request, takes a lock, cancels
   the connection's keep-alive task and ``nursery.start``s a new one (``TrioSingleTask``): 15-20%
   of its CPU. ``IdleWatch`` keeps ONE watcher task per connection and only moves its cancel
   scope's deadline (``restart`` = idle from now, ``stop`` = busy, no deadline). Semantics are
   unchanged: an idle connection closes after ``keep_alive_timeout`` or at shutdown; a busy one
   closes after its response (hypercorn's ``_maybe_recycle``).
2. **Response head sent with the first body chunk.** Stock hypercorn writes the head, the body
   and an empty end-of-message separately (three locked, shielded sends, two ``sendto``); ASGI
   lets a server hold the head until the first body message, so the patched ``stream_send`` sends
   head + body in one write and skips empty writes. Streaming bodies still go out chunk by chunk.
3. **The close after an early answer is shielded** (``_shielded_maybe_recycle``): a fix, not a
   speed-up; see its docstring.

``apply()`` is idempotent and checks the version first: on any other hypercorn it does nothing.
"""

from __future__ import annotations

import math
from itertools import chain

import h11
import hypercorn
import trio
from hypercorn.events import Closed, Updated
from hypercorn.protocol import h11 as h11_protocol
from hypercorn.protocol.events import Body, EndBody, Response
from hypercorn.trio import tcp_server

PATCHED_VERSION = "0.18.0"
_applied = False


class IdleWatch:
    """Drop-in for ``TrioSingleTask`` as ``TCPServer.idle_task``."""

    __slots__ = ("_idle", "_scope", "_server")

    def __init__(self) -> None:
        self._scope: trio.CancelScope | None = None
        self._idle = False
        self._server = None

    async def restart(self, task_group, action) -> None:
        server = action.__self__  # TCPServer._idle_timeout, bound: the connection's server
        self._idle = True
        deadline = trio.current_time() + server.config.keep_alive_timeout
        if self._scope is None:
            self._server = server
            # Started once, in the connection's own nursery (hypercorn's TaskGroup): it ends
            # with the connection.
            await task_group._nursery.start(self._watch, deadline)
        else:
            self._scope.deadline = deadline

    async def stop(self) -> None:
        self._idle = False
        if self._scope is not None:
            self._scope.deadline = math.inf

    async def _watch(self, deadline: float, task_status=trio.TASK_STATUS_IGNORED) -> None:
        server = self._server
        started = False
        while True:
            with trio.CancelScope(deadline=deadline) as scope:
                self._scope = scope
                if not started:
                    started = True
                    task_status.started()
                await server.context.terminated.wait()
            if self._idle:
                # Keep-alive expired, or shutdown while idle: close, shielded as stock hypercorn
                # does (the close must complete even though this scope was just cancelled).
                with trio.CancelScope(shield=True):
                    await server._initiate_server_close()
                return
            if server.context.terminated.is_set():
                return  # shutdown while busy: the response's _maybe_recycle closes it
            deadline = scope.deadline  # stop() raced the deadline: keep watching


async def _coalescing_stream_send(self, event) -> None:
    pending = getattr(self, "_smgrl_head", None)
    if isinstance(event, Response) and event.status_code >= 200:
        headers = list(chain(event.headers, self.config.response_headers("h11")))
        if self.keep_alive_requests >= self.config.keep_alive_max_requests:
            headers.append((b"connection", b"close"))
        try:
            self._smgrl_head = self.connection.send(
                h11.Response(headers=headers, status_code=event.status_code)
            )
        except h11.LocalProtocolError:
            if self.connection.their_state != h11.ERROR:
                raise
        return
    if isinstance(event, Body):
        data = self.connection.send(h11.Data(data=event.data))
        if pending is not None:
            self._smgrl_head = None
            data = pending + data
        if data:
            await self.send(h11_protocol.RawData(data=data))
        return
    if isinstance(event, EndBody):
        data = self.connection.send(h11.EndOfMessage())
        if pending is not None:
            self._smgrl_head = None
            data = pending + data
        if data:
            await self.send(h11_protocol.RawData(data=data))
        return
    if pending is not None:
        # Anything else (stream closed without a body, ...): never drop a head we were given.
        self._smgrl_head = None
        await self.send(h11_protocol.RawData(data=pending))
    await _stock_stream_send(self, event)


async def _shielded_maybe_recycle(self) -> None:
    """hypercorn's ``_maybe_recycle`` with its recycle-or-close step shielded from cancellation.

    It runs in the app's task, which quart-trio cancels once the response is sent. When the answer
    went out before the request body had all arrived (a 404/405, an auth refusal, any error
    answered before the body is read) the connection must be closed; stock hypercorn's close was
    cancelled at its first checkpoint (``send_eof``), so the connection was neither closed nor
    recycled: the client's next request on it hung forever, and the connection and its tasks
    leaked even after the client left (found by tests/e2e/test_schemathesis.py; checked by
    tests/e2e/test_faults.py::test_an_answer_sent_before_the_body_arrived_*)."""
    try:
        await self._close_stream()
    finally:
        with trio.CancelScope(shield=True):
            conn = self.connection
            if not self.context.terminated.is_set() and conn.our_state is h11.DONE and conn.their_state is h11.DONE:
                try:
                    conn.start_next_cycle()
                except h11.LocalProtocolError:
                    await self.send(Closed())
                else:
                    self.response = None
                    self.scope = None
                    await self.can_read.set()
                    await self.send(Updated(idle=True))
            else:
                await self.can_read.set()
                await self.send(Closed())


_stock_stream_send = h11_protocol.H11Protocol.stream_send
_stock_tcp_init = tcp_server.TCPServer.__init__


def _tcp_init(self, *args, **kwargs) -> None:
    _stock_tcp_init(self, *args, **kwargs)
    self.idle_task = IdleWatch()


def apply() -> bool:
    """Patch hypercorn in this process; True if patched (now or before)."""
    global _applied
    if _applied:
        return True
    if getattr(hypercorn, "__version__", None) not in (None, PATCHED_VERSION):
        return False
    from importlib.metadata import version

    if version("hypercorn") != PATCHED_VERSION:
        return False
    tcp_server.TCPServer.__init__ = _tcp_init
    h11_protocol.H11Protocol.stream_send = _coalescing_stream_send
    h11_protocol.H11Protocol._maybe_recycle = _shielded_maybe_recycle
    _applied = True
    return True

"""Patches to hypercorn 0.18's trio worker (the test reference of smgrl's own server): fixes and measured speed-ups, numbered as in
docs/hypercorn-patches.md (which has each one's reason, measurement and stock reproduction).

hypercorn is pinned to 0.18.0 in pyproject.toml because the patches replace internals:

1. The close after an early answer is shielded (``_shielded_maybe_recycle``): the keep-alive
   hang (fix).
2. Graceful close of a connection with unread input (RFC 9112 section 9.6): an answer sent before
   the request body was read is followed by a half-close, and the rest of the body is read and
   discarded (at most ``DRAIN_BYTES``, ``DRAIN_SECS``) before the socket closes (fix).
3. The disconnect message never blocks (``_spawn_app``): an app that answered without reading
   its body no longer leaves the close waiting on a full queue (fix).
4. One idle watcher per connection (``IdleWatch``: one task, its deadline moved, instead of a
   task started per request; speed-up), and it ends with its connection (``IdleWatch.finish``;
   fix).
5. The response head goes out with the first body chunk (``stream_send``; speed-up).
6. ``DisconnectHook``: a request's cancel scope cancelled on disconnect, without a task (an
   smgrl extension the raw fronts use).
7. A small body in one ``receive()`` (``_merge_queued``; speed-up).
8. The reader-to-app hand-off without schedule points (``AppQueue``; and ``smgrl.receive_nowait``
   for a body that came with its head; speed-up).
9. A response in one non-blocking write (``_direct_protocol_send``; speed-up).
10. The reader waits for readability, then reads once (``_receive_some``; speed-up).
11. Nothing per request for the cycle collector, one deadline move, no shield (``_AppPut``;
    speed-up).
12. Response headers checked once each, by one pattern match per value (speed-up; anything
    unusual goes through h11's own path).
13. An early answer says ``connection: close`` (``_coalescing_stream_send``; fix, RFC 9112
    section 9.6).
14. h11's ``Headers`` iterated in C (``hypercorn_hot.headers_iter``; speed-up).
15. A response's last body message in one step (``hypercorn_hot.app_send``; speed-up).
16. The h2c check on h11's lower-case names (``hypercorn_hot.check_protocol``), and a request
    without ``upgrade`` gets its stream at once (``hypercorn_hot.create_stream``; speed-ups).

The patches replace hypercorn internals, so they are pinned twice: ``apply()`` refuses any other
version, and tests/loopback/test_hypercorn_patches.py hashes the source of every stock function
replaced or relied on (``STOCK_SOURCES``), so an upgrade fails loudly. The gateway no longer runs
hypercorn (its listener is ``smgrl.http.server``): the patched hypercorn is the reference that
server's bytes and behaviours are tested against (docs/http-server.md), and the bare baseline of
the benchmarks for a checkout from before it.
"""

from __future__ import annotations

import math
import os
from typing import Any

import h11
import hypercorn
import trio
from hypercorn.events import Closed, Updated
from hypercorn.protocol import h11 as h11_protocol
from hypercorn.protocol.events import Body, EndBody, Response
from hypercorn.protocol.http_stream import ASGIHTTPState
from hypercorn.trio import task_group as trio_task_group
from hypercorn.trio import tcp_server

from smgrl.http import hypercorn_hot
from smgrl.http.server.appqueue import DISCONNECT_EXTENSION, RECEIVE_NOWAIT, AppQueue, DisconnectHook

PATCHED_VERSION = "0.18.0"
# sha256 (first 16 hex digits) of ``inspect.getsource`` of every stock hypercorn 0.18.0 function
# this module replaces or whose behaviour it copies; checked by tests/loopback/test_hypercorn_patches.py.
STOCK_SOURCES = {
    "hypercorn.trio.tcp_server.TCPServer.__init__": "4c1d42457bc197b2",
    "hypercorn.trio.tcp_server.TCPServer._read_data": "7ca747d922c65cf1",
    "hypercorn.trio.tcp_server.TCPServer._close": "bc73c4ae25a1ceec",
    "hypercorn.trio.tcp_server.TCPServer._idle_timeout": "210ce1014d98e1cb",
    "hypercorn.trio.tcp_server.TCPServer.protocol_send": "225856426bff7be0",
    "hypercorn.trio.task_group.TaskGroup.spawn_app": "b4c1131427529801",
    "hypercorn.trio.task_group._handle": "06081a56a9930825",
    "hypercorn.trio.worker_context.TrioSingleTask.restart": "0170ab8e4418dc0e",
    "hypercorn.trio.worker_context.TrioSingleTask.stop": "044ad384dfd2f565",
    "hypercorn.protocol.h11.H11Protocol.stream_send": "56a36254a368d71a",
    "hypercorn.protocol.http_stream.HTTPStream.handle": "6ed2e34c5e708c6a",
    "hypercorn.protocol.http_stream.HTTPStream.app_send": "c806044b99736985",
    "hypercorn.protocol.http_stream.HTTPStream._send_closed": "9aaf2e1ac611e51c",
    "hypercorn.protocol.h11.H11Protocol._maybe_recycle": "3ac53f52bc4e65de",
    "hypercorn.protocol.h11.H11Protocol._send_h11_event": "5e40283daa303ec7",
    # h11's own checks, which ``hypercorn_headers.checked_response`` makes once per header (patch 12).
    "h11._headers.normalize_and_validate": "82a8fcccb31d27d4",
    "h11._events._ResponseBase.__init__": "eccce2371512d41e",
    # What patch 14's ``Headers.__iter__`` yields (h11's ``Headers`` has no ``__iter__`` of its own).
    "h11._headers.Headers.__getitem__": "ca94add742ae2be4",
    # Patch 15 makes ``stream_send``'s ``StreamClosed`` step itself (pinned above) and awaits
    # the access log as ``_send_closed`` does.
    "hypercorn.logging.Logger.access": "59b27f8b5402bfb2",
    "hypercorn.protocol.h11.H11Protocol._check_protocol": "f95f6b38f43c62aa",
    "hypercorn.protocol.h11.H11Protocol._create_stream": "a2338a57ab343908",
}
# Attributes apply() adds where stock has none (the stock behaviour they copy is pinned above).
ADDED = frozenset({"h11._headers.Headers.__iter__"})
# Graceful close (RFC 9112 section 9.6): how much of an unread request body is read and dropped
# after the answer, and for how long, before the connection is closed anyway. 16 MiB covers the
# bodies clients really send after an early 413/401 (a refit chunk, a long prompt) at loopback
# and LAN speeds; past either bound the client may see a reset, as before.
DRAIN_BYTES = 16 * 1024 * 1024
DRAIN_SECS = 5.0
# The attribute of hypercorn's Config holding the header-read bound (smgrl.runtime.server sets it).
HEADER_READ_TIMEOUT = "smgrl_header_read_timeout"
_applied = False


def _header_read_timeout(config) -> float:
    return getattr(config, HEADER_READ_TIMEOUT, None) or config.keep_alive_timeout


class IdleWatch:
    """Drop-in for ``TrioSingleTask`` as ``TCPServer.idle_task``, enforcing SMG's two connection
    bounds (``--header-read-timeout-secs``, ``--idle-connection-timeout-secs``, measured on SMG
    1.13.0: docs/cli.md):

    * before its first request a connection must send a complete head within the header-read
      bound of being accepted, however slowly bytes trickle in (an idle or slowloris socket
      cannot hold a connection slot);
    * between requests a keep-alive connection may stay idle for the idle bound
      (``keep_alive_timeout``); once the first byte of its next head arrives, that head must be
      complete within the header-read bound;
    * a request in flight (its body still arriving, a long answer, an open SSE stream) is never
      cut by either: its body has its own deadline (the data plane's stall/body timeouts).

    Either bound closes the socket without an answer, as SMG does. ``HEADER_READ_TIMEOUT`` on
    hypercorn's config holds the header-read bound (absent: the idle bound governs throughout,
    as in stock hypercorn)."""

    __slots__ = ("_deadline", "_done", "_head_started", "_idle", "_scope", "_served", "_server")

    def __init__(self) -> None:
        self._scope: trio.CancelScope | None = None
        self._deadline = math.inf  # the bound in force (the watcher's scope may lag behind it)
        self._idle = False
        self._done = False
        self._served = False  # a request head has been complete on this connection
        self._head_started = False  # bytes of the next head arrived while idle
        self._server = None

    async def restart(self, task_group, action) -> None:
        server = action.__self__  # TCPServer._idle_timeout, bound: the connection's server
        self._idle = True
        self._head_started = False
        if self._served:
            deadline = trio.current_time() + server.config.keep_alive_timeout
        else:  # just accepted: the first head is bounded from now on, bytes or not
            deadline = trio.current_time() + _header_read_timeout(server.config)
        self._deadline = deadline
        if self._scope is None:
            self._server = server
            # Started once, in the connection's own nursery (hypercorn's TaskGroup): it ends
            # with the connection.
            await task_group._nursery.start(self._watch, deadline)
        else:
            self._scope.deadline = deadline

    async def stop(self) -> None:
        # Busy: no bound. The watcher's deadline is left where it is (moving a trio deadline
        # costs a few microseconds, on every request); should it pass while the connection is
        # busy, the watcher just waits again without one.
        self._idle = False
        self._served = True
        self._deadline = math.inf

    def data_arrived(self) -> None:
        """Bytes came in (called by the reader once the protocol has seen them: a head that
        came whole has made the connection busy by then, and nothing moves). On an idle
        keep-alive connection the first bytes of the next head switch it to the header-read
        bound. Before the first request the bound already runs from the accept, and a busy
        connection has no deadline: nothing to do."""
        if self._idle and self._served and not self._head_started and self._scope is not None:
            self._head_started = True
            self._deadline = trio.current_time() + _header_read_timeout(self._server.config)
            self._scope.deadline = self._deadline

    def finish(self) -> None:
        """The connection stopped reading (client gone, closed, drained): end the watcher, or it
        would hold the connection's nursery (and so its task) open until shutdown."""
        self._done = True
        self._idle = False
        if self._scope is not None:
            self._scope.cancel()

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
            if self._done:
                return
            terminated = server.context.terminated.is_set()
            if self._idle and (terminated or trio.current_time() >= self._deadline):
                # Keep-alive expired, or shutdown while idle: close, shielded as stock hypercorn
                # does (the close must complete even though this scope was just cancelled).
                with trio.CancelScope(shield=True):
                    await server._initiate_server_close()
                return
            if terminated:
                return  # shutdown while busy: the response's _maybe_recycle closes it
            # Woken by a bound that no longer holds (the connection went busy, or went idle
            # again with a new bound since): keep watching with the one in force.
            deadline = self._deadline


async def _coalescing_stream_send(self, event) -> None:
    kind = type(event)  # hypercorn's events are leaf classes: one type() instead of isinstance()s
    if kind is Response and event.status_code >= 200:
        hypercorn_hot.start_response(self, event.headers, event.status_code)
        return
    if kind is Body or kind is EndBody:
        if kind is Body:
            data = self.connection.send(h11.Data(data=event.data))
        else:
            data = self.connection.send(h11.EndOfMessage())
        pending = hypercorn_hot.take_head(self)
        if pending is not None:
            data = pending + data
        if data:
            await self.send(h11_protocol.RawData(data=data))
        return
    # Anything else (stream closed without a body, ...): never drop a head we were given.
    pending = hypercorn_hot.take_head(self)
    if pending is not None:
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
        conn = self.connection
        if (
            not self.context.terminated.is_set()
            and conn.our_state is h11.DONE
            and conn.their_state is h11.DONE
        ):
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                with trio.CancelScope(shield=True):
                    await self.send(Closed())
            else:
                # The kept-alive path has no checkpoint (hypercorn's trio Event.set; the
                # connection's IdleWatch, started before its first read, only moves a
                # deadline): a cancellation has nothing to interrupt here, so no shield scope
                # (one per request, ~9 us). The close below has checkpoints: shielded.
                self.response = None
                self.scope = None
                await self.can_read.set()
                await self.send(Updated(idle=True))
        else:
            with trio.CancelScope(shield=True):
                await self.can_read.set()
                await self.send(Closed())


async def _spawn_app(self, app, config, scope, send):
    """hypercorn's ``TaskGroup.spawn_app`` with a disconnect that never blocks, the
    ``DisconnectHook`` extension, and ``AppQueue`` instead of a memory channel.

    Stock hypercorn queues ``http.disconnect`` behind the body chunks in a bounded channel. An app
    that answered without reading its body (413, 401, 404) leaves that channel full, and the
    disconnect, sent from the app's own task after its answer, waited forever: the connection
    never closed. Here the disconnect closes the queue instead: the app still receives what was
    queued, then ``http.disconnect`` on every later ``receive()``; a body chunk still being
    queued is dropped (the stream is over)."""
    queue = AppQueue(config.max_app_queue_size)
    hook = DisconnectHook()
    scope["extensions"][DISCONNECT_EXTENSION] = hook
    scope["extensions"][RECEIVE_NOWAIT] = queue.get_nowait
    # The HTTPStream whose app_send this is (it keeps the returned app_put).
    app_put = _AppPut(queue, hook, getattr(send, "__self__", None))
    self._nursery.start_soon(
        trio_task_group._handle,
        app,
        config,
        scope,
        queue.get,
        send,
        trio.to_thread.run_sync,
        trio.from_thread.run,
    )
    return app_put


class _AppPut:
    """What ``_spawn_app`` gives hypercorn's stream to hand the app its messages.

    The stream keeps it (``HTTPStream.app_put``) and it reads the stream's state at the
    disconnect: a reference cycle. It is broken at the disconnect, the last message of every
    stream, so a request's stream, scope and queue are freed by reference counting. Left to the
    cycle collector they were about 30 objects per request: a young-generation collection every
    30-odd requests and a full one every few thousand (measured: tens of microseconds per
    request, and 90 ms pauses)."""

    __slots__ = ("hook", "queue", "stream")

    def __init__(self, queue: AppQueue, hook: DisconnectHook, stream) -> None:
        self.queue = queue
        self.hook = hook
        self.stream = stream

    async def __call__(self, message) -> None:
        if message["type"] == "http.disconnect":
            if self.queue._closed:
                return  # said once already (the stream reference is gone)
            self.queue.close()
            if getattr(self.stream, "state", None) is not ASGIHTTPState.CLOSED:
                self.hook._disconnected()  # before the answer was complete: the client left
            self.stream = None
            return
        await self.queue.put(message)


async def _draining_read_data(self) -> None:
    """hypercorn's ``TCPServer._read_data``, able to drain: once ``_graceful_close`` half-closed
    the connection, what the client still sends is read and dropped (bounded) instead of handed
    to the protocol, so the kernel does not reset the connection under the answer."""
    self._smgrl_drain = None
    self._smgrl_reading = True
    read_timeout = self.config.read_timeout
    idle_watch = self.idle_task if isinstance(self.idle_task, IdleWatch) else None
    try:
        # One scope for the connection's whole read loop (not one per read, as stock): the
        # drain's time bound moves its deadline; cancelled_caught then just ends the loop.
        with trio.CancelScope() as self._smgrl_read_scope:
            while True:
                try:
                    if read_timeout:
                        with trio.fail_after(read_timeout):
                            data = await _receive_some(self)
                    else:
                        data = await _receive_some(self)
                except (trio.ClosedResourceError, trio.BrokenResourceError, trio.TooSlowError):
                    break
                drain = self._smgrl_drain
                if drain is not None:
                    if not data or drain <= len(data):
                        break
                    self._smgrl_drain = drain - len(data)
                    continue
                await self.protocol.handle(tcp_server.RawData(bytes(data)))
                if data == b"":
                    break
                if idle_watch is not None:
                    idle_watch.data_arrived()
    finally:
        self._smgrl_reading = False
        self._smgrl_read_scope = None
        if isinstance(self.idle_task, IdleWatch):
            self.idle_task.finish()
    await self.protocol.handle(Closed())


_read = os.read  # the reader's socket read (``_receive_some``); a test can make it fail


async def _receive_some(server) -> bytes:
    """``server.stream.receive_some(MAX_RECV)``; on plain TCP, one wait for readability and one
    read of the socket.

    trio's ``receive_some`` first tries a ``recv`` (right after an answer it fails with EAGAIN,
    an exception raised and caught), then waits, reads again and, on its way, enters a context
    manager, an async context manager and a conflict detector: a visible share of a kept-alive
    request's CPU. Errors are trio's: a closed socket raises ``ClosedResourceError``, a broken
    connection ``BrokenResourceError``."""
    sock = server._smgrl_socket
    if sock is None:
        return await server.stream.receive_some(tcp_server.MAX_RECV)
    if sock.fileno() < 0:
        raise trio.ClosedResourceError("the connection was closed")
    await trio.lowlevel.wait_readable(sock)  # cancellable: the checkpoint; a close wakes it
    # Checked after the wait: a close by another task after the wake-up (the idle watcher, the
    # server's shutdown) leaves -1 here, never another connection's reused descriptor.
    fd = sock.fileno()
    if fd < 0:
        raise trio.ClosedResourceError("the connection was closed")
    try:
        return _read(fd, tcp_server.MAX_RECV)
    except BlockingIOError:  # woken without data after all: trio's way
        return await server.stream.receive_some(tcp_server.MAX_RECV)
    except OSError as exc:
        raise trio.BrokenResourceError(f"socket connection broken: {exc}") from exc


_stock_close = tcp_server.TCPServer._close


async def _graceful_close(self) -> None:
    """hypercorn's ``TCPServer._close``, but when the client is still sending its request body
    (an answer went out before the body was read) and the reader is alive: half-close (our FIN
    follows the answer) and let the reader drain, RFC 9112 section 9.6. The reader closes the
    socket when the client finishes (EOF) or a drain bound is reached."""
    if getattr(self, "_smgrl_reading", False) and self._smgrl_drain is None and _body_unread(self):
        try:
            await self.stream.send_eof()
        except (trio.BrokenResourceError, trio.BusyResourceError, trio.ClosedResourceError, AttributeError):
            await _stock_close(self)  # gone already, or TLS (no half-close): close as stock does
            return
        self._smgrl_drain = DRAIN_BYTES
        scope = self._smgrl_read_scope
        if scope is not None:
            scope.deadline = min(scope.deadline, trio.current_time() + DRAIN_SECS)
        return
    await _stock_close(self)


def _body_unread(server) -> bool:
    protocol = getattr(server.protocol, "protocol", None)
    conn = getattr(protocol, "connection", None)
    return isinstance(conn, h11.Connection) and conn.their_state is h11.SEND_BODY


_stock_protocol_send = tcp_server.TCPServer.protocol_send
# The socket write of ``_direct_protocol_send``; a name of its own so a test can make it fail
# like a broken connection does.
_write = os.write


async def _direct_protocol_send(self, event) -> None:
    """hypercorn's ``TCPServer.protocol_send``; on plain TCP, bytes go out in one non-blocking
    write when nothing else is being sent and the kernel takes them all (a response nearly
    always fits the socket buffer).

    Stock, every write takes the connection's ``trio.Lock`` and calls ``send_all`` in a
    shielded scope: two schedule points per write (the lock's and the send's), each a pass
    through trio's run loop, for bytes the kernel took at once. The lock orders the writers
    (the app's task, and the reader's 100-continue or error answers): the write here happens
    only while nobody holds it, and never yields, so it cannot interleave with another write;
    bytes the kernel did not take go through the stock path (lock, shielded ``send_all``)."""
    if type(event) is tcp_server.RawData:
        sock = self._smgrl_socket
        data = event.data
        if sock is not None and not self.send_lock.locked():
            fd = sock.fileno()  # -1 once closed (never a reused number: checked every write)
            if fd >= 0:
                if not data:
                    return
                try:
                    sent = _write(fd, data)
                except BlockingIOError:
                    sent = 0
                except OSError:
                    # The client is gone (EPIPE, ECONNRESET): what stock does on a broken stream.
                    await self.protocol.handle(Closed())
                    return
                if sent == len(data):
                    return
                if sent:
                    # Part of these bytes is out: the rest must follow whatever happens to the
                    # caller (a cancellation here would cut the message short on the wire; stock
                    # shields its send_all the same way), the stock path behind the lock.
                    with trio.CancelScope(shield=True):
                        await _stock_protocol_send(self, tcp_server.RawData(data=data[sent:]))
                    return
    await _stock_protocol_send(self, event)


_stock_stream_send = h11_protocol.H11Protocol.stream_send
_stock_tcp_init = tcp_server.TCPServer.__init__


def _tcp_init(self, *args, **kwargs) -> None:
    _stock_tcp_init(self, *args, **kwargs)
    self.idle_task = IdleWatch()
    # Plain TCP: the socket written directly (``_direct_protocol_send``); None over TLS.
    stream = self.stream
    self._smgrl_socket = stream.socket if isinstance(stream, trio.SocketStream) else None
    self._smgrl_reading = False
    self._smgrl_drain = None
    self._smgrl_read_scope = None


def _replacements() -> list[tuple[type, str, Any]]:
    """(class, attribute, replacement): every hypercorn function apply() swaps out."""
    return [
        (tcp_server.TCPServer, "__init__", _tcp_init),
        (tcp_server.TCPServer, "_read_data", _draining_read_data),
        (tcp_server.TCPServer, "_close", _graceful_close),
        (tcp_server.TCPServer, "protocol_send", _direct_protocol_send),
        (trio_task_group.TaskGroup, "spawn_app", _spawn_app),
        (h11_protocol.H11Protocol, "stream_send", _coalescing_stream_send),
        (h11_protocol.H11Protocol, "_maybe_recycle", _shielded_maybe_recycle),
        (h11._headers.Headers, "__iter__", hypercorn_hot.headers_iter),
        (hypercorn_hot.HTTPStream, "app_send", hypercorn_hot.app_send),
        (h11_protocol.H11Protocol, "_check_protocol", hypercorn_hot.check_protocol),
        (h11_protocol.H11Protocol, "_create_stream", hypercorn_hot.create_stream),
    ]


def stock_function(qualname: str):
    """The stock hypercorn function named in ``STOCK_SOURCES`` (``module.Class.attr``), as it
    was before apply() (the originals are kept at import)."""
    return _ORIGINALS[qualname]


def _resolve(qualname: str):
    import importlib

    parts = qualname.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = obj.__dict__[attr] if isinstance(obj, type) else getattr(obj, attr)
        return obj
    raise LookupError(qualname)


def installed_version() -> str | None:
    from importlib.metadata import version

    return getattr(hypercorn, "__version__", None) or version("hypercorn")


def apply() -> bool:
    """Patch hypercorn in this process; True if patched (now or before), False on any hypercorn
    other than ``PATCHED_VERSION`` (nothing is changed then)."""
    global _applied
    if _applied:
        return True
    if installed_version() != PATCHED_VERSION:
        return False
    for owner, name, new in _replacements():
        setattr(owner, name, new)
    _applied = True
    return True


# Kept before apply() can run (this module is the only place that patches hypercorn).
_ORIGINALS = {name: _resolve(name) for name in STOCK_SOURCES}
# Whether stock already defines an attribute of ``ADDED`` (it must not: the test checks).
STOCK_DEFINES = {q: q.rpartition(".")[2] in vars(_resolve(q.rpartition(".")[0])) for q in ADDED}

"""One HTTP/1.1 connection of smgrl's server: requests parsed by httptools (llhttp, in C), each
request's ASGI app run as a task of its own, answers written straight to the socket.

The connection's own task reads. It parses what arrives, hands each request's body to its app
(``AppQueue``) and keeps reading while the app runs, so a client that leaves is noticed at once:
the request's ``DisconnectHook`` cancels the app's engine call. Requests a client pipelines wait
in order, parsed, until the answer before them is complete. The app's task writes its answer:
the head goes out with the first body bytes, in one non-blocking write when the kernel takes it
all (nearly always), else through trio's ``send_all``.

Connection bounds, as SMG's: a head must be complete within the header-read bound of the accept
(the first request) or of its first byte (later ones); an idle kept-alive connection lives for
the idle bound; a request in flight has neither (its body and answer have their own deadlines in
the app). Either bound closes the socket without an answer. An answer sent before its request
body has all arrived says ``connection: close``; the connection is then half-closed and what the
client still sends is read and dropped (bounded) before the close, so the kernel does not reset
the connection under the answer (RFC 9112 section 9.6)."""

from __future__ import annotations

import logging
import math
import os
import socket
from collections import deque
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import httptools
import trio

from smgrl.http.server import wire
from smgrl.http.server.appqueue import DISCONNECT_EXTENSION, RECEIVE_NOWAIT
from smgrl.http.server.cycle import DONE, REQUEST, RequestCycle, declared_length

if TYPE_CHECKING:
    from smgrl.http.server.serve import Server

log = logging.getLogger("smgrl.http.server")

MAX_RECV = 1 << 16
# After an early answer: how much of the unread request body is read and dropped, and for how
# long, before the connection is closed anyway (a refit chunk or a long prompt after a 413/401).
DRAIN_BYTES = 16 * 1024 * 1024
DRAIN_SECS = 5.0
# How long the rest of a partly written message may wait for a client that does not read.
WRITE_STALL_SECS = 60.0

_read = os.read  # a test can make the socket fail
_write = os.write


class ClientConnection:
    """The reader of one accepted connection (``run``), and the writer its apps' answers use."""

    def __init__(self, server: Server, stream: trio.SocketStream) -> None:
        self.server = server
        self.stream = stream
        self.sock = stream.socket
        self.client = _addr(self.sock.getpeername())
        self.server_addr = _addr(self.sock.getsockname())
        self.parser = httptools.HttpRequestParser(self)
        self.cycles: deque[RequestCycle] = deque()  # parsed, not yet answered; [0] is the one served
        self.parsing: RequestCycle | None = None
        self.touched: list[RequestCycle] = []  # cycles given body bytes (or their end) by the last feed
        self.continues: list[RequestCycle] = []  # heads asking for 100-continue in the last feed
        self.head_bytes = 0  # bytes read while a head was incomplete
        self.framing_bytes = 0  # bytes read since the last body byte, while a body is incomplete
        self.refusal = 400  # the status for the parse error at hand
        self.served = False  # a head has been complete on this connection
        self.head_started = False  # bytes of the next head arrived while idle
        self.resume: trio.Event | None = None  # a reader paused behind a pipelined request
        self.drain: int | None = None  # bytes still to drop after an early answer
        self.raw_body = 0  # body bytes of an upgrade request still to come (unparsed by llhttp)
        self.gone = False  # the client cannot be written to (a reset, a failed write)
        self.eof = False  # the client sent its FIN (left, or only half-closed): no more requests
        self.closed = False
        self.write_lock = trio.Lock()
        self.read_scope = trio.CancelScope(deadline=trio.current_time() + server.header_read_timeout)
        self.nursery: trio.Nursery | None = None
        self.answered: trio.Event | None = None  # a refusal waiting for the answers before it
        self.write_scope: trio.CancelScope | None = None  # the shielded rest of a message

    # httptools' callbacks (synchronous, inside feed_data)

    def on_message_begin(self) -> None:
        cycle = RequestCycle(self)
        self.parsing = cycle
        self.cycles.append(cycle)

    def on_url(self, url: bytes) -> None:
        cycle = self.parsing
        if cycle is not None:
            cycle.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        cycle = self.parsing
        if cycle is not None and not cycle.head_done:  # after the head: a chunked body's trailers
            cycle.headers.append((name.lower(), value.strip(b" \t")))

    def on_headers_complete(self) -> None:
        cycle = self.parsing
        if cycle is None:
            return
        parser = self.parser
        cycle.head_done = True
        cycle.method = parser.get_method().decode("ascii")
        version = parser.get_http_version()
        self.head_bytes = 0
        self.served = True
        self.head_started = False
        self.read_scope.deadline = math.inf  # in flight: no connection bound
        connection = b""
        expect = False
        hosts = 0
        for name, value in cycle.headers:
            if name == b"connection":
                connection += b"," + value
            elif name == b"expect":
                expect = b"100-continue" in value.lower()
            elif name == b"host":
                hosts += 1
            elif name == b"transfer-encoding" and value.lower() != b"chunked":
                self.refusal = 501  # h11's answer: only chunked is supported
                raise _Refused
        cycle.http11 = version == "1.1"
        if (cycle.http11 and hosts != 1) or hosts > 1 or not cycle.target.isascii():
            raise _Refused  # h11's rules: one Host header (HTTP/1.1), an ASCII target
        tokens = {t.strip() for t in connection.lower().split(b",")}
        cycle.keep_alive = cycle.http11 and b"close" not in tokens
        if expect and cycle.http11:
            self.continues.append(cycle)

    def on_body(self, body: bytes) -> None:
        cycle = self.parsing
        if cycle is not None:
            if not cycle.pending:
                self.touched.append(cycle)
            cycle.pending.append(body)

    def on_message_complete(self) -> None:
        cycle = self.parsing
        if cycle is not None:
            cycle.complete = True
            if not cycle.pending:
                self.touched.append(cycle)
            self.parsing = None

    # the reader

    async def run(self) -> None:
        """Serve the connection until it ends (the server closes the socket after)."""
        # A nursery per connection: each request's app runs as a task of its own (a fresh
        # contextvars context per request, which Quart's request context needs) while this
        # task goes on reading, to notice a client that leaves. The nursery waits for the
        # apps: an operation whose client left still finishes, and is journaled.
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            timed_out = await self._read_loop()
            self._reader_done(timed_out)

    async def _read_loop(self) -> bool:
        """Read until the client leaves, the connection closes or a bound passes (then True)."""
        server = self.server
        with self.read_scope:
            while not self.closed:
                resume = self.resume
                if resume is not None:
                    await resume.wait()
                    continue
                data = await self._recv()
                if not data:
                    return False
                if self.drain is not None:
                    self.drain -= len(data)
                    if self.drain <= 0:
                        return False
                    continue
                parsing = self.parsing
                in_body = None
                if parsing is None or not parsing.head_done:
                    if not self.cycles and self.served and not self.head_started:
                        # The first bytes of the next head on a kept-alive connection: from
                        # now on the head-read bound, not the idle one.
                        self.head_started = True
                        self.read_scope.deadline = trio.current_time() + server.header_read_timeout
                    self.head_bytes += len(data)
                else:
                    in_body = parsing
                if self.raw_body:
                    data = self._take_raw(data)
                if data and not await self._feed(data):
                    return False
                parsing = self.parsing
                if in_body is not None and parsing is in_body:
                    # A body's framing (chunk-size lines, extensions, trailers) is bounded as a
                    # head is: httptools holds a trailer in memory whole, and a read that brings
                    # no body byte must not be free (h11: 431 past 16 KiB of such bytes).
                    self.framing_bytes = 0 if in_body.pending else self.framing_bytes + len(data)
                    if self.framing_bytes > server.max_head_bytes:
                        await self._refuse(431)
                        return False
                if self.head_bytes > server.max_head_bytes and (parsing is None or not parsing.head_done):
                    await self._refuse(431)
                    return False
                await self._dispatch()
        return self.read_scope.cancelled_caught and not self.closed

    async def _feed(self, data: bytes) -> bool:
        """``data`` through the parser; False when the request could not be parsed (answered)."""
        while True:
            try:
                self.parser.feed_data(data)
                return True
            except httptools.HttpParserUpgrade as exc:
                # llhttp stops after the head of a request asking for another protocol (h2c,
                # WebSocket), its body unread: smgrl speaks only HTTP/1.1, so the request is
                # answered over it, as hypercorn answers an h2c request with a body. Its body
                # (Content-Length bytes) is read as such; what follows goes to a fresh parser.
                offset = exc.args[0] if exc.args and isinstance(exc.args[0], int) else len(data)
                data = data[offset:]
                self.parser = httptools.HttpRequestParser(self)
                cycle = self.cycles[-1] if self.cycles else None
                if cycle is None or not cycle.head_done:
                    await self._refuse(400, cycle)
                    return False
                length = declared_length(cycle)
                if length is None:
                    await self._refuse(400, cycle)  # a chunked body after an upgrade head: not parsed
                    return False
                if length:
                    cycle.complete = False
                    if cycle in self.touched:
                        self.touched.remove(cycle)
                    self.parsing = cycle
                    self.raw_body = length
                data = self._take_raw(data)
                if not data:
                    return True
            except httptools.HttpParserError:
                await self._refuse(self.refusal)
                return False

    def _take_raw(self, data: bytes) -> bytes:
        """The part of ``data`` that is the body of an upgrade request (``raw_body`` bytes still
        to come) goes to that request; the rest is returned, for the parser."""
        want = self.raw_body
        if not want or not data:
            return data
        cycle = self.parsing
        assert cycle is not None
        taken, data = data[:want], data[want:]
        self.raw_body = want - len(taken)
        self.on_body(taken)
        if not self.raw_body:
            self.on_message_complete()
        return data

    async def _dispatch(self) -> None:
        """Hand what the last feed parsed to the apps: 100-continue, body bytes, new requests."""
        continues = self.continues
        if continues:
            self.continues = []
            for cycle in continues:
                if cycle.state != REQUEST:
                    continue
                if cycle is self.cycles[0]:
                    await self._write(wire.CONTINUE)
                else:
                    # Pipelined behind an answer still being written: its 100 would land in the
                    # middle of that answer. Its app's task sends it when it starts (``_app``).
                    cycle.expect = True
        touched = self.touched
        if touched:
            self.touched = []
            for cycle in touched:
                pending = cycle.pending
                body = pending[0] if len(pending) == 1 else b"".join(pending)
                cycle.pending = []
                await cycle.queue.put({"type": "http.request", "body": body, "more_body": not cycle.complete})
        cycles = self.cycles
        if cycles:
            first = cycles[0]
            if not first.started and first.head_done:
                self._start(first)
            if len(cycles) > 1 and cycles[1].complete and self.resume is None:
                # A whole request is waiting behind the one being answered (pipelining): stop
                # reading until no whole request waits (``_finish``).
                self.resume = trio.Event()

    def _start(self, cycle: RequestCycle) -> None:
        cycle.started = True
        target = cycle.target
        path, _, query = target.partition(b"?")
        raw = path.decode("ascii")
        scope = {
            "type": "http",
            "asgi": {"spec_version": "2.1", "version": "3.0"},
            "http_version": "1.1" if cycle.http11 else "1.0",
            "method": cycle.method,
            "scheme": "http",
            "path": unquote(raw) if "%" in raw else raw,
            "raw_path": path,
            "query_string": query,
            "root_path": "",
            "headers": cycle.headers,
            "client": self.client,
            "server": self.server_addr,
            "state": self.server.state.copy(),
            "extensions": {DISCONNECT_EXTENSION: cycle.hook, RECEIVE_NOWAIT: cycle.queue.get_nowait},
        }
        assert self.nursery is not None
        self.nursery.start_soon(self._app, cycle, scope)

    async def _app(self, cycle: RequestCycle, scope: dict[str, Any]) -> None:
        try:
            if cycle.expect:
                cycle.expect = False
                if not cycle.complete and cycle.state == REQUEST:
                    await self._write(wire.CONTINUE)  # the answers before it are complete
            await self.server.app(scope, cycle.queue.get, cycle.send)
        except Exception as exc:  # noqa: BLE001 - logged, with its request, by _log_app_error
            _log_app_error(scope, exc)
        except BaseExceptionGroup as group:
            # The app's errors beside trio's Cancelled or an interrupt: the errors are logged,
            # the rest goes on up (trio needs its Cancelled back; an interrupt ends the server).
            errors, rest = group.split(Exception)
            if errors is not None:
                _log_app_error(scope, errors)
            if rest is not None:
                raise rest from None
        finally:
            await self._app_done(cycle)

    async def _app_done(self, cycle: RequestCycle) -> None:
        if cycle.state == DONE or self.closed:
            return
        if cycle.state == REQUEST:
            # The app ended without answering: a 500 with no body, and the connection ends.
            cycle.state = DONE
            await self._write(wire.error_answer(500))
        elif cycle.head is not None:
            # The app failed in the middle of its answer: what it started goes out, then the
            # close tells the client the answer is cut.
            head, cycle.head = cycle.head, None
            await self._write(head)
        self._close()

    async def _refuse(self, status: int, broken: RequestCycle | None = None) -> None:
        """A request that cannot be parsed (``broken``, default the one being parsed): h11's
        error answer (when no answer has started on the connection), then the close.

        Whole requests pipelined before it are answered first, then the refusal goes out, as
        h11 does (it parses a request only once the answer before it is complete): a client's
        bad request does not cut, or take the place of, the answer to a good one before it. The
        reader stops reading meanwhile."""
        if broken is None:
            broken = self.parsing
        cycles = self.cycles
        if broken is None or not broken.started:
            # Not yet handed to its app (a request pipelined behind others, or the first one):
            # it is dropped, the requests before it are served.
            if broken in cycles:
                cycles.remove(broken)
            if broken in self.touched:
                self.touched.remove(broken)
            if broken in self.continues:
                self.continues.remove(broken)
            self.parsing = None
        if cycles and cycles[-1] is not broken and not self.closed:
            answered = self.answered = trio.Event()
            await self._dispatch()  # the whole requests of the last read start, if not yet
            await answered.wait()  # set by ``_finish`` once none is left, or by ``_close``
            if self.closed:
                return
        current = self.cycles[0] if self.cycles else None
        if current is None or current.state == REQUEST:
            if current is not None:
                current.state = DONE
            await self._write(wire.error_answer(status))
        self._discard_unread()
        self._close()

    def _discard_unread(self) -> None:
        """Drop what the client has already sent that will not be read (the rest of a head too
        large, what followed a malformed line): a socket closed with unread bytes resets the
        connection, and on loopback the reset overtakes the refusal, which the client never
        reads. Non-blocking, bounded by ``DRAIN_BYTES``."""
        fd = self.sock.fileno()
        left = DRAIN_BYTES
        while left > 0 and fd >= 0:
            try:
                data = _read(fd, MAX_RECV)
            except OSError:
                return  # nothing more yet (BlockingIOError), or the client reset
            if not data:
                return
            left -= len(data)

    def _reader_done(self, timed_out: bool) -> None:
        if self.closed:
            return
        if timed_out or self.drain is not None:
            self._close()  # a bound passed (idle, or a head too slow), or the drain is over
            return
        # The client went away: every request still in flight learns it; the socket closes once
        # the apps are done. Its FIN may be a half-close (``shutdown(SHUT_WR)``, then read): an
        # answer the app still gives is written, as hypercorn writes it; if the client has really
        # gone the write fails quietly.
        self.eof = True
        self._tell_apps_gone()

    async def _recv(self) -> bytes:
        """One wait for readability, one read of the socket; b"" when the connection is over."""
        sock = self.sock
        try:
            await trio.lowlevel.wait_readable(sock)
        except trio.ClosedResourceError:
            return b""
        fd = sock.fileno()  # -1 once closed by another task (never a reused descriptor)
        if fd < 0:
            return b""
        try:
            return _read(fd, MAX_RECV)
        except BlockingIOError:
            return await self._recv()  # woken without data after all
        except OSError:
            self.gone = True  # reset by the client: nothing can be written to it either
            return b""

    # the writer (the apps' tasks; the reader for 100-continue and refusals)

    async def write_body(self, cycle: RequestCycle, body: bytes, more: bool) -> None:
        framing = cycle.framing
        short = False
        if framing == wire.LENGTH:
            if len(body) > cycle.remaining:
                raise wire.AnswerFramingError("Too much data for declared Content-Length")
            cycle.remaining -= len(body)
            data = body
            short = not more and cycle.remaining > 0
        elif framing == wire.CHUNKED:
            data = wire.chunk(body) if more else wire.chunk(body) + wire.LAST_CHUNK
        elif framing == wire.UNTIL_CLOSE:
            data = body
        else:
            data = b""
        head = cycle.head
        if head is not None:
            cycle.head = None
            data = head + data
        if data:
            await self._write(data)
        if short:
            raise wire.AnswerFramingError("Too little data for declared Content-Length")
        if not more:
            cycle.state = DONE
            self._finish(cycle)

    async def _write(self, data: bytes) -> None:
        if self.closed or self.gone:
            return
        fd = self.sock.fileno()
        if fd < 0:
            return
        if not self.write_lock.locked():
            try:
                sent = _write(fd, data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._client_gone()
                return
            if sent == len(data):
                return
            data = data[sent:]
        # The kernel did not take it all (a large answer, a slow reader): the rest through trio,
        # in order behind any other writer. Shielded: once part of a message is on the wire the
        # rest must follow, whatever cancels the app (Quart-trio cancels a request's task once
        # its answer is handed over), or the client reads a cut answer on a live connection.
        # Bounded: a client that takes nothing for WRITE_STALL_SECS loses the connection (the
        # bound restarts with every byte the kernel takes: a slow but steady reader gets a
        # large answer whole), and no write outlives a graceful stop's grace period (``shutdown``).
        server = self.server
        with trio.CancelScope(shield=True) as scope:
            self.write_scope = scope
            try:
                async with self.write_lock:
                    view = memoryview(data)
                    while view:
                        scope.deadline = min(trio.current_time() + WRITE_STALL_SECS, server.stop_deadline)
                        try:
                            sent = await self.sock.send(view)
                        except (OSError, trio.ClosedResourceError):
                            self._client_gone()
                            break
                        view = view[sent:]
            finally:
                self.write_scope = None
        if scope.cancelled_caught:
            self._close()

    def _client_gone(self) -> None:
        """A reset or a failed write: nothing more is written, the requests in flight learn it."""
        self.gone = True
        self._tell_apps_gone()

    def _tell_apps_gone(self) -> None:
        """Each request in flight: its queue ends, its app's engine call is cancelled (its hook)."""
        for cycle in self.cycles:
            cycle.queue.close()
            if cycle.started and cycle.state != DONE:
                cycle.hook._disconnected()

    def _finish(self, cycle: RequestCycle) -> None:
        """An answer is complete: the connection is kept for the next request, or ends."""
        cycle.queue.close()  # the app's later receive(): a disconnect (nothing is cancelled)
        if not cycle.complete:
            self._drain()
            return
        if not cycle.keep_alive or self.server.terminated or self.gone or self.eof:
            self._close()
            return
        cycles = self.cycles
        if cycles and cycles[0] is cycle:
            cycles.popleft()
        if cycles:
            following = cycles[0]
            if following.head_done:
                self._start(following)
            else:
                self.head_started = True
                self.read_scope.deadline = trio.current_time() + self.server.header_read_timeout
        else:
            self.read_scope.deadline = trio.current_time() + self.server.keep_alive_timeout
            if self.answered is not None:
                self.answered.set()  # a refusal waits behind the answers: it goes out now
        resume = self.resume
        if resume is not None and not (len(cycles) > 1 and cycles[1].complete):
            # Reading goes on only once no whole request waits behind the one now served: a
            # client pipelining thousands of requests keeps at most one read's worth parsed.
            self.resume = None
            resume.set()

    def _drain(self) -> None:
        """An answer went out before its request body had all arrived: half-close (our FIN
        follows the answer) and let the reader read and drop what the client still sends, up to
        ``DRAIN_BYTES`` or ``DRAIN_SECS``, then close (RFC 9112 section 9.6)."""
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close()
            return
        self.drain = DRAIN_BYTES
        self.read_scope.deadline = min(self.read_scope.deadline, trio.current_time() + DRAIN_SECS)
        for cycle in self.cycles:
            cycle.queue.close()  # a reader waiting to queue body bytes for it goes on
        resume = self.resume
        if resume is not None:
            self.resume = None
            resume.set()

    def shutdown(self, deadline: float = math.inf) -> None:
        """The server is stopping: an idle connection closes now, a busy one after its answer,
        and a write waiting for a client that does not read ends at ``deadline``."""
        scope = self.write_scope
        if scope is not None:
            scope.deadline = min(scope.deadline, deadline)
        if not self.cycles or not self.cycles[0].started:
            self._close()

    def _close(self) -> None:
        if self.closed:
            return
        self.closed = True
        # Ends the reader wherever it waits, as a bound would (the apps are not in its scope).
        self.read_scope.cancel()
        for cycle in self.cycles:
            cycle.queue.close()
        resume = self.resume
        if resume is not None:
            self.resume = None
            resume.set()
        if self.answered is not None:
            self.answered.set()
        self.close_socket()

    def close_socket(self) -> None:
        self.closed = True
        try:
            self.sock.close()
        except OSError:
            pass


class _Refused(Exception):
    """Raised inside a parser callback: the request breaks one of h11's rules that llhttp does
    not check (``ClientConnection.refusal`` says the status)."""


def _log_app_error(scope: dict[str, Any], exc: BaseException) -> None:
    """The app's error with its request (the client's path escaped and cut: it is client text)."""
    log.error(
        "error in the ASGI application (%s %s)",
        scope["method"],
        scope["path"][:200].encode("unicode_escape").decode(),
        exc_info=exc,
    )


def _addr(name: Any) -> tuple[str, int] | None:
    if isinstance(name, tuple) and len(name) >= 2:
        return (str(name[0]), int(name[1]))
    return None

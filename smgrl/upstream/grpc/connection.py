"""One HTTP/2 connection to one engine: the trio shell around :mod:`~smgrl.upstream.grpc.http2`.

Three tasks per connection, none per stream: a reader (socket -> the codec -> each call's
:class:`~smgrl.upstream.grpc.framing.CallState`), a writer (whatever the codec has to send,
batched across streams, flushed when woken), and a keep-alive pinger when asked for. They run as
a trio *system task* (``spawn_system_task``): a channel is made without a nursery, lazily, and
its connection must outlive whichever caller happened to open it; :meth:`close` (or the run's
end) cancels it. Every exception inside is caught and turned into the connection's failure.

Calls change the codec's state synchronously and wake the writer, so cancelling a call
(RST_STREAM) never needs an await and works inside an already-cancelled scope.

A graceful GOAWAY (NO_ERROR) leaves the connection receiving: RFC 9113 6.8 lets the streams up
to ``last_stream_id`` run to their end, and grpcio's graceful shutdown is a GOAWAY, a PING,
another GOAWAY, then the streams' last frames. An error GOAWAY fails the connection at once.
"""

from __future__ import annotations

import itertools
import math
import os

import trio

from smgrl.upstream.grpc import http2
from smgrl.upstream.grpc.framing import CallState
from smgrl.upstream.grpc.status import GrpcError, StatusCode, Unavailable

READ_SIZE = 256 * 1024
STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
MAX_HEADER_LIST_SIZE = 64 * 1024
_ping_ids = itertools.count(1)


class GrpcCall:
    """One stream's side of a call: its response state and the wake-up of the task reading it."""

    __slots__ = ("_conn", "_waiter", "id", "state", "unacked")

    def __init__(self, conn: GrpcConnection, stream_id: int, max_message_bytes: int):
        self._conn = conn
        self.id = stream_id
        self.state = CallState(max_message_bytes)
        self.unacked = 0
        self._waiter: trio.lowlevel.Task | None = None  # the task parked in next_message

    def wake(self) -> None:
        # The parked task itself, rescheduled: no Event and ParkingLot per wait (a call waits
        # once or twice, and at one call at a time each of these is paid cold).
        task = self._waiter
        if task is not None:
            self._waiter = None
            trio.lowlevel.reschedule(task)

    def _abort(self, _raise_cancel) -> trio.lowlevel.Abort:
        self._waiter = None  # cancelled (a deadline, the caller's scope): nobody to wake now
        return trio.lowlevel.Abort.SUCCEEDED

    async def next_message(self, deadline: float = math.inf) -> bytes | None:
        """The next whole message, or None once the call is over (``state.status`` says how).
        Raises ``trio.TooSlowError`` at ``deadline``."""
        state = self.state
        while True:
            if state.messages:
                return state.messages.popleft()
            if state.done:
                return None
            if self.unacked:
                # Flow control: the window reopens as the caller consumes, so a slow reader
                # slows its stream (not the connection: each stream has its own window).
                self._conn.acknowledge(self)
            self._waiter = trio.lowlevel.current_task()
            if deadline == math.inf:
                # No deadline: no cancel scope to set up per wait. The wait is a checkpoint:
                # a cancel of the caller's scope aborts it (``_abort``).
                await trio.lowlevel.wait_task_rescheduled(self._abort)
            else:
                with trio.fail_at(deadline):
                    await trio.lowlevel.wait_task_rescheduled(self._abort)

    def cancel(self, error_code: int = http2.CANCEL) -> None:
        """RST_STREAM unless the stream is over (synchronous: safe in a cancelled scope)."""
        self._conn.reset(self, error_code)


class GrpcConnection:
    def __init__(
        self,
        stream: trio.abc.Stream,
        authority: str,
        *,
        max_message_bytes: int,
        keepalive_secs: float | None = None,
        keepalive_timeout_secs: float = 20.0,
    ):
        self.stream = stream
        self.authority = authority
        self.max_message_bytes = max_message_bytes
        self.keepalive_secs = keepalive_secs
        self.keepalive_timeout_secs = keepalive_timeout_secs
        self.h2 = http2.ClientCodec(
            self,
            stream_window=STREAM_WINDOW,
            connection_window=CONNECTION_WINDOW,
            max_header_list_size=MAX_HEADER_LIST_SIZE,
        )
        self.calls: dict[int, GrpcCall] = {}
        self.failure: GrpcError | None = None
        self.goaway = False
        self.settings_received = False
        self.pings_acked = 0
        self._wake_writer = trio.Event()
        self._outbox = bytearray()
        self._sending = False  # the writer is inside send_all
        sock = getattr(stream, "socket", None)
        self._sock = sock  # a plain TCP socket (None for other streams: TLS, memory streams)
        self._fd: int | None = sock.fileno() if sock is not None else None
        self._changed = trio.lowlevel.ParkingLot()  # window, settings, slots, failure
        self._scope = trio.CancelScope()
        self._ping_acked = trio.Event()
        self._closed = trio.Event()
        self.kick()

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> None:
        trio.lowlevel.spawn_system_task(self._run, name=f"grpc connection {self.authority}")

    @property
    def usable(self) -> bool:
        """Takes new calls: alive, no GOAWAY, stream ids left."""
        return self.failure is None and not self.goaway and self.h2.highest_stream_id < 2**31 - 1000

    def close(self, reason: str = "channel closed") -> None:
        self._fail(Unavailable(StatusCode.UNAVAILABLE, reason))

    async def wait_closed(self) -> None:
        await self._closed.wait()

    async def _run(self) -> None:
        try:
            with self._scope:
                async with trio.open_nursery() as nursery:
                    # The nursery holds the writer and the pinger; the reader runs here, and when
                    # it returns (EOF or failure) nothing else on this connection has a use.
                    nursery.start_soon(self._writer)
                    if self.keepalive_secs:
                        nursery.start_soon(self._keepalive)
                    await self._reader()
                    nursery.cancel_scope.cancel()
        except Exception as exc:  # noqa: BLE001 - a system task must not raise: it is a failure
            self._fail(Unavailable(StatusCode.UNAVAILABLE, f"connection failed: {exc}"))
        finally:
            self._fail(Unavailable(StatusCode.UNAVAILABLE, "connection closed"))
            # Shielded: the socket is closed even when the run itself is being torn down.
            with trio.CancelScope(shield=True):
                await trio.aclose_forcefully(self.stream)
            self._closed.set()

    def _fail(self, error: GrpcError) -> None:
        if self.failure is None:
            self.failure = error
        for call in list(self.calls.values()):
            call.state.finish(error.code, error.message)
            call.wake()
        self.calls.clear()
        self._changed.unpark_all()
        self._scope.cancel()

    # -- the tasks ----------------------------------------------------------------------------------
    async def _receive(self) -> bytes:
        """The next bytes from the socket (b"" at EOF).

        On a plain socket: one wait for readability, then one read. trio's ``receive_some``
        first tries a read, which right after an answer fails with EAGAIN (an exception raised
        and caught, a wasted syscall), then waits and reads again, through a conflict detector
        and two context managers: a visible share of a call's CPU when calls come one at a time.
        """
        sock = self._sock
        if sock is None:
            return await self.stream.receive_some(READ_SIZE)
        await trio.lowlevel.wait_readable(sock)  # the checkpoint; a close or a cancel wakes it
        fd = sock.fileno()  # checked after the wait: -1 once closed, never a reused descriptor
        if fd < 0:
            raise trio.ClosedResourceError("the connection was closed")
        try:
            return os.read(fd, READ_SIZE)
        except BlockingIOError:  # woken without data after all: trio's way
            return await self.stream.receive_some(READ_SIZE)

    async def _reader(self) -> None:
        while True:
            try:
                data = await self._receive()
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._fail(Unavailable(StatusCode.UNAVAILABLE, f"Socket closed: {exc}"))
                return
            if not data:
                self._fail(Unavailable(StatusCode.UNAVAILABLE, "Socket closed"))
                return
            try:
                self.h2.receive(data)
            except http2.Http2Error as exc:
                self.h2.goaway(exc.code)
                self.kick()
                self._fail(GrpcError(StatusCode.INTERNAL, f"HTTP/2 protocol error: {exc}"))
                return
            self.kick()
            if self.goaway and not self.calls:
                return

    # -- what the codec hands over (called inside receive) ---------------------------------------
    def on_data(self, sid: int, data: bytes, flow: int, end: bool) -> None:
        call = self.calls.get(sid)
        if call is None:
            # A call already gone: give the bytes back to the connection window.
            self.h2.acknowledge(sid, flow)
            return
        call.unacked += flow
        state = call.state
        state.on_data(data)
        if end:
            self._over(call)
            state.on_end()
        elif state.done:
            # A message too large (or malformed): the call ends here, the server is told.
            self.reset(call, http2.CANCEL)
        call.wake()

    def on_headers(self, sid: int, headers: list, end: bool) -> None:
        call = self.calls.get(sid)
        if call is None:
            return
        call.state.on_headers(headers)
        if end:
            self._over(call)
            call.state.on_end()
        call.wake()

    def on_reset(self, sid: int, code: int) -> None:
        call = self.calls.get(sid)
        if call is not None:
            self._over(call)
            call.state.on_reset(code)
            call.wake()

    def _over(self, call: GrpcCall) -> None:
        """The server ended ``call``'s stream: its slot frees, and the bytes it received go back
        to the connection window now (nobody acknowledges a finished call's reads: kept, they
        would shrink the window for good, and a long-lived connection would stall)."""
        del self.calls[call.id]
        if call.unacked:
            self.h2.acknowledge(call.id, call.unacked)
            call.unacked = 0
        if self._changed:  # a call waits for a slot
            self._changed.unpark_all()

    def on_settings(self) -> None:
        self.settings_received = True
        self._changed.unpark_all()

    def on_window(self) -> None:
        if self._changed:  # a body waits for window (most calls' bodies went out at once)
            self._changed.unpark_all()

    def on_ping_ack(self) -> None:
        self.pings_acked += 1
        self._ping_acked.set()

    def on_goaway(self, last: int, code: int) -> None:
        # Streams above last_stream_id were never processed (safe to retry elsewhere): they end
        # UNAVAILABLE now; the ones below it run to their end; no new stream starts here.
        self.goaway = True
        detail = f"GOAWAY received (error code {code})"
        for sid in [sid for sid in self.calls if sid > last]:
            call = self.calls.pop(sid)
            call.state.finish(StatusCode.UNAVAILABLE, detail)
            call.wake()
        if code != http2.NO_ERROR:
            self._fail(Unavailable(StatusCode.UNAVAILABLE, detail))
        self._changed.unpark_all()

    async def _writer(self) -> None:
        while True:
            await self._wake_writer.wait()
            self._wake_writer = trio.Event()
            data, self._outbox = self._outbox, bytearray()
            if data:
                self._sending = True
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._fail(Unavailable(StatusCode.UNAVAILABLE, f"Socket closed: {exc}"))
                    return
                finally:
                    self._sending = False

    async def _keepalive(self) -> None:
        while True:
            await trio.sleep(self.keepalive_secs)
            if not self.calls:
                continue  # no pings without calls: grpcio servers count those against us
            self._ping_acked = trio.Event()
            self.h2.ping(next(_ping_ids).to_bytes(8, "big"))
            self.kick()
            with trio.move_on_after(self.keepalive_timeout_secs) as scope:
                await self._ping_acked.wait()
            if scope.cancelled_caught:
                self._fail(Unavailable(StatusCode.UNAVAILABLE, "keepalive watchdog timeout"))
                return

    # -- what calls use -----------------------------------------------------------------------------
    def kick(self) -> None:
        """Hand what the codec has to send to the writer; wake it only when there is something
        (most reads produce nothing to send, and a wake-up is a task switch)."""
        out = self.h2.out
        if not out:
            return
        if not self._outbox and not self._sending and self._fd is not None and self.failure is None:
            # Nothing queued before these bytes: written at once, without waking the writer (a
            # task switch per call). The socket is non-blocking; what it does not take now goes
            # to the writer, after anything else. (``failure`` is set before the socket closes,
            # so the descriptor is still this connection's.)
            try:
                sent = os.write(self._fd, out)
            except OSError:
                sent = 0  # full, or broken: the writer's send meets it and fails the connection
            if sent == len(out):
                out.clear()
                return
            del out[:sent]
        self._outbox += out
        out.clear()
        self._wake_writer.set()

    def _check(self) -> None:
        if self.failure is not None:
            raise self.failure
        if self.goaway:
            raise Unavailable(StatusCode.UNAVAILABLE, "connection is going away")

    async def open(self, headers: list, body: bytes) -> GrpcCall:
        """Start a call (waits for a stream slot under the server's MAX_CONCURRENT_STREAMS and
        for flow-control window to send ``body``)."""
        conn = self.h2
        while True:
            self._check()
            limit = conn.max_concurrent_streams
            if not self.settings_received:
                # Before the server's SETTINGS arrive its limit is unknown: RFC 9113 suggests
                # no less than 100, and going over it gets streams refused.
                limit = min(limit, 100)
            if conn.open_streams < limit:
                break
            await self._changed.park()
        sid = conn.open_stream(headers)
        call = GrpcCall(self, sid, self.max_message_bytes)
        self.calls[sid] = call
        if len(body) <= conn.send_window(sid) and len(body) <= conn.max_frame_size:
            # The usual call: its body fits the window and one frame, sent with its HEADERS.
            conn.send_data(sid, body, end_stream=True)
            self.kick()
            return call
        try:
            await self._send_body(call, body)
        except BaseException:
            # Cancelled (or the connection failed) while the body waited for window: the stream
            # must not stay half-sent on the server.
            self.reset(call, http2.CANCEL)
            raise
        return call

    async def _send_body(self, call: GrpcCall, body: bytes) -> None:
        conn = self.h2
        view = memoryview(body)
        while True:
            if call.state.done:
                return
            window = conn.send_window(call.id)
            if window <= 0 and view:
                self.kick()
                await self._changed.park()
                self._check()
                continue
            size = min(window, len(view))
            last = size == len(view)
            conn.send_data(call.id, view[:size], end_stream=last)
            view = view[size:]
            self.kick()
            if last:
                return

    def acknowledge(self, call: GrpcCall) -> None:
        if self.failure is None and call.unacked:
            self.h2.acknowledge(call.id, call.unacked)
            call.unacked = 0
            self.kick()

    def reset(self, call: GrpcCall, error_code: int) -> None:
        self.calls.pop(call.id, None)
        if self.failure is not None:
            return
        if self.h2.reset(call.id, error_code) and call.unacked:
            # The reset stream's bytes still count against the connection window.
            self.h2.acknowledge(call.id, call.unacked)
            call.unacked = 0
        self._changed.unpark_all()
        self.kick()

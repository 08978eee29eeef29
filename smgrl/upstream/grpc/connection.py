"""One HTTP/2 connection to one engine: the trio shell around h2's state machine.

Three tasks per connection, none per stream: a reader (socket -> h2 events -> each call's
:class:`~smgrl.upstream.grpc.framing.CallState`), a writer (whatever h2 has to send, batched
across streams, flushed when woken), and a keep-alive pinger when asked for. They run as a
trio *system task* (``spawn_system_task``): a channel is made without a nursery, lazily, and
its connection must outlive whichever caller happened to open it; :meth:`close` (or the run's
end) cancels it. Every exception inside is caught and turned into the connection's failure.

Calls change h2's state synchronously and wake the writer, so cancelling a call (RST_STREAM)
never needs an await and works inside an already-cancelled scope.
"""

from __future__ import annotations

import itertools
import math

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import trio

from smgrl.upstream.grpc.framing import CallState
from smgrl.upstream.grpc.status import GrpcError, StatusCode, Unavailable

READ_SIZE = 256 * 1024
STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
_ping_ids = itertools.count(1)


class _H2Client(h2.connection.H2Connection):
    """h2's connection with one change: a graceful GOAWAY (NO_ERROR) leaves it receiving.

    h2 closes its state machine on any GOAWAY and drops what it had to send, so the frames that
    follow raise ProtocolError; but RFC 9113 6.8 lets the streams up to ``last_stream_id`` run
    to their end, and grpcio's graceful shutdown is a GOAWAY, a PING, another GOAWAY, then the
    streams' last frames. An error GOAWAY still closes at once.
    """

    def _receive_goaway_frame(self, frame):
        if frame.error_code != 0:
            return super()._receive_goaway_frame(frame)
        event = h2.events.ConnectionTerminated()
        event.error_code = h2.errors._error_code_from_int(frame.error_code)
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]


class GrpcCall:
    """One stream's side of a call: its response state and the wake-up of the task reading it."""

    __slots__ = ("_conn", "_event", "id", "state", "unacked")

    def __init__(self, conn: GrpcConnection, stream_id: int, max_message_bytes: int):
        self._conn = conn
        self.id = stream_id
        self.state = CallState(max_message_bytes)
        self.unacked = 0
        self._event: trio.Event | None = None

    def wake(self) -> None:
        if self._event is not None:
            self._event.set()

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
            self._event = event = trio.Event()
            with trio.fail_at(deadline):
                await event.wait()
            self._event = None

    def cancel(self, error_code: int = h2.errors.ErrorCodes.CANCEL) -> None:
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
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.h2 = conn = _H2Client(config)
        conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024,
            },
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self.calls: dict[int, GrpcCall] = {}
        self.failure: GrpcError | None = None
        self.goaway = False
        self.settings_received = False
        self.pings_acked = 0
        self._wake_writer = trio.Event()
        self._outbox = bytearray()
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
        return self.failure is None and not self.goaway and self.h2.highest_outbound_stream_id < 2**31 - 1000

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
    async def _reader(self) -> None:
        while True:
            try:
                data = await self.stream.receive_some(READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._fail(Unavailable(StatusCode.UNAVAILABLE, f"Socket closed: {exc}"))
                return
            if not data:
                self._fail(Unavailable(StatusCode.UNAVAILABLE, "Socket closed"))
                return
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                self._fail(GrpcError(StatusCode.INTERNAL, f"HTTP/2 protocol error: {exc}"))
                return
            for event in events:
                self._on_event(event)
            self.kick()
            if self.goaway and not self.calls:
                return

    def _on_event(self, event) -> None:
        calls = self.calls
        if isinstance(event, h2.events.DataReceived):
            call = calls.get(event.stream_id)
            if call is None:
                # A call already gone: give the bytes back to the connection window.
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                return
            call.unacked += event.flow_controlled_length
            call.state.on_data(event.data)
            if call.state.done:
                # A message too large (or malformed): the call ends here, the server is told.
                self.reset(call, h2.errors.ErrorCodes.CANCEL)
            call.wake()
        elif isinstance(event, h2.events.ResponseReceived):
            call = calls.get(event.stream_id)
            if call is not None:
                call.state.on_headers(event.headers)
                call.wake()
        elif isinstance(event, h2.events.TrailersReceived):
            call = calls.get(event.stream_id)
            if call is not None:
                call.state.on_trailers(event.headers)
                call.wake()
        elif isinstance(event, h2.events.StreamEnded):
            call = calls.pop(event.stream_id, None)
            if call is not None:
                call.state.on_end()
                call.wake()
                self._changed.unpark_all()
        elif isinstance(event, h2.events.StreamReset):
            call = calls.pop(event.stream_id, None)
            if call is not None:
                call.state.on_reset(event.error_code)
                call.wake()
                self._changed.unpark_all()
        elif isinstance(event, h2.events.RemoteSettingsChanged):
            self.settings_received = True
            self._changed.unpark_all()
        elif isinstance(event, h2.events.WindowUpdated):
            self._changed.unpark_all()
        elif isinstance(event, h2.events.PingAckReceived):
            self.pings_acked += 1
            self._ping_acked.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self._on_goaway(event)

    def _on_goaway(self, event: h2.events.ConnectionTerminated) -> None:
        # Streams above last_stream_id were never processed (safe to retry elsewhere): they end
        # UNAVAILABLE now; the ones below it run to their end; no new stream starts here.
        self.goaway = True
        last = event.last_stream_id if event.last_stream_id is not None else 0
        detail = f"GOAWAY received (error code {event.error_code})"
        for sid in [sid for sid in self.calls if sid > last]:
            call = self.calls.pop(sid)
            call.state.finish(StatusCode.UNAVAILABLE, detail)
            call.wake()
        if event.error_code != h2.errors.ErrorCodes.NO_ERROR:
            self._fail(Unavailable(StatusCode.UNAVAILABLE, detail))
        self._changed.unpark_all()

    async def _writer(self) -> None:
        while True:
            await self._wake_writer.wait()
            self._wake_writer = trio.Event()
            data, self._outbox = self._outbox, bytearray()
            if data:
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._fail(Unavailable(StatusCode.UNAVAILABLE, f"Socket closed: {exc}"))
                    return

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
        """Hand what h2 has to send to the writer; wake it only when there is something (most
        reads produce nothing to send, and a wake-up is a task switch)."""
        data = self.h2.data_to_send()
        if data:
            self._outbox += data
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
            limit = conn.remote_settings.max_concurrent_streams
            if not self.settings_received:
                # Before the server's SETTINGS arrive its limit is unknown: RFC 9113 suggests
                # no less than 100, and going over it gets streams refused.
                limit = min(limit, 100)
            if conn.open_outbound_streams < limit:
                break
            await self._changed.park()
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, headers)
        call = GrpcCall(self, sid, self.max_message_bytes)
        self.calls[sid] = call
        try:
            await self._send_body(call, body)
        except BaseException:
            # Cancelled (or the connection failed) while the body waited for window: the stream
            # must not stay half-sent on the server.
            self.reset(call, h2.errors.ErrorCodes.CANCEL)
            raise
        return call

    async def _send_body(self, call: GrpcCall, body: bytes) -> None:
        conn = self.h2
        view = memoryview(body)
        while True:
            if call.state.done:
                return
            window = conn.local_flow_control_window(call.id)
            if window <= 0 and view:
                self.kick()
                await self._changed.park()
                self._check()
                continue
            size = min(window, len(view), conn.max_outbound_frame_size)
            last = size == len(view)
            conn.send_data(call.id, view[:size].tobytes(), end_stream=last)
            view = view[size:]
            self.kick()
            if last:
                return

    def acknowledge(self, call: GrpcCall) -> None:
        if self.failure is None and call.unacked:
            try:
                self.h2.acknowledge_received_data(call.unacked, call.id)
            except h2.exceptions.ProtocolError:
                pass
            call.unacked = 0
            self.kick()

    def reset(self, call: GrpcCall, error_code: int) -> None:
        self.calls.pop(call.id, None)
        if self.failure is not None:
            return
        try:
            self.h2.reset_stream(call.id, error_code)
        except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
            pass  # already over on the wire
        else:
            if call.unacked:
                # The reset stream's bytes still count against the connection window.
                self.h2.acknowledge_received_data(call.unacked, call.id)
                call.unacked = 0
        self._changed.unpark_all()
        self.kick()

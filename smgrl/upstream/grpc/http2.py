"""The client side of HTTP/2 as gRPC uses it, as pure code: bytes in, calls on a handler, bytes out.

Hand-written for speed in place of h2's general state machine (which cost the gateway about a
fifth of its CPU per gRPC call: event objects, header validation, frame objects and their
``repr`` for a trace log that is off). Only what a gRPC client meets is here: it opens streams
(HEADERS, then DATA), reads HEADERS/CONTINUATION, DATA, RST_STREAM, SETTINGS, PING, GOAWAY and
WINDOW_UPDATE, and ignores PRIORITY and unknown frame types (RFC 9113 5.5). Server push is off
in our SETTINGS, so a PUSH_PROMISE is a protocol error.

- Request headers are HPACK-encoded with no dynamic table: a pair in the static table is one
  index, any other pair a literal "without indexing" (its name indexed when the static table has
  it). Each encoded pair is cached, so a call's header block is a join of cached bytes. Response
  headers are decoded with ``hpack`` (the server's dynamic table and Huffman strings).
- Flow control: the windows we grant are handed back (WINDOW_UPDATE) once half is consumed, as
  h2 does; the server's windows bound what :meth:`send_data` may send (:meth:`send_window`).
- A stream leaves the table when it is over: both ends closed, reset by either side, or the
  server's END_STREAM (the answer is complete; the rest of a request body is not sent). Frames
  for a stream no longer in the table are dropped (their DATA still counts against the
  connection window, and is handed back).

The differential tests (tests/grpc) run it against grpcio's server, and against h2's server
connection, the library it replaced, byte for byte in memory.
"""

from __future__ import annotations

import hpack
import hpack.table

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    range(10)
)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
S_HEADER_TABLE_SIZE, S_ENABLE_PUSH, S_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
S_INITIAL_WINDOW_SIZE, S_MAX_FRAME_SIZE, S_MAX_HEADER_LIST_SIZE = 0x4, 0x5, 0x6
MAX_WINDOW = 2**31 - 1
DEFAULT_WINDOW = 65535
DEFAULT_FRAME_SIZE = 16384
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, CANCEL = 0x0, 0x1, 0x3, 0x6, 0x8

_STATIC_PAIRS: dict[tuple[bytes, bytes], int] = {}
_STATIC_NAMES: dict[bytes, int] = {}
for _i, (_name, _value) in enumerate(hpack.table.HeaderTable.STATIC_TABLE, start=1):
    _STATIC_PAIRS.setdefault((_name, _value), _i)
    _STATIC_NAMES.setdefault(_name, _i)


class Http2Error(Exception):
    """The server broke HTTP/2: the connection is over (GOAWAY with ``code`` is sent)."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR):
        super().__init__(message)
        self.code = code


def _integer(value: int, prefix_bits: int, flags: int) -> bytes:
    """HPACK's integer with an N-bit prefix (RFC 7541 5.1), ``flags`` in the first byte's high bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((flags | value,))
    out = bytearray((flags | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    return _integer(len(data), 7, 0) + data  # no Huffman: the H bit is 0


def encode_field(name: bytes, value: bytes) -> bytes:
    index = _STATIC_PAIRS.get((name, value))
    if index is not None:
        return _integer(index, 7, 0x80)  # indexed header field
    index = _STATIC_NAMES.get(name)
    if index is not None:
        return _integer(index, 4, 0x00) + _string(value)  # literal without indexing, indexed name
    return b"\x00" + _string(name) + _string(value)  # literal without indexing, new name


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes((kind, flags)) + stream_id.to_bytes(4, "big") + payload


def _skip_integer(block: bytes, i: int, prefix_bits: int) -> tuple[int, int]:
    """(value, next offset) of the HPACK integer at ``i`` (RFC 7541 5.1)."""
    limit = (1 << prefix_bits) - 1
    value = block[i] & limit
    i += 1
    if value == limit:
        shift = 0
        while True:
            byte = block[i]
            i += 1
            value += (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
    return value, i


def table_neutral(block: bytes) -> bool:
    """No field of the block changes the decoder's dynamic table: each is indexed (6.1) or a
    literal without or never indexing (6.2.2, 6.2.3); none is added to the table (6.2.1) or
    resizes it (6.3). Such a block decodes the same for as long as the table is unchanged."""
    i, end = 0, len(block)
    try:
        while i < end:
            first = block[i]
            if first & 0x80:
                _, i = _skip_integer(block, i, 7)
            elif first & 0xE0:  # 01xxxxxx (incremental indexing) or 001xxxxx (size update)
                return False
            else:
                index, i = _skip_integer(block, i, 4)
                for _ in range(1 if index else 2):  # the name (when not indexed), the value
                    length, i = _skip_integer(block, i, 7)
                    i += length
        return i == end
    except IndexError:
        return False


class _Stream:
    __slots__ = ("local_closed", "send_window", "unacked")

    def __init__(self, send_window: int):
        self.send_window = send_window
        self.unacked = 0
        self.local_closed = False


class ClientCodec:
    """One client connection's HTTP/2 state. ``handler`` receives what arrives:

    ``on_headers(sid, headers, end_stream)`` (headers as ``(bytes, bytes)`` pairs),
    ``on_data(sid, data, flow_len, end_stream)``, ``on_reset(sid, code)``, ``on_settings()``,
    ``on_window()``, ``on_ping_ack()``, ``on_goaway(last_stream_id, code)``. ``out`` collects what
    must be sent; the caller takes it (:meth:`take`)."""

    def __init__(self, handler, *, stream_window: int, connection_window: int, max_header_list_size: int):
        self.handler = handler
        self.stream_window = stream_window
        self.connection_window = connection_window
        self.streams: dict[int, _Stream] = {}
        self.highest_stream_id = 0
        self.max_concurrent_streams = 2**31 - 1  # unlimited until the server's SETTINGS say
        self.settings_received = False
        self.max_frame_size = DEFAULT_FRAME_SIZE  # the server's
        self.initial_send_window = DEFAULT_WINDOW  # the server's INITIAL_WINDOW_SIZE
        self.conn_send_window = DEFAULT_WINDOW
        self.conn_unacked = 0
        self.decoder = hpack.Decoder()
        self.decoder.max_header_list_size = max_header_list_size
        self._fields: dict[tuple[bytes, bytes], bytes] = {}
        self._decoded: dict[bytes, tuple[int, list]] = {}
        self._table_changes = 0
        self._buf = bytearray()
        self._headers: tuple[int, int, bytearray] | None = None  # a block awaiting CONTINUATION
        settings = b"".join(
            k.to_bytes(2, "big") + v.to_bytes(4, "big")
            for k, v in (
                (S_ENABLE_PUSH, 0),
                (S_INITIAL_WINDOW_SIZE, stream_window),
                (S_MAX_HEADER_LIST_SIZE, max_header_list_size),
            )
        )
        self.out = bytearray(PREFACE)
        self.out += frame(SETTINGS, 0, 0, settings)
        if connection_window > DEFAULT_WINDOW:
            self.out += frame(WINDOW_UPDATE, 0, 0, (connection_window - DEFAULT_WINDOW).to_bytes(4, "big"))

    def take(self) -> bytes:
        data, self.out = self.out, bytearray()
        return bytes(data)

    @property
    def open_streams(self) -> int:
        return len(self.streams)

    # -- sending ------------------------------------------------------------------------------------

    def _block(self, headers: list[tuple[bytes, bytes]]) -> bytes:
        fields = self._fields
        parts = []
        for pair in headers:
            encoded = fields.get(pair)
            if encoded is None:
                encoded = encode_field(*pair)
                if len(fields) < 4096:  # the constant pairs and recent timeouts; bounded
                    fields[pair] = encoded
            parts.append(encoded)
        return b"".join(parts)

    def open_stream(self, headers: list[tuple[bytes, bytes]], end_stream: bool = False) -> int:
        """A new stream with its HEADERS; returns its id."""
        sid = self.highest_stream_id + 2 if self.highest_stream_id else 1
        self.highest_stream_id = sid
        self.streams[sid] = stream = _Stream(self.initial_send_window)
        stream.local_closed = end_stream
        block = self._block(headers)
        size = self.max_frame_size
        flags = END_STREAM if end_stream else 0
        if len(block) <= size:
            self.out += frame(HEADERS, flags | END_HEADERS, sid, block)
        else:
            self.out += frame(HEADERS, flags, sid, block[:size])
            rest = block[size:]
            while rest:
                piece, rest = rest[:size], rest[size:]
                self.out += frame(CONTINUATION, 0 if rest else END_HEADERS, sid, piece)
        return sid

    def send_window(self, sid: int) -> int:
        """How many body bytes ``sid`` may send now (0 for a stream that is over)."""
        stream = self.streams.get(sid)
        if stream is None or stream.local_closed:
            return 0
        return min(stream.send_window, self.conn_send_window)

    def send_data(self, sid: int, data: bytes, end_stream: bool) -> None:
        """``data`` on ``sid`` (at most :meth:`send_window` bytes, cut into frames here); nothing
        for a stream that is over."""
        stream = self.streams.get(sid)
        if stream is None or stream.local_closed:
            return
        size = self.max_frame_size
        view = memoryview(data)
        while True:
            piece, view = view[:size], view[size:]
            last = not view
            self.out += frame(DATA, END_STREAM if end_stream and last else 0, sid, bytes(piece))
            if last:
                break
        stream.send_window -= len(data)
        self.conn_send_window -= len(data)
        if end_stream:
            stream.local_closed = True

    def reset(self, sid: int, code: int) -> bool:
        """RST_STREAM ``sid`` unless it is over already (False then)."""
        if self.streams.pop(sid, None) is None:
            return False
        self.out += frame(RST_STREAM, 0, sid, code.to_bytes(4, "big"))
        return True

    def acknowledge(self, sid: int, size: int) -> None:
        """``size`` received bytes of ``sid`` consumed: the windows reopen (WINDOW_UPDATE once
        half of one is consumed)."""
        self.conn_unacked += size
        if self.conn_unacked >= self.connection_window // 2:
            self.out += frame(WINDOW_UPDATE, 0, 0, self.conn_unacked.to_bytes(4, "big"))
            self.conn_unacked = 0
        stream = self.streams.get(sid)
        if stream is not None:
            stream.unacked += size
            if stream.unacked >= self.stream_window // 2:
                self.out += frame(WINDOW_UPDATE, 0, sid, stream.unacked.to_bytes(4, "big"))
                stream.unacked = 0

    def ping(self, opaque: bytes) -> None:
        self.out += frame(PING, 0, 0, opaque)

    def goaway(self, code: int) -> None:
        self.out += frame(GOAWAY, 0, 0, self.highest_stream_id.to_bytes(4, "big") + code.to_bytes(4, "big"))

    # -- receiving ----------------------------------------------------------------------------------

    def receive(self, data: bytes) -> None:
        """Bytes from the socket: every whole frame is handled (Http2Error when one breaks
        the protocol)."""
        buf = self._buf
        if buf:
            buf += data
            data = bytes(buf)
            buf.clear()
        view = memoryview(data)
        at, end = 0, len(data)
        limit = DEFAULT_FRAME_SIZE  # we never raise SETTINGS_MAX_FRAME_SIZE
        while end - at >= 9:
            length = int.from_bytes(view[at : at + 3], "big")
            if length > limit:
                raise Http2Error(f"frame of {length} bytes over the {limit} allowed", FRAME_SIZE_ERROR)
            if end - at < 9 + length:
                break
            kind, flags = data[at + 3], data[at + 4]
            sid = int.from_bytes(view[at + 5 : at + 9], "big") & 0x7FFFFFFF
            payload = data[at + 9 : at + 9 + length]
            at += 9 + length
            if self._headers is not None and kind != CONTINUATION:
                raise Http2Error("a header block was interrupted")
            if kind == DATA:
                self._on_data(sid, flags, payload)
            elif kind == HEADERS:
                self._on_headers(sid, flags, payload)
            elif kind == CONTINUATION:
                self._on_continuation(sid, flags, payload)
            elif kind == RST_STREAM:
                self._on_reset(sid, payload)
            elif kind == SETTINGS:
                self._on_settings(sid, flags, payload)
            elif kind == PING:
                self._on_ping(sid, flags, payload)
            elif kind == GOAWAY:
                if sid or len(payload) < 8:
                    raise Http2Error("malformed GOAWAY")
                last = int.from_bytes(payload[:4], "big") & 0x7FFFFFFF
                self.handler.on_goaway(last, int.from_bytes(payload[4:8], "big"))
            elif kind == WINDOW_UPDATE:
                self._on_window(sid, payload)
            elif kind == PUSH_PROMISE:
                raise Http2Error("PUSH_PROMISE received with push disabled")
            # PRIORITY and unknown types: ignored
        if at < end:
            buf += view[at:]

    def _strip_padding(self, flags: int, payload: bytes) -> bytes:
        if flags & PADDED:
            if not payload or payload[0] >= len(payload):
                raise Http2Error("padding longer than the frame")
            return payload[1 : len(payload) - payload[0]]
        return payload

    def _on_data(self, sid: int, flags: int, payload: bytes) -> None:
        if not sid:
            raise Http2Error("DATA on stream 0")
        flow = len(payload)
        body = self._strip_padding(flags, payload)
        if sid not in self.streams:
            if sid > self.highest_stream_id or sid % 2 == 0:
                raise Http2Error(f"DATA on a stream never opened ({sid})")
            self.acknowledge(sid, flow)  # a stream already over: its bytes go back to the window
            return
        end = bool(flags & END_STREAM)
        if end:
            del self.streams[sid]
        self.handler.on_data(sid, body, flow, end)

    def _on_headers(self, sid: int, flags: int, payload: bytes) -> None:
        if not sid:
            raise Http2Error("HEADERS on stream 0")
        block = self._strip_padding(flags, payload)
        if flags & PRIORITY_FLAG:
            block = block[5:]
        if flags & END_HEADERS:
            self._headers_done(sid, flags, block)
        else:
            self._headers = (sid, flags, bytearray(block))

    def _on_continuation(self, sid: int, flags: int, payload: bytes) -> None:
        pending = self._headers
        if pending is None or pending[0] != sid:
            raise Http2Error("CONTINUATION without its HEADERS")
        pending[2].extend(payload)
        if flags & END_HEADERS:
            self._headers = None
            self._headers_done(sid, pending[1], bytes(pending[2]))

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        """A header block's pairs. A block that leaves the dynamic table as it was is cached for as
        long as the table does not change (a server answers most calls with the same few bytes of
        HEADERS and of trailers)."""
        cached = self._decoded.get(block)
        if cached is not None and cached[0] == self._table_changes:
            return cached[1]
        try:
            headers = self.decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise Http2Error(f"bad header block: {exc}", 0x9) from None  # COMPRESSION_ERROR
        if table_neutral(block):
            if len(self._decoded) >= 256:
                self._decoded.clear()
            self._decoded[block] = (self._table_changes, headers)
        else:
            self._table_changes += 1  # the block may have added or evicted table entries
        return headers

    def _headers_done(self, sid: int, flags: int, block: bytes) -> None:
        # Decoded even for a stream that is over: the dynamic table must follow every block.
        headers = self._decode(block)
        if sid not in self.streams:
            if sid > self.highest_stream_id or sid % 2 == 0:
                raise Http2Error(f"HEADERS on a stream never opened ({sid})")
            return
        end = bool(flags & END_STREAM)
        if end:
            del self.streams[sid]
        self.handler.on_headers(sid, headers, end)

    def _on_reset(self, sid: int, payload: bytes) -> None:
        if not sid or len(payload) != 4:
            raise Http2Error("malformed RST_STREAM", FRAME_SIZE_ERROR if sid else PROTOCOL_ERROR)
        if self.streams.pop(sid, None) is not None:
            self.handler.on_reset(sid, int.from_bytes(payload, "big"))

    def _on_settings(self, sid: int, flags: int, payload: bytes) -> None:
        if sid:
            raise Http2Error("SETTINGS on a stream")
        if flags & ACK:
            return
        if len(payload) % 6:
            raise Http2Error("SETTINGS of a length not a multiple of 6", FRAME_SIZE_ERROR)
        for i in range(0, len(payload), 6):
            key = int.from_bytes(payload[i : i + 2], "big")
            value = int.from_bytes(payload[i + 2 : i + 6], "big")
            if key == S_MAX_CONCURRENT_STREAMS:
                self.max_concurrent_streams = value
            elif key == S_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise Http2Error("INITIAL_WINDOW_SIZE over 2^31-1", FLOW_CONTROL_ERROR)
                delta = value - self.initial_send_window
                self.initial_send_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
            elif key == S_MAX_FRAME_SIZE:
                if not DEFAULT_FRAME_SIZE <= value <= 2**24 - 1:
                    raise Http2Error(f"MAX_FRAME_SIZE {value} out of range")
                self.max_frame_size = value
            # HEADER_TABLE_SIZE: our encoder keeps no dynamic table; the rest: nothing to do.
        self.settings_received = True
        self.out += frame(SETTINGS, ACK, 0)
        self.handler.on_settings()

    def _on_ping(self, sid: int, flags: int, payload: bytes) -> None:
        if sid or len(payload) != 8:
            raise Http2Error("malformed PING")
        if flags & ACK:
            self.handler.on_ping_ack()
        else:
            self.out += frame(PING, ACK, 0, payload)

    def _on_window(self, sid: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise Http2Error("malformed WINDOW_UPDATE", FRAME_SIZE_ERROR)
        increment = int.from_bytes(payload, "big") & 0x7FFFFFFF
        if not sid:
            if not increment:
                raise Http2Error("WINDOW_UPDATE of 0 on the connection")
            self.conn_send_window += increment
            if self.conn_send_window > MAX_WINDOW:
                raise Http2Error("connection window over 2^31-1", FLOW_CONTROL_ERROR)
        else:
            stream = self.streams.get(sid)
            if stream is None:
                return
            if not increment or stream.send_window + increment > MAX_WINDOW:
                self.reset(sid, PROTOCOL_ERROR if not increment else FLOW_CONTROL_ERROR)
                self.handler.on_reset(sid, PROTOCOL_ERROR)
                return
            stream.send_window += increment
        self.handler.on_window()

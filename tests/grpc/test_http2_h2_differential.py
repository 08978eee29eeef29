"""The hand-written HTTP/2 client codec (``smgrl.upstream.grpc.http2``) against h2, the library it
replaced: an h2 server connection takes exactly the bytes the codec sends, and the codec takes
exactly the bytes h2 sends back. For any set of calls (several streams at once, request and
answer bodies past the frame size and the flow-control windows, header blocks split into
CONTINUATION frames, answers delivered in arbitrary pieces, a stream the client cancels) h2 sees
the requests as they were made and raises no protocol error, and the codec hands the caller the
headers, bodies and trailers h2 was told to send. Pure: bytes move between two objects in
memory, no socket."""

from __future__ import annotations

import h2.config
import h2.connection
import h2.events
from hypothesis import given, settings
from hypothesis import strategies as st

from smgrl.upstream.grpc.http2 import CANCEL, ClientCodec

STREAM_WINDOW, CONNECTION_WINDOW = 65_535, 262_144


class Recorder:
    """The codec's handler: what arrived per stream; each DATA frame's bytes are consumed at once
    (``acknowledge``), as the gRPC client does once it has read them."""

    def __init__(self) -> None:
        self.codec: ClientCodec | None = None
        self.headers: dict[int, list] = {}
        self.data: dict[int, bytearray] = {}
        self.ended: set[int] = set()
        self.resets: dict[int, int] = {}

    def on_headers(self, sid, headers, end_stream):
        self.headers.setdefault(sid, []).append(list(headers))
        if end_stream:
            self.ended.add(sid)

    def on_data(self, sid, data, flow_len, end_stream):
        self.data.setdefault(sid, bytearray()).extend(data)
        assert self.codec is not None
        self.codec.acknowledge(sid, flow_len)
        if end_stream:
            self.ended.add(sid)

    def on_reset(self, sid, code):
        self.resets[sid] = code

    def on_settings(self):
        pass

    def on_window(self):
        pass

    def on_ping_ack(self):
        pass

    def on_goaway(self, last_stream_id, code):
        raise AssertionError(f"GOAWAY from h2: {code}")


class Pair:
    """The codec and an h2 server connection, joined by a pump that splits each batch of the
    server's bytes at the drawn cut points."""

    def __init__(self, cuts: list[int]) -> None:
        self.recorder = Recorder()
        self.codec = ClientCodec(
            self.recorder, stream_window=STREAM_WINDOW, connection_window=CONNECTION_WINDOW,
            max_header_list_size=1 << 20,
        )  # fmt: skip
        self.recorder.codec = self.codec
        config = h2.config.H2Configuration(client_side=False, header_encoding=None)
        self.server = h2.connection.H2Connection(config=config)
        self.server.initiate_connection()
        self.cuts = cuts or [0]
        self.requests: dict[int, list] = {}
        self.bodies: dict[int, bytearray] = {}
        self.request_ended: set[int] = set()
        self.server_resets: dict[int, int] = {}
        self._cut = 0

    def pump(self) -> None:
        for _ in range(10_000):  # bounded: each round moves bytes one way or the other
            sent = self.codec.take()
            if sent:
                for event in self.server.receive_data(sent):
                    self._on_server_event(event)
            back = self.server.data_to_send()
            if back:
                self._deliver(back)
            if not sent and not back:
                return
        raise AssertionError("the two ends kept exchanging bytes")

    def _deliver(self, data: bytes) -> None:
        at = 0
        while at < len(data):
            self._cut += 1
            size = 1 + self.cuts[self._cut % len(self.cuts)]
            self.codec.receive(data[at : at + size])
            at += size

    def _on_server_event(self, event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self.requests[event.stream_id] = list(event.headers)
        elif isinstance(event, h2.events.DataReceived):
            self.bodies.setdefault(event.stream_id, bytearray()).extend(event.data)
            self.server.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            self.request_ended.add(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            self.server_resets[event.stream_id] = event.error_code

    def send_request_body(self, sid: int, body: bytes) -> None:
        rest = body
        for _ in range(10_000):
            window = self.codec.send_window(sid)
            if window:
                piece, rest = rest[:window], rest[window:]
                self.codec.send_data(sid, piece, end_stream=not rest)
            self.pump()
            if not rest:
                return
        raise AssertionError("the request body never fit the windows")

    def answer(self, sid: int, headers, body: bytes, trailers) -> None:
        self.server.send_headers(sid, headers)
        rest = body
        for _ in range(10_000):
            if not rest:
                break
            window = min(self.server.local_flow_control_window(sid), self.server.max_outbound_frame_size)
            if window:
                piece, rest = rest[:window], rest[window:]
                self.server.send_data(sid, piece)
            self.pump()
        self.server.send_headers(sid, trailers, end_stream=True)
        self.pump()


_token = st.binary(min_size=1, max_size=12).map(lambda b: bytes(97 + x % 26 for x in b))
_value = st.binary(max_size=40).map(lambda b: bytes(32 + x % 95 for x in b).strip() or b"v")
_extra = st.lists(st.tuples(_token.map(lambda t: b"x-" + t), _value), max_size=4)
_call = st.fixed_dictionaries(
    {
        "path": _token.map(lambda t: b"/svc/" + t),
        "extra": _extra,
        "big_header": st.booleans(),  # a header block past one frame: CONTINUATION frames
        "request": st.integers(0, 150_000),
        "answer": st.integers(0, 300_000),
        "cancel": st.booleans(),
    }
)


@settings(max_examples=60)
@given(st.lists(_call, min_size=1, max_size=4), st.lists(st.integers(0, 20_000), max_size=6))
def test_the_codec_and_h2_agree_on_every_call(calls, cuts):
    pair = Pair(cuts)
    pair.pump()  # prefaces and SETTINGS both ways
    opened = []
    for i, call in enumerate(calls):
        headers = [(b":method", b"POST"), (b":scheme", b"http"), (b":path", call["path"]),
                   (b":authority", b"engine:1"), (b"content-type", b"application/grpc"), (b"te", b"trailers"),
                   *call["extra"]]  # fmt: skip
        if call["big_header"]:
            headers.append((b"x-big", b"b" * 20_000))
        sid = pair.codec.open_stream(headers, end_stream=call["request"] == 0)
        opened.append((sid, headers, bytes([i % 251]) * call["request"]))
        pair.pump()
    for sid, headers, body in opened:  # several streams open at once, bodies sent one by one
        if body:
            pair.send_request_body(sid, body)
    for (sid, headers, body), call in zip(opened, calls, strict=True):
        assert pair.requests[sid] == headers  # h2 decoded the codec's header block as sent
        assert bytes(pair.bodies.get(sid, b"")) == body
        assert sid in pair.request_ended
        answer = bytes([(sid * 7) % 251]) * call["answer"]
        status = [(b":status", b"200"), (b"content-type", b"application/grpc")]
        trailers = [(b"grpc-status", b"0"), (b"grpc-message", b"ok")]
        if call["cancel"]:
            pair.server.send_headers(sid, status)
            pair.pump()
            assert pair.codec.reset(sid, CANCEL)
            pair.pump()
            assert pair.server_resets[sid] == CANCEL
            continue
        pair.answer(sid, status, answer, trailers)
        assert pair.recorder.headers[sid] == [status, trailers]
        assert bytes(pair.recorder.data.get(sid, b"")) == answer
        assert sid in pair.recorder.ended
    assert pair.codec.open_streams == 0
    assert not pair.recorder.resets

"""The pure layer: length-prefixed messages cut at any byte, and one call's status from its h2
events (no sockets)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smgrl.upstream.grpc.framing import CallState, FramingError, MessageDecoder, encode, encode_timeout
from smgrl.upstream.grpc.status import StatusCode, decode_message, encode_message

messages = st.lists(st.binary(max_size=300), max_size=12)


@settings(max_examples=150, deadline=None)
@given(messages, st.data())
def test_any_split_gives_back_the_messages(msgs, data):
    wire = b"".join(encode(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=20)))
    pieces = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    decoder = MessageDecoder()
    out = []
    for piece in pieces:
        out.extend(decoder.feed(piece))
    assert out == msgs
    assert decoder.pending == 0


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 5000), st.integers(0, 5000), st.integers(1, 64))
def test_size_limit_is_judged_from_the_header(size, limit, step):
    wire = encode(b"z" * size)
    decoder = MessageDecoder(max_message_bytes=limit)
    got = []
    try:
        for i in range(0, len(wire), step):
            got.extend(decoder.feed(wire[i : i + step]))
    except FramingError as exc:
        assert exc.code == StatusCode.RESOURCE_EXHAUSTED
        assert size > limit
        return
    assert size <= limit and got == [b"z" * size]


def test_compressed_message_without_encoding_is_internal():
    with pytest.raises(FramingError) as info:
        MessageDecoder().feed(b"\x01\x00\x00\x00\x01x")
    assert info.value.code == StatusCode.INTERNAL


@given(st.floats(0, 1e9, allow_nan=False))
def test_timeout_header_never_shortens_the_deadline(seconds):
    text = encode_timeout(seconds)
    value, unit = int(text[:-1]), text[-1]
    scale = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "S": 1, "M": 60, "H": 3600}[unit]
    assert len(text) <= 9 and value * scale >= seconds * (1 - 1e-12)


@given(st.text())
def test_grpc_message_round_trips(text):
    assert decode_message(encode_message(text).encode("ascii")) == text


OK_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]


def test_status_from_trailers():
    call = CallState()
    call.on_headers(OK_HEADERS)
    call.on_data(encode(b"one") + encode(b"tw"))
    call.on_data(b"")
    call.on_trailers([(b"grpc-status", b"5"), (b"grpc-message", b"not%20here"), (b"x-k", b"v")])
    assert list(call.messages) == [b"one", b"tw"]
    assert call.status == (StatusCode.NOT_FOUND, "not here")
    assert call.trailers == (("x-k", "v"),)


def test_blocks_seen_before_are_read_as_the_first_time_per_call():
    # The same response headers and trailers on every call (a server's usual answer) are read
    # once; what depends on the call itself is still decided per call.
    trailers = [(b"grpc-status", b"0"), (b"x-k", b"v")]
    for _ in range(3):
        whole = CallState()
        whole.on_headers(OK_HEADERS)
        whole.on_data(encode(b"m"))
        whole.on_headers(trailers)
        assert (whole.status, whole.trailers, list(whole.messages)) == (
            (StatusCode.OK, ""),
            (("x-k", "v"),),
            [b"m"],
        )
        assert whole.headers == ((":status", "200"), ("content-type", "application/grpc"))
        cut = CallState()
        cut.on_headers(OK_HEADERS)
        cut.on_data(encode(b"message")[:-2])  # the same OK trailers, but inside a message
        cut.on_headers(trailers)
        assert cut.status == (StatusCode.INTERNAL, "stream ended inside a message")
        refused = CallState()
        refused.on_headers([(b":status", b"200"), (b"content-type", b"text/html")])
        assert refused.status == (StatusCode.UNKNOWN, "invalid content-type 'text/html'")


def test_trailers_only_answer():
    call = CallState()
    call.on_headers([*OK_HEADERS, (b"grpc-status", b"12"), (b"grpc-message", b"Method not found!")])
    assert call.status == (StatusCode.UNIMPLEMENTED, "Method not found!")


@pytest.mark.parametrize(
    ("http", "code"), [(b"404", StatusCode.UNIMPLEMENTED), (b"503", StatusCode.UNAVAILABLE)]
)
def test_http_status_without_grpc_status(http, code):
    call = CallState()
    call.on_headers([(b":status", http)])
    assert call.status[0] == code


def test_end_inside_a_message_or_without_trailers():
    call = CallState()
    call.on_headers(OK_HEADERS)
    call.on_data(encode(b"whole")[:3])
    call.on_trailers([(b"grpc-status", b"0")])
    assert call.status[0] == StatusCode.INTERNAL
    call = CallState()
    call.on_headers(OK_HEADERS)
    call.on_end()
    assert call.status[0] == StatusCode.INTERNAL


def test_refused_stream_is_retryable_only_before_an_answer():
    call = CallState()
    call.on_reset(7)
    assert call.refused and call.status[0] == StatusCode.UNAVAILABLE
    call = CallState()
    call.on_headers(OK_HEADERS)
    call.on_reset(7)
    assert not call.refused


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("grpc://127.0.0.1:30001", ("127.0.0.1", 30001)),
        ("grpc://h:5@2", ("h", 5)),
        ("grpc://[::1]:7/x", ("::1", 7)),
        ("grpcs://engine.local:443", ("engine.local", 443)),
    ],
)
def test_address_of_grpc_urls(url, address):
    from smgrl.upstream.grpc import address_of

    assert address_of(url) == address


@pytest.mark.parametrize("url", ["grpc://h", "grpc://h:x", "grpc://:5", "grpc://h:70000", "grpc://[::1]"])
def test_address_of_refuses_urls_without_host_port(url):
    from smgrl.upstream.grpc import address_of

    with pytest.raises(ValueError):
        address_of(url)

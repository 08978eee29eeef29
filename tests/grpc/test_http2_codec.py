"""The hand-written HTTP/2 codec's header coding against the ``hpack`` reference: request headers
it encodes decode to what was given; response blocks it decodes (with its reuse of blocks that
leave the table unchanged) give what a fresh ``hpack`` decoder gives, block after block, whatever
the encoder indexed, resized or left literal. The codec's wire behaviour is in
test_differential.py, against grpcio's server."""

from __future__ import annotations

import hpack
from hypothesis import given, settings
from hypothesis import strategies as st

from smgrl.upstream.grpc import http2

NAMES = st.sampled_from([b":status", b"content-type", b"grpc-status", b"grpc-message", b"x-why", b"te",
                         b"grpc-accept-encoding", b"user-agent"])  # fmt: skip
VALUES = st.sampled_from([b"200", b"0", b"", b"application/grpc", b"identity, gzip", b"a" * 130, b"\xff"])
HEADERS = st.lists(st.tuples(NAMES, VALUES), min_size=1, max_size=6)


class _Sink:
    def __getattr__(self, name):
        return lambda *args: None


def _codec() -> http2.ClientCodec:
    return http2.ClientCodec(
        _Sink(), stream_window=1 << 22, connection_window=1 << 26, max_header_list_size=1 << 16
    )


@settings(max_examples=200, deadline=None)
@given(HEADERS)
def test_request_headers_decode_to_what_was_given(headers):
    block = _codec()._block(headers)
    assert hpack.Decoder().decode(block, raw=True) == headers


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(HEADERS, st.sampled_from(["index", "never", "resize"]), st.integers(1, 4)),
                min_size=1, max_size=10))  # fmt: skip
def test_decoded_blocks_equal_a_fresh_decoder_block_after_block(lists):
    # Each header list encoded a few times in a row (a server answering many calls alike gives
    # the same bytes once its table holds them), the encoder's table changing in between.
    encoder = hpack.Encoder()
    codec, reference = _codec(), hpack.Decoder()
    for headers, how, times in lists:
        if how == "resize":
            encoder.header_table_size = 256 if encoder.header_table_size == 4096 else 4096
        if how == "never":
            headers = [hpack.NeverIndexedHeaderTuple(k, v) for k, v in headers]
        for _ in range(times):
            block = encoder.encode(headers, huffman=True)
            assert codec._decode(block) == reference.decode(block, raw=True)

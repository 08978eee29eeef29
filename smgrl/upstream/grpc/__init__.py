"""gRPC to inference engines, on trio over a hand-written HTTP/2 client codec (no asyncio, no
thread per stream).

- ``framing``: length-prefixed messages and one call's response state, pure (headers, data,
  trailers, end and reset of its stream in).
- ``http2``: the client side of HTTP/2 as gRPC uses it, pure (bytes in, a handler called, bytes out).
- ``connection``: one HTTP/2 connection: reader, writer and keep-alive tasks; flow control,
  MAX_CONCURRENT_STREAMS, GOAWAY, RST_STREAM on cancel.
- ``channel``: :class:`Channel`, calls to one engine (lazy connect, reconnect, deadlines);
  ``channels``: :class:`ChannelSet`, one channel per engine address.
- ``status``: :class:`StatusCode` and the error tree (:class:`GrpcError` >
  :class:`DeadlineExceeded`, :class:`Unavailable`).
- ``engines``: the engine RPCs of each wire (SGLang, vLLM upstream, vLLM PSRL, TokenSpeed).
- ``protos``: PSRL's vLLM messages, generated (``protos/regen.py``).
"""

from smgrl.upstream.grpc.channel import Channel, Stream
from smgrl.upstream.grpc.channels import ChannelSet, address_of
from smgrl.upstream.grpc.status import DeadlineExceeded, GrpcError, StatusCode, Unavailable

__all__ = [
    "Channel",
    "ChannelSet",
    "DeadlineExceeded",
    "GrpcError",
    "StatusCode",
    "Stream",
    "Unavailable",
    "address_of",
]

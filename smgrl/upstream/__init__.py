"""HTTP/1.1 to inference engines: one small keep-alive pool per engine, built on trio streams.

- ``http11``: the protocol as pure code (request bytes out, response events in), no I/O.
- ``connection``: one TCP/TLS connection: open, idle check, synchronous close.
- ``pool``: ``EnginePool`` (one per engine origin) and ``PoolSet``.
- ``response``: ``Response``, the head plus the body read on demand.
- ``batch``: ``Batch``, many exchanges on kept-alive connections driven by one task (fan-outs).
- ``errors``: ``UpstreamError`` > ``ConnectError`` / ``ReadError`` > ``ProtocolError``.
- ``psmanager``: PSRL's PSManager over gRPC (``PSManager``), on the gRPC client (``grpc/``).

gRPC (``upstream/grpc/``): ``Channel``, the wires and their RPCs (``EngineClient``, ``WIRES``),
the error tree (``GrpcError``, ``StatusCode``).

The HTTP/1.1 client: no HTTP/2, no redirects, no proxies, no decompression, no timeouts (the caller's cancel scopes
bound every call; every await here is cancellation-safe).
"""

from smgrl.upstream.batch import Batch, Done
from smgrl.upstream.errors import ConnectError, ProtocolError, ReadError, UpstreamError
from smgrl.upstream.grpc import Channel, ChannelSet, GrpcError, StatusCode, address_of
from smgrl.upstream.grpc.engines import WIRES, EngineClient, TokenizerMismatch, Wire
from smgrl.upstream.http11 import request_wants_close, serialize_request
from smgrl.upstream.pool import EnginePool, PoolSet
from smgrl.upstream.psmanager import InvalidPsManagerAddress, PSManager, PSManagerError, parse_ps_manager_addr
from smgrl.upstream.response import Response

__all__ = [
    "WIRES",
    "Batch",
    "Channel",
    "ChannelSet",
    "ConnectError",
    "Done",
    "EngineClient",
    "EnginePool",
    "GrpcError",
    "InvalidPsManagerAddress",
    "PSManager",
    "PSManagerError",
    "PoolSet",
    "ProtocolError",
    "ReadError",
    "Response",
    "StatusCode",
    "TokenizerMismatch",
    "UpstreamError",
    "Wire",
    "address_of",
    "parse_ps_manager_addr",
    "request_wants_close",
    "serialize_request",
]

"""HTTP/1.1 to inference engines: one small keep-alive pool per engine, built on trio streams.

- ``http11``: the protocol as pure code (request bytes out, response events in), no I/O.
- ``connection``: one TCP/TLS connection: open, idle check, synchronous close.
- ``pool``: ``EnginePool`` (one per engine origin) and ``PoolSet``.
- ``response``: ``Response``, the head plus the body read on demand.
- ``errors``: ``UpstreamError`` > ``ConnectError`` / ``ReadError`` > ``ProtocolError``.
- ``psmanager``: PSRL's PSManager over gRPC (``PSManager``), on the gRPC client (``grpc/``).

No HTTP/2, no redirects, no proxies, no decompression, no timeouts (the caller's cancel scopes
bound every call; every await here is cancellation-safe).
"""

from smgrl.upstream.errors import ConnectError, ProtocolError, ReadError, UpstreamError
from smgrl.upstream.pool import EnginePool, PoolSet
from smgrl.upstream.psmanager import InvalidPsManagerAddress, PSManager, PSManagerError, parse_ps_manager_addr
from smgrl.upstream.response import Response

__all__ = [
    "ConnectError",
    "EnginePool",
    "InvalidPsManagerAddress",
    "PSManager",
    "PSManagerError",
    "PoolSet",
    "ProtocolError",
    "ReadError",
    "Response",
    "UpstreamError",
    "parse_ps_manager_addr",
]

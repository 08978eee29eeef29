"""PSRL's PSManager over gRPC (``psrl.state.PSManagerState``), on smgrl's trio gRPC client.

- ``client``: :class:`PSManager`, the fork's calls, each bounded; failures are
  :class:`PSManagerError`.
- ``psrl_manager_pb2``: the messages, generated from the fork's ``.proto`` (``regen.py``; the
  ``.proto`` is checked in byte for byte as ``psrl_manager.proto.orig``).
"""

from smgrl.upstream.psmanager.client import (
    InvalidPsManagerAddress,
    PSManager,
    PSManagerError,
    parse_ps_manager_addr,
)

__all__ = ["InvalidPsManagerAddress", "PSManager", "PSManagerError", "parse_ps_manager_addr"]

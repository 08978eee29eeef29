"""Kept so that ``smgrl.dataplane.testing`` still imports: the helpers live in :mod:`smgrl.testing.dataplane`.

A public import path (users import it in their tests); nothing inside smgrl imports this module.
"""

from smgrl.testing.dataplane import (  # noqa: F401 - re-exported
    PROBE_MODEL,
    ChunkWriter,
    Loopback,
    ScriptedEngine,
    Seen,
    gateway_on_loopback,
)

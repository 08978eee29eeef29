"""The smgrl event journal: an append-only event store with a hash chain (SQLite, PostgreSQL, memory).

Everything the gateway knows is a projection of this journal. The public surface, re-exported
here explicitly (the submodules are the implementation):

* events: :class:`Event`, :func:`event_type`, :func:`encode`, :func:`decode`, :class:`UnknownEvent`,
  :class:`Recorded`, and :class:`ControlStarted` (the one event the file format knows); the
  catalogue of smgrl's events is ``smgrl.events``, apart from the store
* stores: :class:`SqliteStore` (the file), :class:`MemoryStore` (tests), both :class:`EventStore`;
  :class:`Append` (one event to append, with its secrets), :class:`VerifyReport`
* writing from trio: :class:`JournalWriter` (group commit), :class:`Pending`
* errors: :class:`JournalError` and its subclasses (see ``journal/errors.py`` for the tree)
* ownership: :class:`JournalLock` (one gateway per file, or one group of processes; ``journal/lock.py``),
  :class:`JournalLocked`
* several writers: :class:`Expect` and :class:`JournalConflict` (conditional append),
  :class:`Lease` and :class:`LeaseLost` (duties run once), :class:`ChangeWatcher` (tail wake-up),
  :class:`PgStore` (PostgreSQL) and :func:`open_store` (a ``--journal`` value to its store);
  docs/journal.md, "Several writers"
* the hash of a stored snapshot: :func:`snapshot_hash` (``smgrl journal`` checks snapshots with it)
"""

from ._chain import snapshot_hash
from .base import Append, EventStore, Expect, Lease, RawRow, VerifyReport
from .codec import (
    ControlStarted,
    Event,
    Recorded,
    UnknownEvent,
    decode,
    decode_parsed,
    encode,
    event_class,
    event_type,
    event_types,
)
from .errors import (
    JournalBusyError,
    JournalClosedError,
    JournalConflict,
    JournalCorrupt,
    JournalError,
    JournalForeignError,
    JournalFullError,
    JournalReadOnlyError,
    JournalTooNewError,
    JournalUnreachable,
    JournalWriteError,
    LeaseLost,
    ProjectionError,
)
from .lock import JournalLock, JournalLocked
from .memory import MemoryStore
from .opening import describe, is_postgres_url, open_store
from .postgres import PgStore
from .store import SqliteStore

# JournalWriter and Pending need trio (0.15 s to import): loaded when first used, so a process
# that only reads the file (``smgrl journal``) does not pay for it.
_LAZY = {"JournalWriter": "writer", "Pending": "writer", "ChangeWatcher": "watch"}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# The package's face in one list (names from several modules; journal/codec.py lists its own).
__all__ = [
    "Append",
    "ChangeWatcher",
    "ControlStarted",
    "Event",
    "EventStore",
    "Expect",
    "JournalBusyError",
    "JournalClosedError",
    "JournalConflict",
    "JournalCorrupt",
    "JournalError",
    "JournalForeignError",
    "JournalFullError",
    "JournalLock",
    "JournalLocked",
    "JournalReadOnlyError",
    "JournalTooNewError",
    "JournalUnreachable",
    "JournalWriteError",
    "JournalWriter",
    "Lease",
    "LeaseLost",
    "MemoryStore",
    "Pending",
    "PgStore",
    "ProjectionError",
    "RawRow",
    "Recorded",
    "SqliteStore",
    "UnknownEvent",
    "VerifyReport",
    "decode",
    "decode_parsed",
    "describe",
    "encode",
    "event_class",
    "event_type",
    "event_types",
    "is_postgres_url",
    "open_store",
    "snapshot_hash",
]

"""The journal's exceptions: a small tree under one root, named after the state of the journal.

::

    JournalError                    code "journal_error"        root: catch this to catch them all
     ├── JournalWriteError          code "journal_unavailable"  a batch could not be committed
     │    │                                                     (disk full, read-only file, I/O error);
     │    │                                                     nothing was written for it, the writer
     │    │                                                     keeps running and later batches may succeed
     │    └── JournalClosedError    code "journal_unavailable"  the writer is closing or closed: the
     │                                                          event was not accepted at all
     └── JournalReadOnlyError       code "journal_read_only"    a write on a store opened read-only

``code`` is a stable machine-readable string: the HTTP layer puts it in its error envelope (a
``journal_unavailable`` maps to 503), so it must never change once released. Tamper evidence is
not an exception: ``verify()`` returns a report.
"""

from __future__ import annotations

__all__ = ["JournalClosedError", "JournalError", "JournalReadOnlyError", "JournalWriteError"]


class JournalError(Exception):
    """Root of every error the journal raises on purpose."""

    code: str = "journal_error"


class JournalWriteError(JournalError):
    """The batch holding this event failed to commit; the event is not in the journal.

    The underlying error (usually a ``sqlite3.OperationalError``) is chained as ``__cause__``.
    """

    code = "journal_unavailable"


class JournalClosedError(JournalWriteError):
    """The writer no longer accepts events (``aclose()`` was called or its task was cancelled)."""


class JournalReadOnlyError(JournalError):
    """The store was opened read-only (e.g. by the CLI while the gateway runs)."""

    code = "journal_read_only"

"""The journal's exceptions: a small tree under one root, named after the state of the journal.

::

    JournalError                    code "journal_error"        root: catch this to catch them all
     ├── JournalWriteError          code "journal_unavailable"  a batch could not be committed
     │    │                                                     (disk full, read-only file, I/O error);
     │    │                                                     nothing was written for it, the writer
     │    │                                                     keeps running and later batches may succeed
     │    ├── JournalClosedError    code "journal_unavailable"  the writer is closing or closed: the
     │    │                                                     event was not accepted at all
     │    ├── JournalFullError      code "journal_unavailable"  ``append_nowait`` found the writer's queue
     │    │                                                     full (its bound holds for every path)
     │    ├── JournalUnreachable    code "journal_unavailable"  catching up with other processes failed
     │    │                                                     (the store could not be read); nothing
     │    │                                                     was applied, a later call retries
     │    └── ProjectionError       code "journal_unavailable"  the batch committed but applying it to
     │                                                          the projections failed: the writer
     │                                                          stops (fail-stop, see writer.py)
     ├── JournalBusyError           code "journal_busy"         ``append_batch(wait=0)`` found SQLite's
     │                                                          write lock taken (the writer then waits
     │                                                          for it in its thread; never raised to
     │                                                          appenders)
     ├── JournalReadOnlyError       code "journal_read_only"    a write on a store opened read-only
     ├── JournalForeignError        code "journal_foreign"      the file is not an smgrl journal (not
     │                                                          SQLite, or another application's
     │                                                          database): it is never modified
     ├── JournalTooNewError         code "journal_too_new"      written by a newer smgrl (format or
     │                                                          migrations this code does not know)
     ├── JournalCorrupt             code "journal_corrupt"      a stored row no smgrl wrote (a text
     │                                                          ``ts``...): edited outside the journal;
     │                                                          ``seq`` names it (``verify`` says more)
     ├── JournalConflict            code "journal_conflict"     a conditional append found the position
     │                                                          it was decided on moved: nothing was
     │                                                          written; ``head`` says where to catch up to
     ├── LeaseLost                  code "journal_lease_lost"   renewing or releasing a lease this holder
     │                                                          no longer holds (expired and taken over)
     └── JournalLocked              code "journal_locked"       another gateway owns the file
                                                                (``journal/lock.py``)

``code`` is a stable machine-readable string: the HTTP layer puts it in its error envelope (a
``journal_unavailable`` maps to 503), so it must never change once released. Tamper evidence is
not an exception: ``verify()`` returns a report.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "JournalBusyError",
    "JournalClosedError",
    "JournalConflict",
    "JournalCorrupt",
    "JournalError",
    "JournalForeignError",
    "JournalFullError",
    "JournalReadOnlyError",
    "JournalTooNewError",
    "JournalUnreachable",
    "JournalWriteError",
    "LeaseLost",
    "ProjectionError",
]


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


class JournalFullError(JournalWriteError):
    """``append_nowait`` refused an event: the writer's queue holds ``max_queue`` events already."""


class JournalCorrupt(JournalError):
    """A row read from the store holds what no smgrl writes (a ``ts`` that is not a number):
    it was edited outside the journal. ``seq`` names the row."""

    code = "journal_corrupt"

    def __init__(self, message: str, *, seq: int) -> None:
        super().__init__(message)
        self.seq = seq


class JournalUnreachable(JournalWriteError):
    """``catch_up()`` could not read what other processes appended (a lost connection, a server
    restarting). Nothing was applied; the projections stay where they were, and the next call
    (the tail retries on its own) reads the same range again."""


class ProjectionError(JournalWriteError):
    """A committed batch could not be applied to the in-memory projections.

    The events ARE in the journal; memory no longer matches it, so the writer stops (the gateway
    with it) rather than serve a projection that misses events. A restart replays the journal.
    """


class JournalBusyError(JournalError):
    """Another connection holds SQLite's write lock and the caller asked not to wait for it."""

    code = "journal_busy"


class JournalReadOnlyError(JournalError):
    """The store was opened read-only (e.g. by the CLI while the gateway runs)."""

    code = "journal_read_only"


class JournalForeignError(JournalError):
    """The file is not an smgrl journal: not an SQLite database, or a non-empty database of some
    other application. Nothing was written to it."""

    code = "journal_foreign"


class JournalTooNewError(JournalError):
    """The journal was written by a newer smgrl (a newer ``format_version`` or migrations this code
    does not know): this code does not write it."""

    code = "journal_too_new"


class JournalConflict(JournalError):
    """A conditional append (``append_batch(..., expect=...)``) found that events matching its
    condition were appended after the position it was decided on: nothing was written.

    ``head`` is the journal's head (seq) seen inside the refused transaction and ``seq`` the last
    matching event's seq: read up to ``head``, decide again, append again.
    """

    code = "journal_conflict"

    def __init__(self, message: str, *, head: int, seq: int) -> None:
        super().__init__(message)
        self.head = head
        self.seq = seq

    def __reduce__(
        self,
    ) -> tuple[Any, tuple[Any, ...]]:  # pickles (crosses a process boundary) with its fields
        return (_conflict, (str(self), self.head, self.seq))


def _conflict(message: str, head: int, seq: int) -> JournalConflict:
    return JournalConflict(message, head=head, seq=seq)


class LeaseLost(JournalError):
    """``renew``/``release`` of a lease this holder does not hold (any more): it expired and another
    holder took it, or it was never taken. The duty it guarded must stop at once."""

    code = "journal_lease_lost"

"""What every projection's snapshot contract shares (``to_snapshot`` / ``from_snapshot``).

Each projection copies its own state into a snapshot value (``to_snapshot``: cheap, on the event
loop, so it is consistent with the fold) and rebuilds itself from the decoded JSON
(``from_snapshot``); ``smgrl.state.snapshot`` only composes them. A projection refuses a record it
does not fully understand with :class:`SnapshotError`: a snapshot is a cache, and replaying from an
older one or from scratch is always correct.
"""

from __future__ import annotations

from typing import Any


class SnapshotError(ValueError):
    """The snapshot cannot be loaded (unknown format, or a shape this code does not know)."""


def exact_record(record: dict[str, Any], fields: frozenset[str], what: str) -> dict[str, Any]:
    """``record`` when it is a dict whose keys are all in ``fields``, else SnapshotError."""
    # A key this code does not know means the snapshot describes a state it cannot hold.
    if not isinstance(record, dict) or set(record) - fields:
        raise SnapshotError(f"unexpected {what} record in snapshot")
    return record

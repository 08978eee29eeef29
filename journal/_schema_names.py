"""What the journal's SQLite schema is called, without the migrations themselves.

``journal/_schema.py`` holds the migrations (``sqlite_utils.Migrations``); importing it imports
``sqlite_utils`` and its dependencies (about 0.08 s of CPU). A read-only open only needs the names
to check a file against (``journal/store.py``), so every ``smgrl journal`` reader skips that.
"""

from __future__ import annotations

import datetime
import uuid

from ._chain import GENESIS

FORMAT_VERSION = 1

MIGRATION_SET = "smgrl.journal"  # the ``migration_set`` of our rows in ``_sqlite_migrations``
# Every migration name, in order: Migrations has no public list of what is registered, and the store
# must tell "a newer smgrl wrote this file" (applied names we do not know) from "needs migrating".
# A test checks this against the set.
MIGRATION_NAMES = ("0001_create_journal", "0002_leases", "0003_op_index")


def initial_meta(now: str | None = None) -> list[tuple[str, str]]:
    """The ``meta`` rows of a new journal (SQLite's migration and journal/postgres.py's)."""
    return [
        ("journal_id", uuid.uuid4().hex),
        ("created_at", now or datetime.datetime.now(datetime.UTC).isoformat()),
        ("format_version", str(FORMAT_VERSION)),
        ("high_water_seq", "0"),
        ("high_water_hash", GENESIS),
        ("bodies_compacted_before", "0"),
    ]

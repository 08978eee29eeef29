"""The journal's SQLite schema, as ``sqlite_utils.Migrations`` (set ``smgrl.journal``).

Explicit DDL rather than ``table.create()``: exact column types (REAL, not FLOAT) and comments that
show up in ``sqlite-utils schema`` and datasette. The schema is described in ``journal/store.py``.
Add a migration by appending a function here AND its name to ``MIGRATION_NAMES``
(``journal/_schema_names.py``); never edit an
applied one.
"""

from __future__ import annotations

import sqlite_utils

from . import opindex
from ._schema_names import FORMAT_VERSION, MIGRATION_NAMES, MIGRATION_SET, initial_meta

__all__ = ["FORMAT_VERSION", "MIGRATIONS", "MIGRATION_NAMES"]

MIGRATIONS = sqlite_utils.Migrations(MIGRATION_SET)


@MIGRATIONS(name="0001_create_journal")
def _create_journal(db: sqlite_utils.Database) -> None:
    db.execute(
        """CREATE TABLE events (
    seq INTEGER PRIMARY KEY, -- global position: 1, 2, 3 ... without gaps
    ts REAL NOT NULL, -- commit time of the batch, unix seconds, never decreasing
    stream TEXT NOT NULL,
    type TEXT NOT NULL,
    schema INTEGER NOT NULL,
    payload TEXT NOT NULL, -- canonical JSON of the event
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL -- sha256 chain, see journal/_chain.py
)"""
    )
    db.execute("CREATE INDEX idx_events_stream_seq ON events (stream, seq)")
    db.execute("CREATE INDEX idx_events_type_seq ON events (type, seq)")
    db.execute("CREATE INDEX idx_events_ts ON events (ts)")
    db.execute(
        """CREATE TABLE secrets (
    worker_id TEXT PRIMARY KEY,
    api_key TEXT NOT NULL, -- never exported, never printed
    seq INTEGER REFERENCES events(seq) -- the event that set it
)"""
    )
    db.execute(
        """CREATE TABLE snapshots (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    upto_seq INTEGER NOT NULL,
    ts REAL NOT NULL,
    state TEXT NOT NULL, -- JSON
    hash TEXT NOT NULL -- sha256 over kind, upto_seq, the chain hash at upto_seq and state
)"""
    )
    db.execute("CREATE INDEX idx_snapshots_kind_upto_seq ON snapshots (kind, upto_seq)")
    db.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    db.conn.executemany("INSERT INTO meta (key, value) VALUES (?, ?)", initial_meta())


@MIGRATIONS(name="0002_leases")
def _leases(db: sqlite_utils.Database) -> None:
    db.execute(
        """CREATE TABLE leases (
    name TEXT PRIMARY KEY, -- a duty that must run in one process (journal/lease.py)
    holder TEXT NOT NULL, -- '' once released
    expires REAL NOT NULL, -- unix seconds
    epoch INTEGER NOT NULL -- +1 at each change of holder (a fencing token)
)"""
    )


@MIGRATIONS(name="0003_op_index")
def _op_index(db: sqlite_utils.Database) -> None:
    """The derived operation index (``journal/opindex.py``), back-filled from the events in the
    migration's transaction: a crash leaves the journal as it was, and the next open retries."""
    for statement in opindex.CREATE:
        db.execute(statement)
    opindex.rebuild(db.conn, db.conn)

"""``smgrl journal`` on a PostgreSQL journal: every subcommand reads an SQLite copy of it.

The subcommands read the journal through SQL of SQLite's dialect (``sqlview``, ``opscan``,
``history``: json_extract, the schema of journal/store.py). Rather than a second dialect of each,
a ``postgresql://`` journal is copied, in ONE repeatable-read transaction (a consistent view while
gateways append), into a temporary SQLite journal with the same rows, hashes, snapshots and meta,
WITHOUT the secrets table; the command runs on that copy and the copy is deleted at exit. The
rows are copied byte for byte, so ``verify`` on the copy checks the chain PostgreSQL holds.
Commands that write (``compact``, ``replay --snapshot``) write to PostgreSQL itself, then the copy
is refreshed. Cost: one full read of the journal per command, plus building the copy's operation
index from its events (journal/opindex.py; about 8 s of CPU per million events).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile

from journal import SqliteStore, opindex
from journal.postgres import PgStore

__all__ = ["copy_to_sqlite", "temporary_copy"]


def copy_to_sqlite(url: str, dest: str) -> None:
    """Copy the journal at ``url`` (events, snapshots, meta; never secrets) into ``dest``."""
    SqliteStore.open(dest).close()  # an empty journal file of the current schema
    with contextlib.closing(PgStore.open(url, readonly=True)) as source:
        conn = sqlite3.connect(dest)
        try:
            with conn:
                conn.execute("DELETE FROM meta")
                for table, rows in source.copy_rows():
                    marks = ", ".join("?" * len(rows[0])) if rows else ""
                    if rows:
                        conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
                # PostgreSQL keeps no operation index: derive the copy's from its events, with the
                # code SQLite journals use (journal/opindex.py), so the readers find it.
                opindex.rebuild(conn, conn)
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()


@contextlib.contextmanager
def temporary_copy(url: str):
    """A fresh copy's path, removed afterwards (0700 directory: the copy holds request bodies)."""
    directory = tempfile.mkdtemp(prefix="smgrl-journal-")
    try:
        path = os.path.join(directory, "journal.db")
        copy_to_sqlite(url, path)
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)

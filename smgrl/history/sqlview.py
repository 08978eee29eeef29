"""Read-only SQL over the journal file for what the store API does not aggregate (``stats``,
``verify``'s snapshot list): counts per type, first and last event, the snapshots table.

Its own ``mode=ro`` connection with ``query_only``; it never selects from ``secrets``.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sqlite3
from collections.abc import Iterator
from typing import Any

__all__ = ["bounds", "event_hash", "file_sizes", "snapshot_state", "snapshots", "type_counts", "view"]


@contextlib.contextmanager
def view(path: str) -> Iterator[sqlite3.Connection]:
    uri = pathlib.Path(path).resolve().as_uri() + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    try:
        conn.execute("PRAGMA query_only = ON")
        conn.execute("PRAGMA busy_timeout = 5000")
        yield conn
    finally:
        conn.close()


def type_counts(conn: sqlite3.Connection) -> dict[str, int]:
    """Events per type (the (type, seq) index answers it without reading a payload)."""
    return dict(conn.execute("SELECT type, count(*) FROM events GROUP BY type ORDER BY type").fetchall())


def bounds(conn: sqlite3.Connection) -> dict[str, Any]:
    row = conn.execute(
        "SELECT min(seq), max(seq), (SELECT ts FROM events ORDER BY seq LIMIT 1),"
        " (SELECT ts FROM events ORDER BY seq DESC LIMIT 1) FROM events"
    ).fetchone()
    return {"first_seq": row[0], "last_seq": row[1], "first_ts": row[2], "last_ts": row[3]}


def snapshots(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    rows = conn.execute(
        "SELECT id, kind, upto_seq, ts, length(state), hash FROM snapshots ORDER BY upto_seq, id"
    ).fetchall()
    keys = ("id", "kind", "upto_seq", "ts", "bytes", "hash")
    return [dict(zip(keys, r, strict=True)) for r in rows]


def snapshot_state(conn: sqlite3.Connection, snapshot_id: int) -> tuple[str, str, int, str] | None:
    """``(kind, state, upto_seq, hash)`` of one snapshot row."""
    return conn.execute(
        "SELECT kind, state, upto_seq, hash FROM snapshots WHERE id = ?", (snapshot_id,)
    ).fetchone()


def event_hash(conn: sqlite3.Connection, seq: int) -> str | None:
    row = conn.execute("SELECT hash FROM events WHERE seq = ?", (seq,)).fetchone()
    return row[0] if row else None


def file_sizes(path: str) -> dict[str, int]:
    """Bytes of the database and its WAL side files (those that exist)."""
    out = {}
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            out[os.path.basename(path) + suffix] = os.path.getsize(path + suffix)
    return out

"""The PostgreSQL journal's schema: its tables, its migrations, and the URL's ``schema=``."""

from __future__ import annotations

import datetime
import re
import urllib.parse
from typing import Any

from ._schema_names import FORMAT_VERSION, initial_meta
from .errors import JournalError, JournalForeignError, JournalTooNewError

__all__ = ["PG_MIGRATIONS", "migrate", "split_url"]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")
PG_MIGRATIONS = ("0001_create_journal", "0002_leases")


def split_url(url: str) -> tuple[str, str, str | None]:
    """``(url for libpq, schema, password)``: the ``schema`` query parameter is smgrl's own."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    schema = "smgrl"
    kept = []
    for key, value in query:
        if key == "schema":
            schema = value
        else:
            kept.append((key, value))
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ValueError("the journal URL's schema= must be a lowercase identifier (letters, digits, _)")
    password = urllib.parse.unquote(parts.password) if parts.password else None
    libpq = urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(kept)))
    return libpq, schema, password


def _ddl(s: str) -> dict[str, list[str]]:
    return {
        "0001_create_journal": [
            f"""CREATE TABLE {s}.events (
    seq BIGINT PRIMARY KEY,
    ts DOUBLE PRECISION NOT NULL,
    stream TEXT NOT NULL,
    type TEXT NOT NULL,
    schema INTEGER NOT NULL,
    payload TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash TEXT NOT NULL)""",
            f"CREATE INDEX events_stream_seq ON {s}.events (stream, seq)",
            f"CREATE INDEX events_type_seq ON {s}.events (type, seq)",
            f"CREATE INDEX events_ts ON {s}.events (ts)",
            f"""CREATE TABLE {s}.secrets (
    worker_id TEXT PRIMARY KEY, api_key TEXT NOT NULL, seq BIGINT REFERENCES {s}.events(seq))""",
            f"""CREATE TABLE {s}.snapshots (
    id BIGSERIAL PRIMARY KEY, kind TEXT NOT NULL, upto_seq BIGINT NOT NULL,
    ts DOUBLE PRECISION NOT NULL, state TEXT NOT NULL, hash TEXT NOT NULL)""",
            f"CREATE INDEX snapshots_kind_upto_seq ON {s}.snapshots (kind, upto_seq)",
            f"CREATE TABLE {s}.meta (key TEXT PRIMARY KEY, value TEXT)",
        ],
        "0002_leases": [
            f"""CREATE TABLE {s}.leases (
    name TEXT PRIMARY KEY, holder TEXT NOT NULL, expires DOUBLE PRECISION NOT NULL,
    epoch BIGINT NOT NULL)"""
        ],
    }


def migrate(conn: Any, *, schema: str, key: str, path: str, readonly: bool) -> None:
    """Check that ``schema`` holds an smgrl journal this code may use, and create or migrate it
    (read-write only). ``key``: the journal's advisory lock, held while migrating."""
    s = schema
    tables = {
        r[0]
        for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (s,)
        ).fetchall()
    }
    if tables and "migrations" not in tables:
        shown = ", ".join(sorted(tables)[:6])
        raise JournalForeignError(
            f"{path}: schema {s!r} is not an smgrl journal: it holds tables of another"
            f" application ({shown}); it was not modified"
        )
    if not tables:
        if readonly:
            raise JournalForeignError(f"{path}: no smgrl journal in schema {s!r}")
        applied: list[str] = []
    else:
        applied = [r[0] for r in conn.execute(f"SELECT name FROM {s}.migrations ORDER BY name")]
        _check_format(conn, s, path, readonly, applied)
    pending = [m for m in PG_MIGRATIONS if m not in applied]
    if not pending:
        return
    if readonly:
        raise JournalError(
            f"{path} is an smgrl journal written by an older smgrl (migrations"
            f" {', '.join(pending)} not applied): start the gateway on it once to upgrade it"
        )
    with conn.transaction():
        # Two processes creating one journal at once: the second waits, then finds it done.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (key,))
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {s}.migrations (name TEXT PRIMARY KEY, applied_at TEXT)")
        done = {r[0] for r in conn.execute(f"SELECT name FROM {s}.migrations")}
        now = datetime.datetime.now(datetime.UTC).isoformat()
        ddl = _ddl(s)
        for name in PG_MIGRATIONS:
            if name in done:
                continue
            for statement in ddl[name]:
                conn.execute(statement)
            if name == "0001_create_journal":
                conn.cursor().executemany(
                    f"INSERT INTO {s}.meta (key, value) VALUES (%s, %s)", initial_meta(now)
                )
            conn.execute(f"INSERT INTO {s}.migrations VALUES (%s, %s)", (name, now))


def _check_format(conn: Any, s: str, path: str, readonly: bool, applied: list[str]) -> None:
    row = conn.execute(f"SELECT value FROM {s}.meta WHERE key = 'format_version'").fetchone()
    try:
        fmt = int(row[0]) if row else 0
    except (TypeError, ValueError):
        raise JournalForeignError(f"{path}: meta.format_version is not a journal format") from None
    if fmt > FORMAT_VERSION:
        raise JournalTooNewError(
            f"{path} is an smgrl journal of format {fmt}, written by a newer smgrl; this"
            f" smgrl knows format {FORMAT_VERSION}: upgrade smgrl to use it"
        )
    unknown = [m for m in applied if m not in PG_MIGRATIONS]
    if unknown and not readonly:
        raise JournalTooNewError(
            f"{path} was migrated by a newer smgrl ({', '.join(unknown)}); not writing it"
        )

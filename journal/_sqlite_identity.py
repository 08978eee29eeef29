"""Telling whether an SQLite file is an smgrl journal this code may open, before anything writes to it."""

from __future__ import annotations

import re
import sqlite3

from ._schema_names import FORMAT_VERSION, MIGRATION_NAMES, MIGRATION_SET
from .errors import JournalError, JournalForeignError, JournalTooNewError

__all__ = ["check_identity"]

_JOURNAL_ID = re.compile(r"[0-9a-f]{32}")


def check_identity(conn: sqlite3.Connection, path: str, *, readonly: bool) -> None:
    """Refuse a file this code must not read or write, without writing anything to it.

    * not an SQLite database (or an unreadable one): :class:`JournalForeignError`;
    * an SQLite database with anything in it that is not an smgrl journal: JournalForeignError
      (a read-write open would otherwise add the journal's tables to another application's file);
    * an empty database: a new journal for a read-write open, JournalForeignError read-only;
    * a journal of a newer ``format_version``, or (read-write) with migrations this code does not
      know: :class:`JournalTooNewError`.
    """
    try:
        names = [
            row[0]
            for row in conn.execute(
                "SELECT name FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
            )
        ]
    except sqlite3.OperationalError:
        raise  # locked, I/O error...: not a statement about what the file is
    except sqlite3.DatabaseError as exc:  # "file is not a database", "disk image is malformed"
        raise JournalForeignError(
            f"{path} is not an smgrl journal: not a readable SQLite database ({exc})"
        ) from None
    if not names:
        if readonly:
            raise JournalForeignError(f"{path} is an empty SQLite database, not an smgrl journal")
        return  # a new journal: the migrations create it
    applied = (
        # What sqlite_utils' ``Migrations.applied`` reads, without importing it (see open()).
        [
            row[0]
            for row in conn.execute(
                "SELECT name FROM _sqlite_migrations WHERE migration_set = ? ORDER BY rowid",
                (MIGRATION_SET,),
            )
        ]
        if "_sqlite_migrations" in names
        else []
    )
    if not applied or "meta" not in names or "events" not in names:
        shown = ", ".join(sorted(names)[:6]) + (", ..." if len(names) > 6 else "")
        raise JournalForeignError(
            f"{path} is not an smgrl journal: it is an SQLite database of another application"
            f" (tables: {shown}); it was not modified"
        )
    row = conn.execute("SELECT value FROM meta WHERE key = 'format_version'").fetchone()
    try:
        fmt = int(row[0]) if row is not None else 0
    except (TypeError, ValueError):
        raise JournalForeignError(
            f"{path}: meta.format_version is {row[0]!r}, not a journal format"
        ) from None
    if fmt > FORMAT_VERSION:
        raise JournalTooNewError(
            f"{path} is an smgrl journal of format {fmt}, written by a newer smgrl; this smgrl knows"
            f" format {FORMAT_VERSION}: upgrade smgrl to use it"
        )
    if not readonly:
        # The id is this journal's name on the wire (``x-smgrl-gateway-id`` on every /health
        # answer): an edited one with CR LF made /health answer 500, with ESC it reached clients raw.
        row = conn.execute("SELECT value FROM meta WHERE key = 'journal_id'").fetchone()
        if row is None or not isinstance(row[0], str) or not _JOURNAL_ID.fullmatch(row[0]):
            shown = (
                "missing" if row is None else repr(row[0])[:80].encode("ascii", "backslashreplace").decode()
            )
            raise JournalForeignError(
                f"{path}: meta.journal_id is {shown}, not a journal id (32 lowercase hex digits, as"
                " smgrl writes it); it was edited: not serving it (`smgrl journal verify` can read it)"
            )
    unknown = [name for name in applied if name not in MIGRATION_NAMES]
    if unknown and not readonly:
        raise JournalTooNewError(
            f"{path} was migrated by a newer smgrl (migrations this smgrl does not know:"
            f" {', '.join(unknown)}); not writing it: upgrade smgrl"
        )
    missing = [name for name in MIGRATION_NAMES if name not in applied]
    if readonly and missing:
        pending = ", ".join(missing)
        raise JournalError(
            f"{path} is an smgrl journal written by an older smgrl (migrations {pending} not applied):"
            " start the gateway on it once, or run `smgrl journal reindex`, to upgrade it"
        )

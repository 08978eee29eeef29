"""``smgrl journal`` on a PostgreSQL journal: every subcommand reads an SQLite copy of it.

The subcommands read the journal through SQL of SQLite's dialect (``sqlview``, ``opscan``,
``history``: json_extract, the schema of journal/store.py). Rather than a second dialect of each,
a ``postgresql://`` journal is copied, in ONE repeatable-read transaction (a consistent view while
gateways append), into an SQLite journal with the same rows, hashes, snapshots and meta, WITHOUT
the secrets table, and the command runs on that copy. The rows are copied byte for byte.

**The copy is a cache kept between commands** (``cached_copy``), so a command costs what was
appended since the previous one, not the whole journal:

* where: ``$SMGRL_JOURNAL_CACHE`` (a directory), else ``$XDG_CACHE_HOME/smgrl/journals``, else
  ``~/.cache/smgrl/journals``; created 0700, files 0600 (the copy holds request bodies).
  ``SMGRL_JOURNAL_CACHE=off`` copies into a temporary file per command instead (as before).
* which file: ``<sha256 of host:port/database?schema=NAME>.db``, the server's own answer for the
  host, port and database: no user, no password, nothing of the URL in the name.
* never stale: before every command, under an exclusive lock (``NAME.db.lock``, flock), the cache
  is brought up to date: PostgreSQL's event at the cache's head seq must have the cache's head
  hash (the hash chain then vouches for every event before it), and only the events after it are
  copied, with the meta table, the snapshots added or dropped since, and the request bodies that
  ``compact`` rewrote since. A different hash, or no such event (another journal at that
  address, one restored from an older backup): the cache is deleted and copied whole. The
  command then reads it under a shared lock, so a second command waits for the update and two
  commands read at once.
* ``verify`` reads a fresh temporary copy, never the cache: it checks the rows PostgreSQL holds
  now, including events older than the cache's head.

Commands that write (``compact``, ``replay --snapshot``) write to PostgreSQL itself, then the copy
is refreshed. PostgreSQL keeps no operation index: the copy's is derived from its events with the
code SQLite journals use (journal/opindex.py), incrementally for the events each update adds.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import sqlite3
import tempfile
import time
from collections.abc import Iterator

from journal import JournalError, SqliteStore, opindex
from journal.postgres import PgStore

__all__ = ["cache_dir", "cached_copy", "copy_to_sqlite", "temporary_copy"]

CACHE_ENV = "SMGRL_JOURNAL_CACHE"
LOCK_WAIT_SECS = 300.0  # another command updating the same cache (a first copy of a large journal)


def cache_dir() -> str | None:
    """The cache directory, or None when ``SMGRL_JOURNAL_CACHE=off``."""
    value = os.environ.get(CACHE_ENV)
    if value is not None and value.strip():
        return None if value.strip().lower() == "off" else value
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "smgrl", "journals")


def copy_to_sqlite(url: str, dest: str) -> None:
    """Copy the journal at ``url`` (events, snapshots, meta; never secrets) into a new ``dest``."""
    with contextlib.closing(PgStore.open(url, readonly=True)) as source:
        _update(source, dest)


@contextlib.contextmanager
def temporary_copy(url: str) -> Iterator[str]:
    """A fresh copy's path, removed afterwards (0700 directory: the copy holds request bodies)."""
    directory = tempfile.mkdtemp(prefix="smgrl-journal-")
    try:
        path = os.path.join(directory, "journal.db")
        copy_to_sqlite(url, path)
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def cached_copy(url: str, directory: str) -> Iterator[str]:
    """The cache file of the journal at ``url`` in ``directory``, brought up to date, held under a
    shared lock while the caller reads it (module docstring)."""
    with contextlib.closing(PgStore.open(url, readonly=True)) as source:
        _private_dir(directory)
        path = os.path.join(directory, hashlib.sha256(source.identity().encode()).hexdigest()[:32] + ".db")
        fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            _flock(fd, fcntl.LOCK_EX, path)
            _update(source, path)
            # Down to shared for the reading: other commands may read too, none may update.
            # (flock converts by releasing first: an update may slip in, which is only fresher.)
            _flock(fd, fcntl.LOCK_SH, path)
        except BaseException:
            os.close(fd)
            raise
    try:
        yield path
    finally:
        os.close(fd)  # releases the lock


def _private_dir(directory: str) -> None:
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise JournalError(
            f"cannot create the journal cache directory {directory}: {exc.strerror}"
            f" (set {CACHE_ENV} to another directory, or to off)"
        ) from None
    if not os.path.isdir(directory):
        raise JournalError(
            f"the journal cache {directory} is not a directory (set {CACHE_ENV} to a directory, or to off)"
        )


def _flock(fd: int, mode: int, path: str) -> None:
    deadline = time.monotonic() + LOCK_WAIT_SECS
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise JournalError(f"cannot lock the journal cache {path}: {exc.strerror}") from None
        if time.monotonic() > deadline:
            raise JournalError(
                f"the journal cache {path} stayed locked by another `smgrl journal` command for"
                f" {LOCK_WAIT_SECS:.0f} s; {CACHE_ENV}=off skips the cache"
            )
        time.sleep(0.05)  # poll the lock (bounded by the deadline)


def _remove(path: str) -> None:
    for name in (path, path + "-wal", path + "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


def _open_copy(path: str) -> sqlite3.Connection:
    """The copy, of the current schema (created, or migrated by SqliteStore.open); a file that is
    no journal (a crash while it was created, a stray file) is replaced."""
    fresh = not os.path.exists(path)
    try:
        SqliteStore.open(path).close()
    except (JournalError, sqlite3.Error):
        if fresh:
            raise
        _remove(path)
        SqliteStore.open(path).close()
    os.chmod(path, 0o600)
    return sqlite3.connect(path)


def _update(source: PgStore, path: str) -> None:
    """Bring the SQLite copy at ``path`` (created if missing) up to ``source``'s journal."""
    for _attempt in range(2):
        conn = _open_copy(path)
        try:
            if _append_news(source, conn):
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                return
        finally:
            conn.close()
        _remove(path)  # diverged: copied whole on the second round
    raise JournalError(f"the journal {source.path} changed while it was copied; run the command again")


def _append_news(source: PgStore, conn: sqlite3.Connection) -> bool:
    """One transaction on the copy: False (nothing written) when its head is not in ``source``."""
    head = conn.execute("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
    after, anchor = head if head else (0, None)
    known = [r[0] for r in conn.execute("SELECT id FROM snapshots")]
    compacted = conn.execute("SELECT value FROM meta WHERE key = 'bodies_compacted_before'").fetchone()
    with conn:
        for table, rows in source.copy_rows(
            after, anchor=anchor, known_snapshots=known, compacted_from=int(compacted[0]) if compacted else 0
        ):
            if table == "diverged":
                conn.rollback()
                return False
            if table == "meta":
                conn.execute("DELETE FROM meta")
                conn.executemany("INSERT INTO meta VALUES (?, ?)", rows)
            elif table == "snapshot_ids":
                kept = {r[0] for r in rows}
                conn.executemany("DELETE FROM snapshots WHERE id = ?", [(i,) for i in known if i not in kept])
            elif table == "snapshots" and rows:
                conn.executemany("INSERT INTO snapshots VALUES (?, ?, ?, ?, ?, ?)", rows)
            elif table == "compacted" and rows:
                conn.executemany("UPDATE events SET payload = ? WHERE seq = ?", [(p, seq) for seq, p in rows])
            elif table == "events":
                conn.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                # PostgreSQL keeps no operation index: the copy's follows its new events, with the
                # code SQLite journals use (journal/opindex.py): every row here is newer than it.
                opindex.apply_rows(
                    conn, [(r[0], r[1], r[3], r[5], None) for r in rows if r[3] in opindex.TYPES]
                )
    return True

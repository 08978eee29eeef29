"""SqliteStore: the journal as one plain SQLite file (readable with ``sqlite-utils`` and datasette).

Schema (created by ``sqlite_utils.Migrations`` set ``smgrl.journal``; see ``journal/_schema.py``)::

    events(seq INTEGER PRIMARY KEY, ts REAL, stream TEXT, type TEXT, schema INTEGER,
           payload TEXT (canonical JSON), prev_hash TEXT, hash TEXT)
        indexes: (stream, seq), (type, seq), (ts)
    secrets(worker_id TEXT PRIMARY KEY, api_key TEXT NOT NULL, seq INTEGER -> events.seq)
        api_key '' is a deleted key (a tombstone with the deleting event's seq, so that processes
        following the journal learn of deletions too: ``secret_changes``)
        worker API keys; never in a payload, never exported, never printed
    snapshots(id INTEGER PRIMARY KEY, kind TEXT, upto_seq INTEGER, ts REAL, state TEXT (JSON), hash TEXT)
        index: (kind, upto_seq)
    op_index(seq INTEGER PRIMARY KEY, op_id, ts, ... one row per control operation)
        DERIVED from the control.* events, written in the same transaction as they are
        (``journal/opindex.py``); verify rebuilds and compares it, ``rebuild_op_index`` rebuilds it
    meta(key TEXT PRIMARY KEY, value TEXT)
        journal_id, created_at, format_version, and three keys maintained with every write:
        high_water_seq / high_water_hash (the head, written in the same transaction as each batch)
        and bodies_compacted_before (see compaction)
    leases(name TEXT PRIMARY KEY, holder TEXT, expires REAL, epoch INTEGER)
        duties that run in one process of several (journal/lease.py)

Several writers. Every write is one ``BEGIN IMMEDIATE`` transaction that reads the chain head
inside it, so processes appending to one file at once keep one gapless chain (SQLite serializes
the transactions). ``append_batch(expect=...)`` appends only if the position a decision was made
on still holds (``JournalConflict`` otherwise); ``change_token()`` (``PRAGMA data_version`` on a
connection of its own) tells a tail cheaply that another connection committed. See
docs/journal.md, "Several writers".

Durability. WAL mode with ``synchronous=NORMAL`` (the default): a committed batch survives a crash
or SIGKILL of the gateway process, because it is in the WAL file that the OS already holds. On power
loss or a kernel crash, batches committed since the last checkpoint may be lost (never corrupted).
Open with ``synchronous="FULL"`` to fsync the WAL at every commit and survive power loss too, at the
cost of an fsync per batch (group commit keeps that cost per batch, not per event). The SIGKILL
promise is tested: ``tests/journal/test_journal_crash.py``.

WAL size. The WAL grows with a burst (writes between checkpoints) and SQLite never shrinks it by
itself: a burst left the ``-wal`` file at its peak for the life of the process. ``wal_size_limit``
(64 MiB by default) bounds it: ``journal_size_limit`` makes SQLite truncate the WAL to it whenever
the WAL restarts after a complete checkpoint, and :meth:`SqliteStore.checkpoint` truncates a WAL
grown past it at once (``wal_checkpoint(TRUNCATE)``, never waiting for readers: when a reader
holds an old snapshot it is retried at the next checkpoint).

Read-only opens (``readonly=True``, the CLI while the gateway runs) use ``mode=ro`` plus
``query_only``: they never migrate and never modify the database. SQLite may still create the
``-wal``/``-shm`` side files (mode 0600 like the database), which it needs to read a WAL database
that another process may be writing.

Hash chain: see ``journal/_chain.py``. ``verify()`` recomputes it and names the first bad seq:
an edited row (hash mismatch), a deleted row (seq gap / broken prev_hash link), a truncated tail
(last row below ``high_water_seq``), rows appended behind the journal's back, an undecodable
payload, a body that does not match its ``body_sha256``. It is safe to run while another
connection appends or compacts (``_chain.verify_journal`` says how).

Compaction of request bodies (``compact_bodies(before_seq)``). ``control.started`` keeps request
bodies up to 64 KiB, which dominate the file over time. The scheme that lets them go while the
chain stays verifiable:

1. The chain never hashed the body itself. For a control.started row whose payload holds a body,
   the hashed text is the canonical payload with ``"body": null`` (every other row hashes its
   payload as stored). The body is still bound to the chain through ``body_sha256`` and
   ``body_size``, which are hashed, and verify checks every kept body against them: edit a body and
   verify fails at that seq.
2. Compaction rewrites such a payload to ``"body": null`` (``body_encoding`` is kept, so a reader
   can tell "compacted" from "there was no body"). The new payload is byte-for-byte the text that
   was hashed, so the chain verifies unchanged, and every other field stays protected.
3. ``meta.bodies_compacted_before`` records how far compaction went. A body missing at or above
   it was not removed by compaction: verify reports it. Bodies that fail their check are left in
   place (compaction must not launder tampering).
4. Compaction runs in small transactions (one page of rows each) so it can run from the CLI while
   the gateway appends: the gateway's writer only ever waits for one page. It is resumable and
   idempotent. Freed pages are reused by later appends; run ``VACUUM`` offline to shrink the file.

Threads. A store is used by one thread at a time as far as SQLite is concerned: an internal lock
serializes every use of the connection (``check_same_thread=False`` because JournalWriter calls it
from a worker thread). Readers that must not wait for the writer (CLI, replay while serving) open
their own store, ideally ``readonly=True``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import logging
import os
import pathlib
import re
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Self

from . import lease as leases
from . import opindex
from ._chain import (
    EMPTY_HEAD,
    GENESIS,
    Head,
    Marks,
    Row,
    VerifyReport,
    build_batch,
    compacted_payloads,
    rows_before_the_first,
    snapshot_hash,
    verify_journal,
)
from ._schema_names import FORMAT_VERSION, MIGRATION_NAMES, MIGRATION_SET
from .base import Append, Expect, Lease, RawRow, expect_problem, type_names
from .codec import ControlStarted, Event, Recorded, decode
from .errors import (
    JournalBusyError,
    JournalConflict,
    JournalCorrupt,
    JournalError,
    JournalForeignError,
    JournalReadOnlyError,
    JournalTooNewError,
)
from .retention import DEFAULT as DEFAULT_RETENTION
from .retention import Retention

if TYPE_CHECKING:
    import sqlite_utils

__all__ = ["FORMAT_VERSION", "SqliteStore"]

_PAGE = 2000  # rows per read page: flat memory, and the read snapshot is released between pages
_COMPACT_PAGE = 256  # control.started rows per compaction transaction (up to 64 KiB each)

_SYNC_MODES = ("NORMAL", "FULL", "EXTRA")
# The WAL's size after a checkpoint (see "WAL size" above): well above what the writer's checkpoint
# interval (4,096 events) leaves in it, so steady traffic never truncates.
WAL_SIZE_LIMIT = 64 * 1024 * 1024
_OP_TYPES = frozenset(opindex.TYPES)
# SQLITE_BUSY and its extended codes (BUSY_RECOVERY, BUSY_SNAPSHOT, BUSY_TIMEOUT): the lock is taken.
_BUSY_CODES = frozenset({5, 261, 517, 773})
_UPSERT_META = (
    "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)


logger = logging.getLogger("smgrl.journal")


def _create_private(path: str) -> None:
    """Create the file with mode 0600 before SQLite sees it; leave an existing file's mode alone.

    SQLite creates the -wal and -shm files with the database file's permissions, so they are 0600 too.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)  # the umask can only remove bits; make it exactly 0600
    finally:
        os.close(fd)


class SqliteStore:
    """The journal on SQLite. Build it with :meth:`open`. Synchronous; see the module docstring."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        db: sqlite_utils.Database | None,
        *,
        readonly: bool,
        path: str,
        busy_ms: int = 5000,
    ):
        self._conn = conn
        self._db = db
        self._readonly = readonly
        self.path = path
        self._lock = threading.Lock()
        self._busy_ms = busy_ms
        self._busy_now = busy_ms  # the connection's busy_timeout right now
        self._wal_size_limit = WAL_SIZE_LIMIT
        self._clock = time.time  # commit timestamps; tests substitute a fake clock
        self._watch: sqlite3.Connection | None = None  # change_token()'s own connection
        self._watch_lock = threading.Lock()
        self._checkpointer: sqlite3.Connection | None = None  # checkpoint()'s own connection
        self._checkpoint_lock = threading.Lock()

    # -- opening ----------------------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        path: str | os.PathLike[str],
        *,
        readonly: bool = False,
        synchronous: str = "NORMAL",
        busy_timeout_ms: int = 5000,
        wal_size_limit: int = 0,
    ) -> SqliteStore:
        """Open (creating and migrating if needed) the journal at ``path``.

        ``readonly=True`` never writes and never migrates: the file must exist and be migrated.
        ``synchronous``: "NORMAL" (survives process crash/SIGKILL) or "FULL" (also power loss).
        ``busy_timeout_ms``: how long a write waits for another connection's write lock.
        ``wal_size_limit``: bytes the WAL is truncated to after checkpoints (0: ``WAL_SIZE_LIMIT``).
        """
        wal_limit = wal_size_limit or WAL_SIZE_LIMIT
        path = os.fspath(path)
        sync = synchronous.upper()
        if sync not in _SYNC_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(_SYNC_MODES)}")
        if readonly:
            if not os.path.exists(path):
                raise FileNotFoundError(f"no journal at {path}")
            uri = pathlib.Path(path).resolve().as_uri() + "?mode=ro"
            conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        else:
            _create_private(path)
            conn = sqlite3.connect(path, check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            # Before anything that writes (WAL mode changes the file header, migrations add
            # tables): a file that is not ours is refused untouched.
            _check_identity(conn, path, readonly=readonly)
            db = None
            if readonly:
                # Belt and braces on top of mode=ro: the connection refuses any write statement.
                conn.execute("PRAGMA query_only = ON")
            else:
                # Imported here: a read-only open (every `smgrl journal` reader) never migrates,
                # and sqlite_utils with its dependencies costs about 0.08 s of CPU to import.
                import sqlite_utils

                from ._schema import MIGRATIONS

                db = sqlite_utils.Database(conn, execute_plugins=False)
                db.enable_wal()
                conn.execute(f"PRAGMA synchronous = {sync}")
                conn.execute(f"PRAGMA journal_size_limit = {int(wal_limit)}")
                if sync != "FULL":
                    # Commits are then cheap enough to run on the event loop (JournalWriter does);
                    # checkpoints, which fsync the database file, are run by the writer in its
                    # thread instead of inside whichever commit crossed SQLite's threshold.
                    conn.execute("PRAGMA wal_autocheckpoint = 0")
                conn.execute("PRAGMA foreign_keys = ON")
                MIGRATIONS.apply(db)
        except BaseException:
            conn.close()
            raise
        store = cls(conn, db, readonly=readonly, path=path, busy_ms=int(busy_timeout_ms))
        store._wal_size_limit = int(wal_limit)
        store.commits_are_cheap = not readonly and sync != "FULL"
        return store

    # True when a commit never fsyncs (WAL with synchronous=NORMAL/OFF): JournalWriter then commits
    # on the event loop and calls checkpoint() from a thread now and then.
    commits_are_cheap = False

    def checkpoint(self) -> None:
        """Copy the WAL into the database file (PASSIVE: never waits for readers), then truncate
        a WAL grown past ``wal_size_limit`` by a burst (see the module docstring).

        On a connection of its own: the store's connection (and its lock) stays free meanwhile,
        so commits go on during the checkpoint's fsyncs (SQLite lets a writer append to the WAL
        while a PASSIVE checkpoint copies it). On the store's connection, every commit arriving
        during a checkpoint waited for it: 20 ms and more on a loaded disk, every 62 fan-outs to
        64 engines (docs/benchmarks.md, "fan-out (control plane)")."""
        if self._readonly:
            return
        with self._checkpoint_lock:
            conn = self._checkpointer
            if conn is None:
                conn = self._checkpointer = sqlite3.connect(self.path, check_same_thread=False)
                conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            if self.wal_size() > self._wal_size_limit:
                # busy_timeout 0: TRUNCATE would wait for readers of an old snapshot (and for
                # another connection's write, this store's own commits included); it answers
                # "busy" at once instead, and the next checkpoint tries again. Nothing
                # committed is at stake either way.
                conn.execute("PRAGMA busy_timeout = 0")
                try:
                    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
                except sqlite3.OperationalError:
                    pass
                finally:
                    conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")

    def wal_size(self) -> int:
        """Bytes of the ``-wal`` file now (0 when there is none)."""
        try:
            return os.path.getsize(self.path + "-wal")
        except OSError:
            return 0

    def close(self) -> None:
        with self._watch_lock:
            if self._watch is not None:
                self._watch.close()
                self._watch = None
        with self._checkpoint_lock:
            if self._checkpointer is not None:
                self._checkpointer.close()
                self._checkpointer = None
        with self._lock:
            if not self._readonly:
                # Leave a self-contained file: move the WAL into it. SQLite only does this when the
                # last connection closes, and the gateway's read-only connection (journal routes)
                # may outlive this one; a copy of the .db alone would then miss every event.
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            self._conn.close()

    def change_token(self) -> int:
        """``PRAGMA data_version`` of a connection used for nothing else: it changes whenever any
        other connection (this store's own included) committed since the last call. Microseconds,
        no lock wait: safe to poll from the event loop (journal/watch.py)."""
        with self._watch_lock:
            if self._watch is None:
                uri = pathlib.Path(self.path).resolve().as_uri() + "?mode=ro"
                self._watch = sqlite3.connect(uri, uri=True, check_same_thread=False)
            # fetchall: the statement is finished, so no read snapshot stays open on this connection.
            return int(self._watch.execute("PRAGMA data_version").fetchall()[0][0])

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def readonly(self) -> bool:
        return self._readonly

    # -- writing ----------------------------------------------------------------------------------

    def _set_busy_timeout(self, ms: int) -> None:
        # Changed only when it differs: inline commits (0) follow each other without a PRAGMA.
        if ms != self._busy_now:
            self._conn.execute(f"PRAGMA busy_timeout = {ms}")
            self._busy_now = ms

    @contextlib.contextmanager
    def _write(self, wait: float | None = None) -> Iterator[sqlite3.Connection]:
        """One write transaction. ``wait``: seconds to wait for SQLite's write lock (None: the
        store's ``busy_timeout_ms``; 0: do not wait, raise JournalBusyError at once)."""
        if self._readonly:
            raise JournalReadOnlyError(f"{self.path} is open read-only")
        if wait == 0:
            # The caller runs on the event loop: it must not wait for this store's own lock either
            # (held by the writer's thread during a snapshot or a checkpoint).
            if not self._lock.acquire(blocking=False):
                raise JournalBusyError("the journal store is in use by the writer's thread")
        else:
            self._lock.acquire()
        try:
            conn = self._conn
            self._set_busy_timeout(self._busy_ms if wait is None else max(0, int(wait * 1000)))
            # BEGIN IMMEDIATE takes the write lock up front, waiting up to busy_timeout for another
            # writer (a CLI compaction, say). A deferred BEGIN reads first and may then fail with
            # SQLITE_BUSY_SNAPSHOT when it upgrades to a write, which busy_timeout does not retry.
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if wait == 0 and exc.sqlite_errorcode in _BUSY_CODES:
                    raise JournalBusyError("another connection holds the journal's write lock") from exc
                raise
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                # Nothing of a failed transaction may survive (disk full mid-batch, failed COMMIT).
                if conn.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute("ROLLBACK")
                raise
        finally:
            self._lock.release()

    @staticmethod
    def _head(conn: sqlite3.Connection) -> Head:
        row = conn.execute("SELECT seq, ts, hash FROM events ORDER BY seq DESC LIMIT 1").fetchone()
        return Head(*row) if row else EMPTY_HEAD

    def append_batch(
        self, items: Sequence[Append], *, wait: float | None = None, expect: Expect | None = None
    ) -> list[Recorded]:
        """Append ``items`` in ONE transaction: consecutive seqs, chained hashes, one commit ts.

        Either every item is committed (and its secrets written) or none is. ``wait``: how long to
        wait for another connection's write lock, in seconds (None: ``busy_timeout_ms``; 0: raise
        JournalBusyError at once, without waiting, as the writer's inline path needs).
        ``expect``: append only if no event matching it was appended after ``expect.after``
        (JournalConflict otherwise, nothing written; see ``base.Expect``).
        """
        if not items:
            return []
        with self._write(wait) as conn:
            # The head is read inside the write transaction rather than cached: another process
            # (another gateway process, the CLI) may have written since, and a failed batch must
            # leave no trace in memory. BEGIN IMMEDIATE holds the write lock from here to COMMIT,
            # so nobody appends between this read and our rows.
            head = self._head(conn)
            if expect is not None:
                _check_expect(conn, expect, head.seq)
            rows, recorded, secret_ops = build_batch(items, head, self._clock())
            _insert_events(conn, rows)
            # The derived operation index, in the same transaction as the events it derives from.
            control = [
                (r[0], r[1], r[3], r[5], item.event)
                for r, item in zip(rows, items, strict=True)
                if r[3] in _OP_TYPES
            ]
            if control:
                opindex.apply_rows(conn, control)
            for worker_id, api_key, seq in secret_ops:
                # A deletion leaves a tombstone ('') carrying its seq: see secret_changes().
                conn.execute(
                    "INSERT INTO secrets (worker_id, api_key, seq) VALUES (?, ?, ?) ON CONFLICT (worker_id)"
                    " DO UPDATE SET api_key = excluded.api_key, seq = excluded.seq",
                    (worker_id, api_key or "", seq),
                )
            last = recorded[-1]
            conn.executemany(
                _UPSERT_META, [("high_water_seq", str(last.seq)), ("high_water_hash", last.hash)]
            )
        return recorded

    # -- leases (journal/lease.py) ----------------------------------------------------------------

    @staticmethod
    def _lease_row(conn: sqlite3.Connection, name: str) -> Lease | None:
        row = conn.execute(
            "SELECT name, holder, expires, epoch FROM leases WHERE name = ?", (name,)
        ).fetchone()
        return Lease(*row) if row else None

    @staticmethod
    def _put_lease(conn: sqlite3.Connection, lease: Lease) -> None:
        conn.execute(
            "INSERT INTO leases (name, holder, expires, epoch) VALUES (?, ?, ?, ?) ON CONFLICT (name)"
            " DO UPDATE SET holder = excluded.holder, expires = excluded.expires, epoch = excluded.epoch",
            (lease.name, lease.holder, lease.expires, lease.epoch),
        )

    def take_lease(self, name: str, holder: str, ttl: float) -> Lease | None:
        """Take (or renew) lease ``name`` for ``ttl`` seconds; None while another holder has it."""
        leases.check_args(name, holder, ttl)
        with self._write() as conn:
            new = leases.taken(self._lease_row(conn, name), name, holder, self._clock(), ttl)
            if new is not None:
                self._put_lease(conn, new)
        return new

    def renew_lease(self, name: str, holder: str, ttl: float) -> Lease:
        """Extend a held lease to now + ``ttl``; LeaseLost if ``holder`` no longer holds it."""
        leases.check_args(name, holder, ttl)
        with self._write() as conn:
            new = leases.renewed(self._lease_row(conn, name), name, holder, self._clock(), ttl)
            self._put_lease(conn, new)
        return new

    def release_lease(self, name: str, holder: str) -> bool:
        """Give a held lease up at once; False if ``holder`` did not hold it."""
        leases.check_args(name, holder)
        with self._write() as conn:
            new = leases.released(self._lease_row(conn, name), holder)
            if new is not None:
                self._put_lease(conn, new)
        return new is not None

    def lease(self, name: str) -> Lease | None:
        """The lease row as stored (an expired or released one included)."""
        rows = self._query("SELECT name, holder, expires, epoch FROM leases WHERE name = ?", (name,))
        return Lease(*rows[0]) if rows else None

    def save_snapshot(
        self, kind: str, upto_seq: int, state_json: str, *, retention: Retention = DEFAULT_RETENTION
    ) -> list[int]:
        """Store a projection's state as of ``upto_seq`` (bound to that row's chain hash), and drop
        the snapshots of that kind the ``retention`` policy no longer keeps (in the same
        transaction). Returns the ``upto_seq`` of each dropped snapshot (logged too)."""
        json.loads(state_json)  # refuse garbage now rather than at the next startup
        with self._write() as conn:
            anchor = self._anchor(conn, upto_seq)
            if anchor is None:
                raise ValueError(f"cannot snapshot at seq {upto_seq}: no such event")
            conn.execute(
                "INSERT INTO snapshots (kind, upto_seq, ts, state, hash) VALUES (?, ?, ?, ?, ?)",
                (
                    kind,
                    upto_seq,
                    self._clock(),
                    state_json,
                    snapshot_hash(kind, upto_seq, anchor, state_json),
                ),
            )
            # Old snapshots serve `workers --at` (history); retention keeps them spread over the
            # journal with a bounded count (journal/retention.py says how many and how close).
            rows = conn.execute("SELECT id, upto_seq FROM snapshots WHERE kind = ?", (kind,)).fetchall()
            dropped = retention.drop(rows, self._head(conn).seq)
            conn.executemany("DELETE FROM snapshots WHERE id = ?", [(snap_id,) for snap_id, _ in dropped])
        if dropped:
            logger.info(
                "snapshot retention dropped %s snapshot(s) at seq %s (kept %d)",
                len(dropped),
                ", ".join(str(seq) for _, seq in sorted(dropped, key=lambda r: r[1])),
                len(rows) - len(dropped),
            )
        return sorted(seq for _, seq in dropped)

    def compact_bodies(self, before_seq: int) -> int:
        """Drop the request bodies of control.started events with seq < before_seq; return how many.

        The chain still verifies afterwards: see "Compaction" in the module docstring.
        """
        compacted = 0
        while True:
            with self._write() as conn:
                start = int(self._meta(conn, "bodies_compacted_before"))
                stop = min(before_seq, self._head(conn).seq + 1)
                if stop <= start:
                    return compacted
                rows = conn.execute(
                    "SELECT seq, payload FROM events WHERE type = ? AND seq >= ? AND seq < ? ORDER BY seq LIMIT ?",
                    (ControlStarted.TYPE, start, stop, _COMPACT_PAGE),
                ).fetchall()
                updates = compacted_payloads(rows)
                conn.executemany("UPDATE events SET payload = ? WHERE seq = ?", updates)
                done_to = rows[-1][0] + 1 if len(rows) == _COMPACT_PAGE else stop
                conn.execute(_UPSERT_META, ("bodies_compacted_before", str(done_to)))
                compacted += len(updates)
            # Between pages the write lock is free: a concurrent gateway writer gets its turn.

    # -- reading ----------------------------------------------------------------------------------

    @staticmethod
    def _meta(conn: sqlite3.Connection, key: str) -> str:
        row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        if row is None:
            raise JournalError(f"journal meta key {key!r} is missing")
        return str(row[0])

    @staticmethod
    def _anchor(conn: sqlite3.Connection, upto_seq: int) -> str | None:
        if upto_seq == 0:
            return GENESIS
        row = conn.execute("SELECT hash FROM events WHERE seq = ?", (upto_seq,)).fetchone()
        return row[0] if row else None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            if not self._readonly:
                self._set_busy_timeout(self._busy_ms)  # after inline commits it may be 0
            return self._conn.execute(sql, params).fetchall()

    def meta(self) -> dict[str, str]:
        """The ``meta`` table (journal id, creation time, format version, head, compaction mark)."""
        return dict(self._query("SELECT key, value FROM meta"))

    def last_seq(self) -> int:
        return int(self._query("SELECT max(seq) FROM events")[0][0] or 0)

    def count(self) -> int:
        return int(self._query("SELECT count(*) FROM events")[0][0])

    def secrets(self) -> dict[str, str]:
        return dict(
            self._query("SELECT worker_id, api_key FROM secrets WHERE api_key != '' ORDER BY worker_id")
        )

    def get_secret(self, worker_id: str) -> str | None:
        rows = self._query("SELECT api_key FROM secrets WHERE worker_id = ?", (worker_id,))
        return (rows[0][0] or None) if rows else None

    def secret_changes(self, after_seq: int, until_seq: int) -> dict[str, str | None]:
        """The keys set (or deleted: None) by the events ``after_seq < seq <= until_seq`` and not
        changed since: what a process following the others' appends applies to its key ring."""
        rows = self._query(
            "SELECT worker_id, api_key FROM secrets WHERE seq > ? AND seq <= ?", (after_seq, until_seq)
        )
        return {worker_id: key or None for worker_id, key in rows}

    def _pages(
        self, columns: str, after_seq: int, where: str, params: Sequence[Any], limit: int | None
    ) -> Iterator[list[Any]]:
        """Keyset pagination by seq. Each page is its own short read: memory stays flat over 1M
        rows and no read snapshot is held across pages (a long-lived one would stop WAL checkpoints)."""
        sql = f"SELECT {columns} FROM events WHERE seq > ?{where} ORDER BY seq LIMIT ?"
        remaining = limit
        while remaining is None or remaining > 0:
            size = _PAGE if remaining is None else min(_PAGE, remaining)
            page = self._query(sql, (after_seq, *params, size))
            if page:
                yield page
            if len(page) < size:
                return
            after_seq = page[-1][0]
            if remaining is not None:
                remaining -= len(page)

    def _ts_to_seq(self, since_ts: float | None, until_ts: float | None) -> tuple[int, int | None] | None:
        """Turn a [since_ts, until_ts) window into (after_seq, until_seq); None if it is empty.

        Exact because ts never decreases with seq (the store clamps it; verify checks it), and it
        lets every read page by seq instead of sorting a ts range.
        """
        after, until = 0, None
        if since_ts is not None:
            rows = self._query("SELECT seq FROM events WHERE ts >= ? ORDER BY ts, seq LIMIT 1", (since_ts,))
            if not rows:
                return None
            after = rows[0][0] - 1
        if until_ts is not None:
            rows = self._query(
                "SELECT seq FROM events WHERE ts < ? ORDER BY ts DESC, seq DESC LIMIT 1", (until_ts,)
            )
            if not rows:
                return None
            until = rows[0][0]
        return after, until

    # EventStore.read's signature (journal/base.py), spelled out by each store that implements it.
    def read(
        self,
        after_seq: int = 0,
        *,
        limit: int | None = None,
        types: Iterable[str | type[Event]] | None = None,
        stream: str | None = None,
        until_seq: int | None = None,
        since_ts: float | None = None,
        until_ts: float | None = None,
    ) -> Iterator[Recorded]:
        """Recorded events with ``after_seq < seq <= until_seq`` and ``since_ts <= ts < until_ts``,
        in seq order, optionally only some ``types`` (names or classes) or one ``stream``."""
        if since_ts is not None or until_ts is not None:
            window = self._ts_to_seq(since_ts, until_ts)
            if window is None:
                return iter(())
            after_seq = max(after_seq, window[0])
            if window[1] is not None:
                until_seq = window[1] if until_seq is None else min(until_seq, window[1])
        where, params = _filters(type_names(types), stream, until_seq)
        pages = self._pages("seq, ts, stream, type, schema, payload, hash", after_seq, where, params, limit)
        return _decoded(pages)

    def read_raw(
        self, after_seq: int = 0, types: Iterable[str | type[Event]] | None = None
    ) -> Iterator[RawRow]:
        """``(seq, ts, stream, type, schema, payload)`` tuples, undecoded: projections decode only
        the types they fold."""
        where, params = _filters(type_names(types), None, None)
        pages = self._pages("seq, ts, stream, type, schema, payload", after_seq, where, params, None)
        return (row for page in pages for row in page)

    def latest_snapshot(self, kind: str, max_seq: int | None = None) -> tuple[int, str] | None:
        """The newest valid snapshot of ``kind`` at or below ``max_seq``: ``(upto_seq, state_json)``.

        A snapshot whose hash no longer matches (edited state, or history rewritten under it) is
        skipped: snapshots are a cache, replaying from an older one or from scratch is always safe.
        """
        sql = "SELECT id, upto_seq FROM snapshots WHERE kind = ?"
        params: list[Any] = [kind]
        if max_seq is not None:
            sql += " AND upto_seq <= ?"
            params.append(max_seq)
        # Candidates first (ids only), then one state at a time: states can be large.
        for snapshot_id, upto_seq in self._query(sql + " ORDER BY upto_seq DESC, id DESC", params):
            with self._lock:
                row = self._conn.execute(
                    "SELECT state, hash FROM snapshots WHERE id = ?", (snapshot_id,)
                ).fetchone()
                anchor = self._anchor(self._conn, upto_seq)
            if row is None or anchor is None:
                continue
            state, stored = row
            if snapshot_hash(kind, upto_seq, anchor, state) == stored:
                return upto_seq, state
        return None

    def verify(
        self,
        *,
        upto: int | None = None,
        after: int = 0,
        anchor: str | None = None,
        on_row: Callable[..., Any] | None = None,
    ) -> VerifyReport:
        """Recompute the hash chain (up to ``upto``) and report the first bad seq, if any.

        ``after``: check only the rows after that seq, trusting its stored hash (or ``anchor``):
        what startup does from the snapshot it restores. ``on_row``: called for each row that
        passed (``_chain.verify_rows``). Safe while another connection appends or compacts (see
        ``_chain.verify_journal``).
        """

        def scan(start: int, limit: int) -> Iterator[Row]:
            where, params = _filters(None, None, limit)
            pages = self._pages(
                "seq, ts, stream, type, schema, payload, prev_hash, hash", start, where, params, None
            )
            return (row for page in pages for row in page)

        if anchor is None:
            with self._lock:
                anchor = self._anchor(self._conn, after)
            if anchor is None:
                return VerifyReport(
                    ok=False, checked=0, first_bad_seq=after, reason=f"row {after} is missing"
                )
        with self._lock:
            before_first = self._conn.execute("SELECT min(seq) FROM events WHERE seq < 1").fetchone()[0]
        if before_first is not None:
            return rows_before_the_first(before_first)
        return verify_journal(self._marks, scan, upto, after=after, anchor=anchor, on_row=on_row)

    def check_op_index(self) -> opindex.IndexReport:
        """Rebuild the derived operation index from the events (into a temporary file) and compare
        it with the stored one (``journal/opindex.py``). One read transaction: a concurrent
        writer's appends are not seen halfway."""
        with self._lock, tempfile.TemporaryDirectory(prefix="smgrl-op-index-") as tmp:
            if not self._readonly:
                self._set_busy_timeout(self._busy_ms)
            self._conn.execute("BEGIN")
            try:
                return opindex.check(self._conn, tmp)
            finally:
                self._conn.execute("ROLLBACK")

    def rebuild_op_index(self) -> int:
        """Drop and rebuild the derived operation index from the events, in one transaction;
        returns its rows."""
        with self._write() as conn:
            conn.execute("DELETE FROM op_index")
            return opindex.rebuild(conn, conn)

    def count_op_index(self) -> int:
        return int(self._query("SELECT count(*) FROM op_index")[0][0])

    def snapshot_seqs(self, kind: str) -> list[int]:
        """The ``upto_seq`` of every stored snapshot of ``kind``, valid or not, newest first: lets
        startup tell "no snapshot" from "a snapshot that failed its hash check"."""
        return [
            r[0]
            for r in self._query(
                "SELECT upto_seq FROM snapshots WHERE kind = ? ORDER BY upto_seq DESC", (kind,)
            )
        ]

    def _marks(self) -> Marks:
        # One statement, hence one snapshot: an append moves the head and the rows together.
        (hw_seq, hw_hash, compacted, last), *_ = self._query(
            "SELECT (SELECT value FROM meta WHERE key = 'high_water_seq'),"
            " (SELECT value FROM meta WHERE key = 'high_water_hash'),"
            " (SELECT value FROM meta WHERE key = 'bodies_compacted_before'),"
            " (SELECT max(seq) FROM events)"
        )
        if hw_seq is None or hw_hash is None or compacted is None:
            raise JournalError("journal meta keys are missing")
        return Marks(Head(int(hw_seq), 0.0, hw_hash), int(compacted), last or 0)


_JOURNAL_ID = re.compile(r"[0-9a-f]{32}")


def _check_identity(conn: sqlite3.Connection, path: str, *, readonly: bool) -> None:
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


def _check_expect(conn: sqlite3.Connection, expect: Expect, head: int) -> None:
    where, params = _filters(list(expect.types) if expect.types is not None else None, None, None)
    if expect.streams is not None:
        where += f" AND stream IN ({', '.join('?' * len(expect.streams))})" if expect.streams else " AND 0"
        params.extend(expect.streams)
    last = conn.execute(
        f"SELECT max(seq) FROM events WHERE seq > ?{where}", (expect.after, *params)
    ).fetchone()[0]
    problem = expect_problem(expect, head, last)
    if problem is not None:
        raise JournalConflict(problem, head=head, seq=last or head)


_INSERT_CHUNK = 128  # rows per multi-row INSERT (8 variables each, far below SQLite's limit)


@functools.cache
def _insert_sql(n: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * n)
    return f"INSERT INTO events (seq, ts, stream, type, schema, payload, prev_hash, hash) VALUES {values}"


def _insert_events(conn: sqlite3.Connection, rows: list[Row]) -> None:
    """Insert rows with multi-row INSERTs: one statement step per chunk instead of per row.

    Chunks are 128 rows, then powers of two for the rest, so only 8 distinct statements exist
    and all stay in the connection's statement cache.
    """
    i, n = 0, len(rows)
    while i < n:
        size = _INSERT_CHUNK
        while size > n - i:
            size //= 2
        conn.execute(_insert_sql(size), list(itertools.chain.from_iterable(rows[i : i + size])))
        i += size


def _filters(types: list[str] | None, stream: str | None, until_seq: int | None) -> tuple[str, list[Any]]:
    where, params = "", list[Any]()
    if until_seq is not None:
        where += " AND seq <= ?"
        params.append(until_seq)
    if stream is not None:
        where += " AND stream = ?"
        params.append(stream)
    if types is not None:
        where += f" AND type IN ({', '.join('?' * len(types))})" if types else " AND 0"
        params.extend(types)
    return where, params


def _decoded(pages: Iterator[list[Any]]) -> Iterator[Recorded]:
    for page in pages:
        for seq, ts, stream, type_, schema, payload, hash_ in page:
            if type(ts) is not float and type(ts) is not int:
                raise edited_row(seq, f"its ts is not a number ({_shown(ts)})")
            yield Recorded(seq, ts, stream, decode(type_, schema, payload), hash_)


def edited_row(seq: int, what: str) -> JournalCorrupt:
    return JournalCorrupt(
        f"the journal's row at seq {seq} was edited outside the journal: {what}; run `smgrl journal verify`",
        seq=seq,
    )


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."

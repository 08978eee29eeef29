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
import os
import pathlib
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Self

from . import lease as leases
from . import opindex
from ._chain import Row, build_batch
from ._schema_names import FORMAT_VERSION
from ._sqlite_identity import check_identity
from .base import Append, Expect, Lease
from .codec import Recorded
from .errors import JournalBusyError, JournalReadOnlyError
from .sqlbase import PAGE, SqlStore

if TYPE_CHECKING:
    import sqlite_utils

__all__ = ["FORMAT_VERSION", "SqliteStore"]

_PAGE = PAGE  # rows per read page (journal/sqlbase.py)

_SYNC_MODES = ("NORMAL", "FULL", "EXTRA")
# The WAL's size after a checkpoint (see "WAL size" above): well above what the writer's checkpoint
# interval (4,096 events) leaves in it, so steady traffic never truncates.
WAL_SIZE_LIMIT = 64 * 1024 * 1024
_OP_TYPES = frozenset(opindex.TYPES)
# SQLITE_BUSY and its extended codes (BUSY_RECOVERY, BUSY_SNAPSHOT, BUSY_TIMEOUT): the lock is taken.
_BUSY_CODES = frozenset({5, 261, 517, 773})


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


class SqliteStore(SqlStore):
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
        self._p = "?"
        self._name_tables("")

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
            check_identity(conn, path, readonly=readonly)
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

    # True when a commit never fsyncs (WAL with synchronous=NORMAL/OFF): it then costs tens of
    # microseconds, less than a hop to a worker thread and back (and far less than the GIL hand-off
    # that hop can cost under load), so JournalWriter commits on the event loop and calls
    # checkpoint() from a thread now and then.
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

    def _write(self, wait: float | None = None) -> _Transaction:
        """One write transaction. ``wait``: seconds to wait for SQLite's write lock (None: the
        store's ``busy_timeout_ms``; 0: do not wait, raise JournalBusyError at once)."""
        return _Transaction(self, wait)

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
                self._check_expect(conn, expect, head.seq)
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
            self._put_secrets(conn, secret_ops)
            last = recorded[-1]
            # Both high-water keys in one statement (what ``_set_meta`` writes, one step less).
            conn.execute(_HIGH_WATER, (str(last.seq), last.hash))
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

    # -- reading (the rest is SqlStore's, journal/sqlbase.py) --------------------------------------

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            if not self._readonly:
                self._set_busy_timeout(self._busy_ms)  # after inline commits it may be 0
            yield self._conn

    def _in(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        if not values:
            return " AND 0", []
        return f" AND {column} IN ({', '.join('?' * len(values))})", list(values)

    def _executemany(self, conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        conn.executemany(sql, rows)

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


class _Transaction:
    """``SqliteStore._write``: the store's lock (``SqlStore._held``'s rules), then ``BEGIN
    IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any exception. A class rather than two nested
    generator context managers: every fan-out commits twice, and the generators' machinery was
    about a tenth of the Python CPU of a commit (docs/benchmarks.md)."""

    __slots__ = ("_store", "_wait")

    def __init__(self, store: SqliteStore, wait: float | None) -> None:
        self._store = store
        self._wait = wait

    def __enter__(self) -> sqlite3.Connection:
        store, wait = self._store, self._wait
        if store._readonly:
            raise JournalReadOnlyError(f"{store.path} is open read-only")
        # wait == 0 (a caller on the event loop): taken at once or not at all; it must not wait
        # for the writer's thread, which holds it during a snapshot or a checkpoint.
        if wait == 0:
            if not store._lock.acquire(blocking=False):
                raise JournalBusyError("the journal store is in use by the writer's thread")
        else:
            store._lock.acquire()
        try:
            conn = store._conn
            store._set_busy_timeout(store._busy_ms if wait is None else max(0, int(wait * 1000)))
            # BEGIN IMMEDIATE takes the write lock up front, waiting up to busy_timeout for another
            # writer (a CLI compaction, say). A deferred BEGIN reads first and may then fail with
            # SQLITE_BUSY_SNAPSHOT when it upgrades to a write, which busy_timeout does not retry.
            try:
                conn.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                if wait == 0 and exc.sqlite_errorcode in _BUSY_CODES:
                    raise JournalBusyError("another connection holds the journal's write lock") from exc
                raise
        except BaseException:
            store._lock.release()
            raise
        return conn

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        store = self._store
        conn = store._conn
        try:
            if exc_type is None:
                try:
                    conn.execute("COMMIT")
                except BaseException:
                    _rollback(conn)
                    raise
            else:
                # Nothing of a failed transaction may survive (disk full mid-batch, failed COMMIT).
                _rollback(conn)
        finally:
            store._lock.release()


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


_HIGH_WATER = (
    "INSERT INTO meta (key, value) VALUES ('high_water_seq', ?), ('high_water_hash', ?)"
    " ON CONFLICT (key) DO UPDATE SET value = excluded.value"
)
_INSERT_EXACT = 16  # rows a batch may have to go in one statement of its own size
_INSERT_CHUNK = 128  # rows per multi-row INSERT (8 variables each, far below SQLite's limit)


@functools.cache
def _insert_sql(n: int) -> str:
    values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * n)
    return f"INSERT INTO events (seq, ts, stream, type, schema, payload, prev_hash, hash) VALUES {values}"


def _insert_events(conn: sqlite3.Connection, rows: list[Row]) -> None:
    """Insert rows with multi-row INSERTs: one statement step per chunk instead of per row.

    Up to ``_INSERT_EXACT`` rows go in one statement of that many rows; larger batches in chunks
    of 128 rows, then powers of two for the rest. So at most 24 distinct statements exist, and all
    stay in the connection's statement cache (128 statements).
    """
    i, n = 0, len(rows)
    if n <= _INSERT_EXACT:
        # A small batch (a fan-out's final transaction: its outcomes, its end and its audit) in
        # one statement of its own size.
        conn.execute(_insert_sql(n), list(itertools.chain.from_iterable(rows)))
        return
    while i < n:
        size = _INSERT_CHUNK
        while size > n - i:
            size //= 2
        conn.execute(_insert_sql(size), list(itertools.chain.from_iterable(rows[i : i + size])))
        i += size

"""PgStore: the journal in PostgreSQL, for gateways on several hosts (``--journal postgresql://...``).

Same schema semantics, hash chain (journal/_chain.py), verify, snapshots, compaction, secrets,
conditional append and leases as SqliteStore; it passes the same contract suite
(tests/journal/test_journal_store_contract.py). psycopg 3's SYNCHRONOUS API, called from threads
like SqliteStore (the project never uses asyncio, so psycopg's async API is out).

Tables live in their own PostgreSQL schema (``smgrl`` unless the URL says ``?schema=NAME``; that
parameter is smgrl's and is removed before the URL reaches libpq), so a database shared with an
application never mixes tables: ``events``, ``secrets``, ``snapshots``, ``meta``, ``leases``,
``migrations`` (the names of the applied migrations). A schema with tables but without
``migrations`` is another application's: refused untouched (JournalForeignError).

Writers. Every write transaction first takes a transaction-scoped advisory lock (one key per
journal schema) and then reads the head: appenders of every host are serialized and keep one
gapless chain. ``wait=0`` uses ``pg_try_advisory_xact_lock`` (JournalBusyError when taken), other
waits set ``lock_timeout``. A write transaction runs in pipeline mode: BEGIN, the lock and the
head read in one round trip, the rows, meta, NOTIFY and COMMIT in one more. Each append sends
``NOTIFY`` on the journal's channel inside its transaction (delivered at commit), carrying its
events when they fit in the payload and set no key (``_notify_payload``), else its last seq.

Tailing. ``change_token()`` is a counter bumped by a daemon thread that LISTENs on a dedicated
connection; that thread also calls the callbacks of ``add_listener`` (journal/watch.py wakes the
tail through it). It costs no query. Before it bumps the counter, that thread puts the events the
notification announces into a bounded cache of the newest events (those it carries as they are;
otherwise read on the LISTEN connection, already awake, no thread hop), which this process's own
appends extend too: ``recent(after_seq)`` serves
the tail from it (journal/writer.py ``follow``), so a wake-up usually needs no query and no thread
(docs/benchmarks.md, "Scale-out": the visibility lag). The cache holds a gapless run of events
``(start, end]``; ``recent`` answers only for a position inside it, and None otherwise (the caller
reads the store).

Leases: a row per lease, decided with the server's clock (``clock_timestamp()``) so hosts whose
clocks differ agree on expiry; journal/lease.py has the rules. (Not an advisory lock: a session
lock is held as long as a hung process keeps its connection, and would not share SQLite's
expiry semantics or tests.)

Secrets in the URL. ``path`` (what errors, logs and the CLI show) is the URL with the password
replaced by ``***``; every database error is re-raised with the password scrubbed from its text.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import itertools
import json
import logging
import re
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Self

from . import lease as leases
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
from ._schema_names import FORMAT_VERSION, initial_meta
from .base import Append, Expect, Lease, RawRow, expect_problem, type_names
from .codec import ControlStarted, Event, Recorded, decode
from .errors import (
    JournalBusyError,
    JournalConflict,
    JournalError,
    JournalForeignError,
    JournalReadOnlyError,
    JournalTooNewError,
)
from .retention import DEFAULT as DEFAULT_RETENTION
from .retention import Retention
from .urls import is_postgres_url, redact_url

__all__ = ["PgStore", "is_postgres_url", "redact_url"]

logger = logging.getLogger("smgrl.journal")

_PAGE = 2000
_COMPACT_PAGE = 256
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,40}")
PG_MIGRATIONS = ("0001_create_journal", "0002_leases")


_LISTENING: weakref.WeakSet[PgStore] = weakref.WeakSet()


def _stop_listeners() -> None:
    # At interpreter exit, before daemon threads are frozen: a LISTEN thread stopped inside
    # psycopg's C code during finalization can crash the process. Each stops within 0.25 s.
    for store in list(_LISTENING):
        store._listen_stop.set()
    for store in list(_LISTENING):
        thread = store._listen_thread
        if thread is not None:
            thread.join(timeout=2)


atexit.register(_stop_listeners)


def _split_url(url: str) -> tuple[str, str, str | None]:
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


class PgStore:
    """The journal in PostgreSQL. Build it with :meth:`open`. Synchronous; see the module docstring."""

    commits_are_cheap = False  # a round trip to the server: JournalWriter commits in its thread
    recent_limit = 2048  # events the tail cache keeps; a larger burst is read by the tail itself

    def __init__(self, conn: Any, *, url: str, schema: str, password: str | None, readonly: bool) -> None:
        self._conn = conn
        self._libpq_url = url
        self._password = password
        self.schema = schema
        self.path = redact_url(url)
        self._readonly = readonly
        self._lock = threading.Lock()
        self._clock = time.time
        self._s = schema
        self._key = f"smgrl.journal:{schema}"
        self._channel = f"smgrl_journal_{schema}"
        self._listen_lock = threading.Lock()
        self._listen_thread: threading.Thread | None = None
        self._listen_stop = threading.Event()
        self._listen_conn: Any = None
        self._listen_ready = threading.Event()
        self._changes = 0
        self._listeners: list[Callable[[], None]] = []
        # The tail cache (module docstring): the events (end - len, end] and the secrets rows
        # (seq, worker_id, key or None) set by them; None while unknown. Under _recent_lock
        # (written by the LISTEN thread and by the appending thread).
        self._recent_lock = threading.Lock()
        self._recent: list[Recorded] | None = None
        self._recent_end = 0
        self._recent_secrets: list[tuple[int, str, str | None]] = []
        self._closed = False

    # -- opening ----------------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str, *, readonly: bool = False, connect_timeout: float = 10.0) -> PgStore:
        """Connect, check the schema is a journal (creating it read-write), and return the store.

        Raises JournalForeignError / JournalTooNewError like SqliteStore, and JournalError (with the
        password scrubbed) when the server cannot be reached.
        """
        import psycopg

        try:
            libpq, schema, password = _split_url(url)
        except ValueError as exc:  # a bad schema= or port, an unclosed [: the CLI's one-line error
            raise JournalError(f"bad journal URL {redact_url(url)}: {exc}") from None
        try:
            conn = psycopg.connect(libpq, autocommit=True, connect_timeout=max(1, int(connect_timeout)))
        except psycopg.Error as exc:
            raise JournalError(
                f"cannot connect to the journal {redact_url(url)}: {_scrub(str(exc), password)}"
            ) from None
        store = cls(conn, url=libpq, schema=schema, password=password, readonly=readonly)
        try:
            with store._errors():
                if readonly:
                    conn.execute("SET default_transaction_read_only = on")
                store._migrate()
        except BaseException:
            conn.close()
            raise
        return store

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """Database errors re-raised as JournalError, never showing the URL's password."""
        import psycopg

        try:
            yield
        except psycopg.errors.LockNotAvailable as exc:
            raise JournalBusyError(f"the journal's write lock is taken: {self._scrub(exc)}") from None
        except psycopg.Error as exc:
            raise JournalError(f"journal database error on {self.path}: {self._scrub(exc)}") from None

    def _live(self) -> Any:
        """The connection, replaced first if it broke (server restart, a killed backend, a network
        cut): the failed operation raised JournalError, the next one reconnects. Under the lock.
        A store closed on purpose stays closed: using it is a bug to see, not a reason to reconnect."""
        if self._closed:
            raise JournalError(f"the journal store {self.path} is closed")
        if self._conn.closed or self._conn.broken:
            import psycopg

            with contextlib.suppress(psycopg.Error):
                self._conn.close()
            self._conn = psycopg.connect(self._libpq_url, autocommit=True, connect_timeout=10)
            if self._readonly:
                self._conn.execute("SET default_transaction_read_only = on")
            logger.warning("journal connection to %s re-established", self.path)
        return self._conn

    def _scrub(self, exc: object) -> str:
        return _scrub(str(exc), self._password)

    def _migrate(self) -> None:
        s = self._s
        with self._lock:
            tables = {
                r[0]
                for r in self._conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (s,)
                ).fetchall()
            }
            if tables and "migrations" not in tables:
                shown = ", ".join(sorted(tables)[:6])
                raise JournalForeignError(
                    f"{self.path}: schema {s!r} is not an smgrl journal: it holds tables of another"
                    f" application ({shown}); it was not modified"
                )
            if not tables:
                if self._readonly:
                    raise JournalForeignError(f"{self.path}: no smgrl journal in schema {s!r}")
                applied: list[str] = []
            else:
                applied = [r[0] for r in self._conn.execute(f"SELECT name FROM {s}.migrations ORDER BY name")]
                self._check_format(applied)
            pending = [m for m in PG_MIGRATIONS if m not in applied]
            if not pending:
                return
            if self._readonly:
                raise JournalError(
                    f"{self.path} is an smgrl journal written by an older smgrl (migrations"
                    f" {', '.join(pending)} not applied): start the gateway on it once to upgrade it"
                )
            with self._conn.transaction():
                # Two processes creating one journal at once: the second waits, then finds it done.
                self._conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self._key,))
                self._conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
                self._conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {s}.migrations (name TEXT PRIMARY KEY, applied_at TEXT)"
                )
                done = {r[0] for r in self._conn.execute(f"SELECT name FROM {s}.migrations")}
                now = datetime.datetime.now(datetime.UTC).isoformat()
                ddl = _ddl(s)
                for name in PG_MIGRATIONS:
                    if name in done:
                        continue
                    for statement in ddl[name]:
                        self._conn.execute(statement)
                    if name == "0001_create_journal":
                        self._conn.cursor().executemany(
                            f"INSERT INTO {s}.meta (key, value) VALUES (%s, %s)", initial_meta(now)
                        )
                    self._conn.execute(f"INSERT INTO {s}.migrations VALUES (%s, %s)", (name, now))

    def _check_format(self, applied: list[str]) -> None:
        s = self._s
        row = self._conn.execute(f"SELECT value FROM {s}.meta WHERE key = 'format_version'").fetchone()
        try:
            fmt = int(row[0]) if row else 0
        except (TypeError, ValueError):
            raise JournalForeignError(f"{self.path}: meta.format_version is not a journal format") from None
        if fmt > FORMAT_VERSION:
            raise JournalTooNewError(
                f"{self.path} is an smgrl journal of format {fmt}, written by a newer smgrl; this"
                f" smgrl knows format {FORMAT_VERSION}: upgrade smgrl to use it"
            )
        unknown = [m for m in applied if m not in PG_MIGRATIONS]
        if unknown and not self._readonly:
            raise JournalTooNewError(
                f"{self.path} was migrated by a newer smgrl ({', '.join(unknown)}); not writing it"
            )

    @property
    def readonly(self) -> bool:
        return self._readonly

    def checkpoint(self) -> None:
        pass  # the server checkpoints

    def close(self) -> None:
        self._closed = True
        self._listen_stop.set()
        thread = self._listen_thread
        if thread is not None:
            thread.join(timeout=5)
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- change notification (LISTEN on a dedicated connection) ------------------------------------

    def change_token(self) -> int:
        """A counter the LISTEN thread bumps at every commit anyone makes (no query)."""
        self._ensure_listener()
        return self._changes

    def add_listener(self, callback: Callable[[], None]) -> None:
        """``callback()`` is called (in the LISTEN thread) after each notified commit."""
        self._ensure_listener()
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(callback)

    def _ensure_listener(self) -> None:
        with self._listen_lock:
            if self._listen_thread is not None or self._closed:
                return
            self._listen_thread = threading.Thread(
                target=self._listen, name="smgrl-journal-listen", daemon=True
            )
            _LISTENING.add(self)
            self._listen_thread.start()
        # Subscribed before the first token is handed out: no commit after it goes unnoticed.
        self._listen_ready.wait(timeout=10)

    def _listen(self) -> None:
        import psycopg

        while not self._listen_stop.is_set():
            try:
                with psycopg.connect(self._libpq_url, autocommit=True, connect_timeout=10) as conn:
                    conn.execute(f"LISTEN {self._channel}")
                    # Listening first: whatever commits after this read is notified.
                    self._rebase(conn)
                    self._changes += 1  # (re)connected: whatever happened meanwhile counts as a change
                    self._listen_ready.set()
                    while not self._listen_stop.is_set():
                        # stop_after=1: leave the generator (it holds the connection's lock) to read
                        # on the same connection; notifications arriving meanwhile wait in psycopg's
                        # backlog and come out of the next notifies().
                        notified = [n.payload for n in conn.notifies(timeout=0.25, stop_after=1)]
                        if not notified:
                            continue
                        self._take(conn, notified)
                        self._changes += 1
                        for callback in list(self._listeners):
                            try:
                                callback()
                            except Exception:
                                logger.exception("journal change listener failed")
            except psycopg.Error as exc:
                self._forget_recent()
                self._listen_ready.set()
                if self._listen_stop.wait(1.0):
                    return
                logger.warning("journal LISTEN connection lost, reconnecting: %s", self._scrub(exc))

    # -- the tail cache (module docstring) ---------------------------------------------------------

    def recent(self, after_seq: int) -> tuple[list[Recorded], dict[str, str | None]] | None:
        """The events after ``after_seq`` up to the newest this process has seen notified (or
        appended), with the keys they set (None: deleted), from memory; None when ``after_seq`` is
        outside the cache (then read the store). Everything notified before the change token last
        moved is included; later commits move the token again."""
        with self._recent_lock:
            records = self._recent
            if records is None:
                return None
            start = self._recent_end - len(records)
            if not start <= after_seq <= self._recent_end:
                return None
            keys = {worker_id: key for seq, worker_id, key in self._recent_secrets if seq > after_seq}
            return records[after_seq - start :], keys

    def _forget_recent(self) -> None:
        with self._recent_lock:
            self._recent = None
            self._recent_secrets = []

    def _rebase(self, conn: Any) -> None:
        """An empty cache at the head: what follows it is read at the next notification."""
        head = conn.execute(f"SELECT max(seq) FROM {self._s}.events").fetchone()[0] or 0
        with self._recent_lock:
            self._recent, self._recent_end, self._recent_secrets = [], head, []

    def _remember(self, recorded: list[Recorded], keys: list[tuple[int, str, str | None]]) -> None:
        """Add events read or appended right after the cache's end (others are ignored)."""
        with self._recent_lock:
            records = self._recent
            if records is None:
                return
            recorded = [r for r in recorded if r.seq > self._recent_end]
            if not recorded:
                return
            if any(r.seq != self._recent_end + 1 + i for i, r in enumerate(recorded)):
                self._recent, self._recent_secrets = None, []  # not gapless: unknown until rebased
                return
            previous_end = self._recent_end
            records.extend(recorded)
            self._recent_end = recorded[-1].seq
            self._recent_secrets.extend(k for k in keys if k[0] > previous_end)
            if len(records) > 2 * self.recent_limit:  # trimmed in steps: amortized O(1) per event
                del records[: len(records) - self.recent_limit]
                start = self._recent_end - len(records)
                self._recent_secrets = [k for k in self._recent_secrets if k[0] > start]

    def _take(self, conn: Any, payloads: list[str]) -> None:
        """Bring the cache up to what ``payloads`` (notifications, in commit order) announce: the
        events a notification carries (``_notify_payload``) are taken as they are, no query; one
        that names only a seq, or does not follow the cache's end, is read on ``conn``."""
        for payload in payloads:
            rows = _rows_of(payload)
            if rows is None:
                self._prefetch(conn, _seq_of(payload))
                continue
            with self._recent_lock:
                follows = self._recent is not None and rows[0][0] <= self._recent_end + 1
            if not follows:
                self._prefetch(conn, None)  # reads everything up to the head: the rest is in it
                return
            try:
                recorded = [
                    Recorded(seq, ts, st, decode(type_, schema, body), hash_)
                    for seq, ts, st, type_, schema, body, hash_ in rows
                ]
            except Exception:  # noqa: BLE001 - a row this smgrl cannot decode: the tail's own read reports it
                self._forget_recent()
                return
            self._remember(recorded, [])  # a batch that set keys carries no rows: no keys here

    def _prefetch(self, conn: Any, notified: int | None) -> None:
        """Read what follows the cache's end on the LISTEN connection (``notified``: the highest
        seq the notifications named, None if unknown)."""
        with self._recent_lock:
            known = self._recent is not None
            end = self._recent_end
        if not known:
            self._rebase(conn)
            return
        if notified is not None and notified <= end:
            return  # this process's own append, already remembered: no query
        import psycopg

        s = self._s
        try:
            rows = conn.execute(
                f"SELECT seq, ts, stream, type, schema, payload, hash FROM {s}.events WHERE seq > %s"
                " ORDER BY seq LIMIT %s",
                (end, self.recent_limit + 1),
            ).fetchall()
            if len(rows) > self.recent_limit:  # a burst: the tail reads it from the store, the cache restarts
                self._rebase(conn)
                return
            if not rows:
                return
            keys = conn.execute(
                f"SELECT seq, worker_id, api_key FROM {s}.secrets WHERE seq > %s AND seq <= %s ORDER BY seq",
                (end, rows[-1][0]),
            ).fetchall()
            recorded = [
                Recorded(seq, ts, st, decode(type_, schema, payload), hash_)
                for seq, ts, st, type_, schema, payload, hash_ in rows
            ]
        except psycopg.Error:
            self._forget_recent()
            raise  # _listen reconnects
        except Exception:  # noqa: BLE001 - a row this smgrl cannot decode: the tail's own read reports it
            self._forget_recent()
            return
        self._remember(recorded, [(seq, worker_id, key or None) for seq, worker_id, key in keys])

    # -- writing ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self, wait: float | None = None, *, key: str | None = None) -> Iterator[Any]:
        """One write transaction holding the journal's advisory lock (``key``: another lock)."""
        if self._readonly:
            raise JournalReadOnlyError(f"{self.path} is open read-only")
        if wait == 0:
            if not self._lock.acquire(blocking=False):
                raise JournalBusyError("the journal store is in use by the writer's thread")
        else:
            self._lock.acquire()
        try:
            with self._errors():
                conn = self._live()
                # Pipeline mode (WHY: round trips are what a write costs on a network, and the lock
                # is held across them, so every other writer waits for them too): BEGIN, the lock and
                # the caller's first query (the head read) leave in one flush and come back in one
                # round trip; what needs no answer (the rows, the meta, NOTIFY) and COMMIT leave
                # together at the end. A fetch syncs; an error raises at the next sync and the
                # transaction rolls back, as outside a pipeline.
                with conn.pipeline(), conn.transaction():
                    lock_key = key or self._key
                    if wait == 0:
                        got = conn.execute(
                            "SELECT pg_try_advisory_xact_lock(hashtext(%s))", (lock_key,)
                        ).fetchone()[0]
                        if not got:
                            raise JournalBusyError("another connection holds the journal's write lock")
                    else:
                        ms = 30_000 if wait is None else max(1, int(wait * 1000))
                        # The timeout is set (transaction-local) before the lock waits; its answer is
                        # not awaited (a timeout raises at the next fetch: the head read).
                        conn.execute(
                            "SELECT set_config('lock_timeout', %s, true), pg_advisory_xact_lock(hashtext(%s))",
                            (str(ms), lock_key),
                        )
                    yield conn
        finally:
            self._lock.release()

    def _head(self, conn: Any) -> Head:
        row = conn.execute(f"SELECT seq, ts, hash FROM {self._s}.events ORDER BY seq DESC LIMIT 1").fetchone()
        return Head(*row) if row else EMPTY_HEAD

    def append_batch(
        self, items: Sequence[Append], *, wait: float | None = None, expect: Expect | None = None
    ) -> list[Recorded]:
        """As SqliteStore.append_batch: one transaction, head read under the advisory lock."""
        if not items:
            return []
        s = self._s
        with self._write(wait) as conn:
            head = self._head(conn)
            if expect is not None:
                self._check_expect(conn, expect, head.seq)
            rows, recorded, secret_ops = build_batch(items, head, self._clock())
            # The rest needs no answer: queued in _write's pipeline, sent with COMMIT in one round
            # trip (an error raises when _write's block ends, and the transaction rolls back).
            conn.cursor().executemany(
                f"INSERT INTO {s}.events (seq, ts, stream, type, schema, payload, prev_hash, hash)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                rows,
            )
            for worker_id, api_key, seq in secret_ops:
                # A deletion leaves a tombstone ('') carrying its seq, as in SQLite.
                conn.execute(
                    f"INSERT INTO {s}.secrets (worker_id, api_key, seq) VALUES (%s, %s, %s)"
                    " ON CONFLICT (worker_id) DO UPDATE SET api_key = excluded.api_key,"
                    " seq = excluded.seq",
                    (worker_id, api_key or "", seq),
                )
            last = recorded[-1]
            self._set_meta(conn, ("high_water_seq", str(last.seq)), ("high_water_hash", last.hash))
            conn.execute("SELECT pg_notify(%s, %s)", (self._channel, _notify_payload(rows, secret_ops)))
        # Committed: the tail cache learns this process's own events without a query.
        self._remember(
            recorded, [(seq, worker_id, api_key or None) for worker_id, api_key, seq in secret_ops]
        )
        return recorded

    def _set_meta(self, conn: Any, *pairs: tuple[str, str]) -> None:
        conn.cursor().executemany(
            f"INSERT INTO {self._s}.meta (key, value) VALUES (%s, %s)"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            pairs,
        )

    def _check_expect(self, conn: Any, expect: Expect, head: int) -> None:
        sql = f"SELECT max(seq) FROM {self._s}.events WHERE seq > %s"
        params: list[Any] = [expect.after]
        if expect.types is not None:
            sql += " AND type = ANY(%s)"
            params.append(list(expect.types))
        if expect.streams is not None:
            sql += " AND stream = ANY(%s)"
            params.append(list(expect.streams))
        last = conn.execute(sql, params).fetchone()[0]
        problem = expect_problem(expect, head, last)
        if problem is not None:
            raise JournalConflict(problem, head=head, seq=last or head)

    # -- leases -----------------------------------------------------------------------------------

    def _lease_op(self, name: str, decide: Callable[[Lease | None, float], Lease | None]) -> Lease | None:
        s = self._s
        with self._write(key=f"{self._key}:lease:{name}") as conn:
            row = conn.execute(
                f"SELECT name, holder, expires, epoch FROM {s}.leases WHERE name = %s", (name,)
            ).fetchone()
            now = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]
            new = decide(Lease(*row) if row else None, now)
            if new is not None:
                conn.execute(
                    f"INSERT INTO {s}.leases (name, holder, expires, epoch) VALUES (%s, %s, %s, %s)"
                    " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder,"
                    " expires = excluded.expires, epoch = excluded.epoch",
                    (new.name, new.holder, new.expires, new.epoch),
                )
        return new

    def take_lease(self, name: str, holder: str, ttl: float) -> Lease | None:
        leases.check_args(name, holder, ttl)
        return self._lease_op(name, lambda cur, now: leases.taken(cur, name, holder, now, ttl))

    def renew_lease(self, name: str, holder: str, ttl: float) -> Lease:
        leases.check_args(name, holder, ttl)
        new = self._lease_op(name, lambda cur, now: leases.renewed(cur, name, holder, now, ttl))
        assert new is not None
        return new

    def release_lease(self, name: str, holder: str) -> bool:
        leases.check_args(name, holder)
        return self._lease_op(name, lambda cur, now: leases.released(cur, holder)) is not None

    def lease(self, name: str) -> Lease | None:
        rows = self._query(
            f"SELECT name, holder, expires, epoch FROM {self._s}.leases WHERE name = %s", (name,)
        )
        return Lease(*rows[0]) if rows else None

    # -- snapshots and compaction -----------------------------------------------------------------

    def save_snapshot(
        self, kind: str, upto_seq: int, state_json: str, *, retention: Retention = DEFAULT_RETENTION
    ) -> list[int]:
        json.loads(state_json)
        s = self._s
        with self._write() as conn:
            anchor = self._anchor(conn, upto_seq)
            if anchor is None:
                raise ValueError(f"cannot snapshot at seq {upto_seq}: no such event")
            conn.execute(
                f"INSERT INTO {s}.snapshots (kind, upto_seq, ts, state, hash) VALUES (%s, %s, %s, %s, %s)",
                (
                    kind,
                    upto_seq,
                    self._clock(),
                    state_json,
                    snapshot_hash(kind, upto_seq, anchor, state_json),
                ),
            )
            rows = conn.execute(f"SELECT id, upto_seq FROM {s}.snapshots WHERE kind = %s", (kind,)).fetchall()
            dropped = retention.drop([tuple(r) for r in rows], self._head(conn).seq)
            if dropped:
                conn.execute(f"DELETE FROM {s}.snapshots WHERE id = ANY(%s)", ([i for i, _ in dropped],))
        return sorted(seq for _, seq in dropped)

    def compact_bodies(self, before_seq: int) -> int:
        s = self._s
        compacted = 0
        while True:
            with self._write() as conn:
                start = int(self._meta_value(conn, "bodies_compacted_before"))
                stop = min(before_seq, self._head(conn).seq + 1)
                if stop <= start:
                    return compacted
                rows = conn.execute(
                    f"SELECT seq, payload FROM {s}.events WHERE type = %s AND seq >= %s AND seq < %s"
                    " ORDER BY seq LIMIT %s",
                    (ControlStarted.TYPE, start, stop, _COMPACT_PAGE),
                ).fetchall()
                updates = compacted_payloads(rows)
                if updates:
                    conn.cursor().executemany(f"UPDATE {s}.events SET payload = %s WHERE seq = %s", updates)
                done_to = rows[-1][0] + 1 if len(rows) == _COMPACT_PAGE else stop
                self._set_meta(conn, ("bodies_compacted_before", str(done_to)))
                compacted += len(updates)

    # -- reading ----------------------------------------------------------------------------------

    def _meta_value(self, conn: Any, key: str) -> str:
        row = conn.execute(f"SELECT value FROM {self._s}.meta WHERE key = %s", (key,)).fetchone()
        if row is None:
            raise JournalError(f"journal meta key {key!r} is missing")
        return str(row[0])

    def _anchor(self, conn: Any, upto_seq: int) -> str | None:
        if upto_seq == 0:
            return GENESIS
        row = conn.execute(f"SELECT hash FROM {self._s}.events WHERE seq = %s", (upto_seq,)).fetchone()
        return row[0] if row else None

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock, self._errors():
            rows: list[Any] = self._live().execute(sql, params).fetchall()
            return rows

    def meta(self) -> dict[str, str]:
        return dict(self._query(f"SELECT key, value FROM {self._s}.meta"))

    def last_seq(self) -> int:
        return int(self._query(f"SELECT max(seq) FROM {self._s}.events")[0][0] or 0)

    def count(self) -> int:
        return int(self._query(f"SELECT count(*) FROM {self._s}.events")[0][0])

    def secrets(self) -> dict[str, str]:
        return dict(
            self._query(
                f"SELECT worker_id, api_key FROM {self._s}.secrets WHERE api_key != '' ORDER BY worker_id"
            )
        )

    def get_secret(self, worker_id: str) -> str | None:
        rows = self._query(f"SELECT api_key FROM {self._s}.secrets WHERE worker_id = %s", (worker_id,))
        return (rows[0][0] or None) if rows else None

    def secret_changes(self, after_seq: int, until_seq: int) -> dict[str, str | None]:
        rows = self._query(
            f"SELECT worker_id, api_key FROM {self._s}.secrets WHERE seq > %s AND seq <= %s",
            (after_seq, until_seq),
        )
        return {worker_id: key or None for worker_id, key in rows}

    def _pages(
        self, columns: str, after_seq: int, where: str, params: Sequence[Any], limit: int | None
    ) -> Iterator[list[Any]]:
        sql = f"SELECT {columns} FROM {self._s}.events WHERE seq > %s{where} ORDER BY seq LIMIT %s"
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
        s = self._s
        after, until = 0, None
        if since_ts is not None:
            rows = self._query(
                f"SELECT seq FROM {s}.events WHERE ts >= %s ORDER BY ts, seq LIMIT 1", (since_ts,)
            )
            if not rows:
                return None
            after = rows[0][0] - 1
        if until_ts is not None:
            rows = self._query(
                f"SELECT seq FROM {s}.events WHERE ts < %s ORDER BY ts DESC, seq DESC LIMIT 1", (until_ts,)
            )
            if not rows:
                return None
            until = rows[0][0]
        return after, until

    # The signature is EventStore.read's (journal/base.py), spelled out by every store for its types.
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
        if since_ts is not None or until_ts is not None:
            window = self._ts_to_seq(since_ts, until_ts)
            if window is None:
                return iter(())
            after_seq = max(after_seq, window[0])
            if window[1] is not None:
                until_seq = window[1] if until_seq is None else min(until_seq, window[1])
        where, params = _filters(type_names(types), stream, until_seq)
        pages = self._pages("seq, ts, stream, type, schema, payload, hash", after_seq, where, params, limit)
        return (
            Recorded(seq, ts, st, decode(type_, schema, payload), hash_)
            for page in pages
            for seq, ts, st, type_, schema, payload, hash_ in page
        )

    def read_raw(
        self, after_seq: int = 0, types: Iterable[str | type[Event]] | None = None
    ) -> Iterator[RawRow]:
        where, params = _filters(type_names(types), None, None)
        pages = self._pages("seq, ts, stream, type, schema, payload", after_seq, where, params, None)
        return (tuple(row) for page in pages for row in page)

    def latest_snapshot(self, kind: str, max_seq: int | None = None) -> tuple[int, str] | None:
        s = self._s
        sql = f"SELECT id, upto_seq FROM {s}.snapshots WHERE kind = %s"
        params: list[Any] = [kind]
        if max_seq is not None:
            sql += " AND upto_seq <= %s"
            params.append(max_seq)
        for snapshot_id, upto_seq in self._query(sql + " ORDER BY upto_seq DESC, id DESC", params):
            with self._lock, self._errors():
                row = (
                    self._live()
                    .execute(f"SELECT state, hash FROM {s}.snapshots WHERE id = %s", (snapshot_id,))
                    .fetchone()
                )
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
        def scan(start: int, limit: int) -> Iterator[Row]:
            where, params = _filters(None, None, limit)
            pages = self._pages(
                "seq, ts, stream, type, schema, payload, prev_hash, hash", start, where, params, None
            )
            return (tuple(row) for page in pages for row in page)

        if anchor is None:
            with self._lock, self._errors():
                anchor = self._anchor(self._live(), after)
            if anchor is None:
                return VerifyReport(
                    ok=False, checked=0, first_bad_seq=after, reason=f"row {after} is missing"
                )
        before_first = self._query(f"SELECT min(seq) FROM {self._s}.events WHERE seq < 1")[0][0]
        if before_first is not None:
            return rows_before_the_first(before_first)
        return verify_journal(self._marks, scan, upto, after=after, anchor=anchor, on_row=on_row)

    def snapshot_seqs(self, kind: str) -> list[int]:
        return [
            r[0]
            for r in self._query(
                f"SELECT upto_seq FROM {self._s}.snapshots WHERE kind = %s ORDER BY upto_seq DESC", (kind,)
            )
        ]

    def _marks(self) -> Marks:
        s = self._s
        (hw_seq, hw_hash, compacted, last), *_ = self._query(
            f"SELECT (SELECT value FROM {s}.meta WHERE key = 'high_water_seq'),"
            f" (SELECT value FROM {s}.meta WHERE key = 'high_water_hash'),"
            f" (SELECT value FROM {s}.meta WHERE key = 'bodies_compacted_before'),"
            f" (SELECT max(seq) FROM {s}.events)"
        )
        if hw_seq is None or hw_hash is None or compacted is None:
            raise JournalError("journal meta keys are missing")
        return Marks(Head(int(hw_seq), 0.0, hw_hash), int(compacted), last or 0)

    # -- copying (the CLI reads a PostgreSQL journal through an SQLite copy) -----------------------

    def identity(self) -> str:
        """Where this journal lives, WITHOUT the user or password: ``host:port/database?schema=``
        as the server reports them (the CLI's cache file is named by a hash of it)."""
        info = self._conn.info
        return f"{info.host}:{info.port}/{info.dbname}?schema={self._s}"

    def copy_rows(
        self,
        after: int = 0,
        *,
        anchor: str | None = None,
        known_snapshots: Iterable[int] = (),
        compacted_from: int = 0,
    ) -> Iterator[tuple[str, list[tuple[Any, ...]]]]:
        """The journal as ``(table, rows)`` chunks, read in ONE repeatable-read transaction (a
        consistent view while gateways append); never the ``secrets`` table. In this order:

        * ``("seam", [(hash,)] or [])``: the hash of event ``after`` (only when ``after`` > 0); a
          copy that holds events up to ``after`` with hash ``anchor`` continues only if it is the
          same (the chain: everything before it is then the same too); otherwise this yields
          ``("diverged", [])`` and stops;
        * ``("meta", rows)``: the whole table;
        * ``("snapshot_ids", [(id,), ...])``: every snapshot's id, then ``("snapshots", rows)``:
          those not in ``known_snapshots``;
        * ``("compacted", [(seq, payload), ...])``: control.started payloads rewritten by body
          compaction since ``compacted_from`` (the copy's ``bodies_compacted_before``), up to ``after``;
        * ``("events", rows)``: the events after ``after``, in seq order, in chunks.
        """
        s = self._s
        known = set(known_snapshots)
        with self._lock, self._errors(), self._live().transaction():
            conn = self._conn
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            if after > 0:
                seam = conn.execute(f"SELECT hash FROM {s}.events WHERE seq = %s", (after,)).fetchall()
                if [tuple(r) for r in seam] != [(anchor,)]:
                    yield "diverged", []
                    return
                yield "seam", [tuple(r) for r in seam]
            meta = conn.execute(f"SELECT key, value FROM {s}.meta").fetchall()
            yield "meta", meta
            ids = conn.execute(f"SELECT id FROM {s}.snapshots ORDER BY id").fetchall()
            yield "snapshot_ids", ids
            new = [i for (i,) in ids if i not in known]
            yield (
                "snapshots",
                conn.execute(
                    f"SELECT id, kind, upto_seq, ts, state, hash FROM {s}.snapshots WHERE id = ANY(%s) ORDER BY id",
                    (new,),
                ).fetchall()
                if new
                else [],
            )
            compacted_to = int(dict(meta).get("bodies_compacted_before") or 0)
            if after > 0 and compacted_to > compacted_from:
                yield (
                    "compacted",
                    conn.execute(
                        f"SELECT seq, payload FROM {s}.events WHERE type = %s AND seq >= %s AND seq < %s"
                        " AND seq <= %s ORDER BY seq",
                        (ControlStarted.TYPE, compacted_from, compacted_to, after),
                    ).fetchall(),
                )
            cur = conn.cursor(name="smgrl_copy")  # server-side: flat memory
            cur.execute(
                f"SELECT seq, ts, stream, type, schema, payload, prev_hash, hash FROM {s}.events"
                " WHERE seq > %s ORDER BY seq",
                (after,),
            )
            while True:
                rows = cur.fetchmany(_PAGE)
                if not rows:
                    break
                yield "events", rows
            cur.close()


# Bytes of events a NOTIFY may carry (PostgreSQL allows 8000). Kept small: the server's
# notification queue (8 GB) is held by its slowest listener, and a listener that stops reading
# without disconnecting (a SIGSTOPped gateway) pins it until it fills and every NOTIFY, so every
# append, fails; a 1 KB entry fills it about 16x sooner than a seq (docs/scale-out.md).
_NOTIFY_MAX = 1000


def _notify_payload(rows: Sequence[tuple[Any, ...]], secret_ops: Sequence[tuple[Any, ...]]) -> str:
    """What an append's NOTIFY says: its events as JSON ``[[seq, ts, stream, type, schema,
    payload, hash], ...]`` when they fit and set no key (the listeners' tail then needs no query;
    keys never travel in a notification), else its last seq."""
    if not secret_ops:
        text = json.dumps([[r[0], r[1], r[2], r[3], r[4], r[5], r[7]] for r in rows], separators=(",", ":"))
        if len(text.encode()) <= _NOTIFY_MAX:
            return text
    return str(rows[-1][0])


def _rows_of(payload: str) -> list[tuple[Any, ...]] | None:
    """The events a notification carries, None if it names a seq only (or is not understood)."""
    if not payload.startswith("["):
        return None
    try:
        rows = [tuple(r) for r in json.loads(payload)]
    except (ValueError, TypeError):
        return None
    ok = rows and all(len(r) == 7 and isinstance(r[0], int) for r in rows)
    if not ok or any(b[0] != a[0] + 1 for a, b in itertools.pairwise(rows)):
        return None
    return rows


def _seq_of(payload: str) -> int | None:
    """The seq a notification names (an append's last), None if it names none."""
    try:
        return int(payload)
    except ValueError:
        return None


def _scrub(text: str, password: str | None) -> str:
    if password:
        text = text.replace(password, "***")
        quoted = urllib.parse.quote(password, safe="")
        if quoted != password:
            text = text.replace(quoted, "***")
    return text


def _filters(types: list[str] | None, stream: str | None, until_seq: int | None) -> tuple[str, list[Any]]:
    where, params = "", list[Any]()
    if until_seq is not None:
        where += " AND seq <= %s"
        params.append(until_seq)
    if stream is not None:
        where += " AND stream = %s"
        params.append(stream)
    if types is not None:
        where += " AND type = ANY(%s)"
        params.append(list(types))
    return where, params

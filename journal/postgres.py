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
events when they fit in the payload and set no key (``_pg_tail._notify_payload``), else its last seq.

Tailing. ``change_token()`` is a counter bumped by a daemon thread that LISTENs on a dedicated
connection; that thread also calls the callbacks of ``add_listener`` (journal/watch.py wakes the
tail through it). It costs no query. Before it bumps the counter, that thread puts the events the
notification announces into a bounded cache of the newest events (those it carries as they are;
otherwise read on the LISTEN connection, already awake, no thread hop), which this process's own
appends extend too (journal/_pg_tail.py): ``recent(after_seq)`` serves
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

import contextlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Self

from . import lease as leases
from ._chain import build_batch
from ._pg_schema import PG_MIGRATIONS, migrate, split_url
from ._pg_tail import PgTail, _notify_payload
from .base import Append, Expect, Lease
from .codec import ControlStarted, Recorded
from .errors import JournalBusyError, JournalError
from .sqlbase import PAGE, SqlStore
from .urls import is_postgres_url, redact_url

__all__ = ["PG_MIGRATIONS", "PgStore", "is_postgres_url", "redact_url"]

logger = logging.getLogger("smgrl.journal")


class PgStore(PgTail, SqlStore):
    """The journal in PostgreSQL. Build it with :meth:`open`. Synchronous; see the module docstring.

    Reading, snapshots, compaction and verify are SqlStore's (journal/sqlbase.py); the LISTEN
    thread and the tail cache are PgTail's (journal/_pg_tail.py)."""

    commits_are_cheap = False  # a round trip to the server: JournalWriter commits in its thread

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
        self._p = "%s"
        self._name_tables(f"{schema}.")
        self._init_tail()
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
            libpq, schema, password = split_url(url)
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
        with self._lock:
            migrate(self._conn, schema=self._s, key=self._key, path=self.path, readonly=self._readonly)

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

    # -- writing ----------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self, wait: float | None = None, *, key: str | None = None) -> Iterator[Any]:
        """One write transaction holding the journal's advisory lock (``key``: another lock)."""
        with self._held(wait), self._errors():
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
            self._put_secrets(conn, secret_ops)
            last = recorded[-1]
            self._set_meta(conn, ("high_water_seq", str(last.seq)), ("high_water_hash", last.hash))
            conn.execute("SELECT pg_notify(%s, %s)", (self._channel, _notify_payload(rows, secret_ops)))
        # Committed: the tail cache learns this process's own events without a query.
        self._remember(
            recorded, [(seq, worker_id, api_key or None) for worker_id, api_key, seq in secret_ops]
        )
        return recorded

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

    # -- the dialect's hooks for SqlStore (journal/sqlbase.py) -------------------------------------

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        with self._lock, self._errors():
            yield self._live()

    def _in(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        return f" AND {column} = ANY(%s)", [list(values)]

    def _executemany(self, conn: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        conn.cursor().executemany(sql, rows)

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
                rows = cur.fetchmany(PAGE)
                if not rows:
                    break
                yield "events", rows
            cur.close()


def _scrub(text: str, password: str | None) -> str:
    if password:
        text = text.replace(password, "***")
        quoted = urllib.parse.quote(password, safe="")
        if quoted != password:
            text = text.replace(quoted, "***")
    return text

"""SqlStore: what the SQL stores (SqliteStore, PgStore) share, written once.

Reading (keyset pages by seq, the ts window, the filters, decoding), the conditional-append check,
snapshots, body compaction, verify's inputs, secrets and meta are the same statements on both;
they differ only in the dialect, which each store gives as small hooks:

* ``_p``: the parameter placeholder (``?`` for sqlite3, ``%s`` for psycopg);
* ``_t_events``, ``_t_secrets``, ``_t_snapshots``, ``_t_meta``, ``_t_leases``: the table names
  (PostgreSQL qualifies them with the journal's schema), set by ``_name_tables``;
* ``_in(column, values)``: "column is one of values" as a WHERE fragment and its parameters;
* ``_connection()``: the store's connection for one read, under the store's lock;
* ``_write(wait)``: one write transaction;
* ``_executemany(conn, sql, rows)``: the same statement for each row.

How each store writes (locks, pipelines, notifications) stays in its own module.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ._chain import (
    EMPTY_HEAD,
    GENESIS,
    Head,
    Marks,
    Row,
    VerifyReport,
    compacted_payloads,
    rows_before_the_first,
    snapshot_hash,
    verify_journal,
)
from .base import Expect, Lease, RawRow, check_expect, type_names
from .codec import ControlStarted, Event, Recorded, decode
from .errors import JournalBusyError, JournalCorrupt, JournalError, JournalReadOnlyError
from .retention import DEFAULT as DEFAULT_RETENTION
from .retention import Retention

__all__ = ["COMPACT_PAGE", "PAGE", "SqlStore", "edited_row"]

PAGE = 2000  # rows per read page: flat memory, and the read snapshot is released between pages
COMPACT_PAGE = 256  # control.started rows per compaction transaction (up to 64 KiB each)

logger = logging.getLogger("smgrl.journal")


class SqlStore:
    """The shared half of SqliteStore and PgStore (see the module docstring for the hooks)."""

    _p: str
    _t_events: str
    _t_secrets: str
    _t_snapshots: str
    _t_meta: str
    _t_leases: str
    _lock: threading.Lock
    _readonly: bool
    path: str
    _clock: Callable[[], float]

    def _name_tables(self, prefix: str) -> None:
        self._t_events = f"{prefix}events"
        self._t_secrets = f"{prefix}secrets"
        self._t_snapshots = f"{prefix}snapshots"
        self._t_meta = f"{prefix}meta"
        self._t_leases = f"{prefix}leases"

    @contextlib.contextmanager
    def _held(self, wait: float | None) -> Iterator[None]:
        """The store's own lock around one write transaction, after the read-only check; with
        ``wait == 0`` (a caller on the event loop) taken at once or not at all: it must not wait
        for the writer's thread, which holds it during a snapshot or a checkpoint."""
        if self._readonly:
            raise JournalReadOnlyError(f"{self.path} is open read-only")
        if wait == 0:
            if not self._lock.acquire(blocking=False):
                raise JournalBusyError("the journal store is in use by the writer's thread")
        else:
            self._lock.acquire()
        try:
            yield
        finally:
            self._lock.release()

    # -- the dialect's hooks ----------------------------------------------------------------------

    def _in(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        raise NotImplementedError

    def _connection(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _write(self, wait: float | None = None) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def _executemany(self, conn: Any, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        raise NotImplementedError

    # -- statements on a connection ---------------------------------------------------------------

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._connection() as conn:
            rows: list[Any] = conn.execute(sql, params).fetchall()
            return rows

    def _head(self, conn: Any) -> Head:
        row = conn.execute(f"SELECT seq, ts, hash FROM {self._t_events} ORDER BY seq DESC LIMIT 1").fetchone()
        return Head(*row) if row else EMPTY_HEAD

    def _anchor(self, conn: Any, upto_seq: int) -> str | None:
        if upto_seq == 0:
            return GENESIS
        row = conn.execute(f"SELECT hash FROM {self._t_events} WHERE seq = {self._p}", (upto_seq,)).fetchone()
        return row[0] if row else None

    def _meta_value(self, conn: Any, key: str) -> str:
        row = conn.execute(f"SELECT value FROM {self._t_meta} WHERE key = {self._p}", (key,)).fetchone()
        if row is None:
            raise JournalError(f"journal meta key {key!r} is missing")
        return str(row[0])

    def _set_meta(self, conn: Any, *pairs: tuple[str, str]) -> None:
        p = self._p
        self._executemany(
            conn,
            f"INSERT INTO {self._t_meta} (key, value) VALUES ({p}, {p})"
            " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            pairs,
        )

    def _put_secrets(self, conn: Any, secret_ops: Iterable[tuple[str, str | None, int]]) -> None:
        p = self._p
        for worker_id, api_key, seq in secret_ops:
            # A deletion leaves a tombstone ('') carrying its seq: see secret_changes().
            conn.execute(
                f"INSERT INTO {self._t_secrets} (worker_id, api_key, seq) VALUES ({p}, {p}, {p})"
                " ON CONFLICT (worker_id) DO UPDATE SET api_key = excluded.api_key, seq = excluded.seq",
                (worker_id, api_key or "", seq),
            )

    def _filters(
        self, types: Sequence[str] | None, stream: str | None, until_seq: int | None
    ) -> tuple[str, list[Any]]:
        where, params = "", list[Any]()
        if until_seq is not None:
            where += f" AND seq <= {self._p}"
            params.append(until_seq)
        if stream is not None:
            where += f" AND stream = {self._p}"
            params.append(stream)
        if types is not None:
            sql, values = self._in("type", types)
            where += sql
            params.extend(values)
        return where, params

    def _check_expect(self, conn: Any, expect: Expect, head: int) -> None:
        where, params = self._filters(expect.types, None, None)
        if expect.streams is not None:
            sql, values = self._in("stream", expect.streams)
            where += sql
            params.extend(values)
        last = conn.execute(
            f"SELECT max(seq) FROM {self._t_events} WHERE seq > {self._p}{where}", (expect.after, *params)
        ).fetchone()[0]
        check_expect(expect, head, last)

    # -- reading ----------------------------------------------------------------------------------

    def _pages(
        self, columns: str, after_seq: int, where: str, params: Sequence[Any], limit: int | None
    ) -> Iterator[list[Any]]:
        """Keyset pagination by seq. Each page is its own short read: memory stays flat over 1M
        rows and no read snapshot is held across pages (a long-lived one would stop WAL checkpoints)."""
        p = self._p
        sql = f"SELECT {columns} FROM {self._t_events} WHERE seq > {p}{where} ORDER BY seq LIMIT {p}"
        remaining = limit
        while remaining is None or remaining > 0:
            size = PAGE if remaining is None else min(PAGE, remaining)
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
        events, p = self._t_events, self._p
        after, until = 0, None
        if since_ts is not None:
            rows = self._query(
                f"SELECT seq FROM {events} WHERE ts >= {p} ORDER BY ts, seq LIMIT 1", (since_ts,)
            )
            if not rows:
                return None
            after = rows[0][0] - 1
        if until_ts is not None:
            rows = self._query(
                f"SELECT seq FROM {events} WHERE ts < {p} ORDER BY ts DESC, seq DESC LIMIT 1", (until_ts,)
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
        where, params = self._filters(type_names(types), stream, until_seq)
        pages = self._pages("seq, ts, stream, type, schema, payload, hash", after_seq, where, params, limit)
        return _decoded(pages)

    def read_raw(
        self, after_seq: int = 0, types: Iterable[str | type[Event]] | None = None
    ) -> Iterator[RawRow]:
        """``(seq, ts, stream, type, schema, payload)`` tuples, undecoded: projections decode only
        the types they fold."""
        where, params = self._filters(type_names(types), None, None)
        pages = self._pages("seq, ts, stream, type, schema, payload", after_seq, where, params, None)
        return (tuple(row) for page in pages for row in page)

    def meta(self) -> dict[str, str]:
        """The ``meta`` table (journal id, creation time, format version, head, compaction mark)."""
        return dict(self._query(f"SELECT key, value FROM {self._t_meta}"))

    def last_seq(self) -> int:
        return int(self._query(f"SELECT max(seq) FROM {self._t_events}")[0][0] or 0)

    def count(self) -> int:
        return int(self._query(f"SELECT count(*) FROM {self._t_events}")[0][0])

    def secrets(self) -> dict[str, str]:
        return dict(
            self._query(
                f"SELECT worker_id, api_key FROM {self._t_secrets} WHERE api_key != '' ORDER BY worker_id"
            )
        )

    def get_secret(self, worker_id: str) -> str | None:
        rows = self._query(f"SELECT api_key FROM {self._t_secrets} WHERE worker_id = {self._p}", (worker_id,))
        return (rows[0][0] or None) if rows else None

    def secret_changes(self, after_seq: int, until_seq: int) -> dict[str, str | None]:
        """The keys set (or deleted: None) by the events ``after_seq < seq <= until_seq`` and not
        changed since: what a process following the others' appends applies to its key ring."""
        p = self._p
        rows = self._query(
            f"SELECT worker_id, api_key FROM {self._t_secrets} WHERE seq > {p} AND seq <= {p}",
            (after_seq, until_seq),
        )
        return {worker_id: key or None for worker_id, key in rows}

    def lease(self, name: str) -> Lease | None:
        """The lease row as stored (an expired or released one included)."""
        rows = self._query(
            f"SELECT name, holder, expires, epoch FROM {self._t_leases} WHERE name = {self._p}", (name,)
        )
        return Lease(*rows[0]) if rows else None

    # -- snapshots --------------------------------------------------------------------------------

    def save_snapshot(
        self, kind: str, upto_seq: int, state_json: str, *, retention: Retention = DEFAULT_RETENTION
    ) -> list[int]:
        """Store a projection's state as of ``upto_seq`` (bound to that row's chain hash), and drop
        the snapshots of that kind the ``retention`` policy no longer keeps (in the same
        transaction). Returns the ``upto_seq`` of each dropped snapshot (logged too)."""
        json.loads(state_json)  # refuse garbage now rather than at the next startup
        snapshots, p = self._t_snapshots, self._p
        with self._write() as conn:
            anchor = self._anchor(conn, upto_seq)
            if anchor is None:
                raise ValueError(f"cannot snapshot at seq {upto_seq}: no such event")
            conn.execute(
                f"INSERT INTO {snapshots} (kind, upto_seq, ts, state, hash) VALUES ({p}, {p}, {p}, {p}, {p})",
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
            rows = [
                tuple(r)
                for r in conn.execute(
                    f"SELECT id, upto_seq FROM {snapshots} WHERE kind = {p}", (kind,)
                ).fetchall()
            ]
            dropped = retention.drop(rows, self._head(conn).seq)
            if dropped:
                self._executemany(
                    conn, f"DELETE FROM {snapshots} WHERE id = {p}", [(snap_id,) for snap_id, _ in dropped]
                )
        if dropped:
            logger.info(
                "snapshot retention dropped %s snapshot(s) at seq %s (kept %d)",
                len(dropped),
                ", ".join(str(seq) for _, seq in sorted(dropped, key=lambda r: r[1])),
                len(rows) - len(dropped),
            )
        return sorted(seq for _, seq in dropped)

    def latest_snapshot(self, kind: str, max_seq: int | None = None) -> tuple[int, str] | None:
        """The newest valid snapshot of ``kind`` at or below ``max_seq``: ``(upto_seq, state_json)``.

        A snapshot whose hash no longer matches (edited state, or history rewritten under it) is
        skipped: snapshots are a cache, replaying from an older one or from scratch is always safe.
        """
        snapshots, p = self._t_snapshots, self._p
        sql = f"SELECT id, upto_seq FROM {snapshots} WHERE kind = {p}"
        params: list[Any] = [kind]
        if max_seq is not None:
            sql += f" AND upto_seq <= {p}"
            params.append(max_seq)
        # Candidates first (ids only), then one state at a time: states can be large.
        for snapshot_id, upto_seq in self._query(sql + " ORDER BY upto_seq DESC, id DESC", params):
            with self._connection() as conn:
                row = conn.execute(
                    f"SELECT state, hash FROM {snapshots} WHERE id = {p}", (snapshot_id,)
                ).fetchone()
                anchor = self._anchor(conn, upto_seq)
            if row is None or anchor is None:
                continue
            state, stored = row
            if snapshot_hash(kind, upto_seq, anchor, state) == stored:
                return upto_seq, state
        return None

    def snapshot_seqs(self, kind: str) -> list[int]:
        """The ``upto_seq`` of every stored snapshot of ``kind``, valid or not, newest first: lets
        startup tell "no snapshot" from "a snapshot that failed its hash check"."""
        return [
            r[0]
            for r in self._query(
                f"SELECT upto_seq FROM {self._t_snapshots} WHERE kind = {self._p} ORDER BY upto_seq DESC",
                (kind,),
            )
        ]

    # -- compaction and verify --------------------------------------------------------------------

    def compact_bodies(self, before_seq: int) -> int:
        """Drop the request bodies of control.started events with seq < before_seq; return how many.

        The chain still verifies afterwards: see "Compaction" in journal/store.py's docstring.
        """
        events, p = self._t_events, self._p
        compacted = 0
        while True:
            with self._write() as conn:
                start = int(self._meta_value(conn, "bodies_compacted_before"))
                stop = min(before_seq, self._head(conn).seq + 1)
                if stop <= start:
                    return compacted
                rows = conn.execute(
                    f"SELECT seq, payload FROM {events} WHERE type = {p} AND seq >= {p} AND seq < {p}"
                    f" ORDER BY seq LIMIT {p}",
                    (ControlStarted.TYPE, start, stop, COMPACT_PAGE),
                ).fetchall()
                updates = compacted_payloads(rows)
                if updates:
                    self._executemany(conn, f"UPDATE {events} SET payload = {p} WHERE seq = {p}", updates)
                done_to = rows[-1][0] + 1 if len(rows) == COMPACT_PAGE else stop
                self._set_meta(conn, ("bodies_compacted_before", str(done_to)))
                compacted += len(updates)
            # Between pages the write lock is free: a concurrent gateway writer gets its turn.

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
            where, params = self._filters(None, None, limit)
            pages = self._pages(
                "seq, ts, stream, type, schema, payload, prev_hash, hash", start, where, params, None
            )
            return (tuple(row) for page in pages for row in page)

        if anchor is None:
            with self._connection() as conn:
                anchor = self._anchor(conn, after)
            if anchor is None:
                return VerifyReport(
                    ok=False, checked=0, first_bad_seq=after, reason=f"row {after} is missing"
                )
        before_first = self._query(f"SELECT min(seq) FROM {self._t_events} WHERE seq < 1")[0][0]
        if before_first is not None:
            return rows_before_the_first(before_first)
        return verify_journal(self._marks, scan, upto, after=after, anchor=anchor, on_row=on_row)

    def _marks(self) -> Marks:
        # One statement, hence one snapshot: an append moves the head and the rows together.
        meta = self._t_meta
        (hw_seq, hw_hash, compacted, last), *_ = self._query(
            f"SELECT (SELECT value FROM {meta} WHERE key = 'high_water_seq'),"
            f" (SELECT value FROM {meta} WHERE key = 'high_water_hash'),"
            f" (SELECT value FROM {meta} WHERE key = 'bodies_compacted_before'),"
            f" (SELECT max(seq) FROM {self._t_events})"
        )
        if hw_seq is None or hw_hash is None or compacted is None:
            raise JournalError("journal meta keys are missing")
        return Marks(Head(int(hw_seq), 0.0, hw_hash), int(compacted), last or 0)


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

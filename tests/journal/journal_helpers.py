"""Store backends for the contract suite, and event factories shared by the journal tests.

(A uniquely named module rather than conftest: test directories here have no __init__.py, so
``import conftest`` could pick another directory's conftest.)

A backend wraps one store plus the means to tamper with it behind its back (raw sqlite3 for the
file, the private row list for MemoryStore), so the same tamper tests run against both.
"""

from __future__ import annotations

import contextlib
import itertools
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

from journal import Append, ControlStarted, MemoryStore, SqliteStore
from smgrl.events import ControlFinished, ControlOutcome, WorkerRegistered, WorkerRemoved


class FakeClock:
    """A settable clock for commit timestamps (never compared with the real one)."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


class SqliteBackend:
    name = "sqlite"

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "journal.db"
        self.store = SqliteStore.open(self.path)

    def set_clock(self, clock: FakeClock) -> None:
        self.store._clock = clock

    def readonly(self) -> SqliteStore:
        return SqliteStore.open(self.path, readonly=True)

    @contextlib.contextmanager
    def _raw(self) -> Iterator[sqlite3.Connection]:
        conn = sqlite3.connect(self.path)
        try:
            with conn:
                yield conn
        finally:
            conn.close()

    def payload(self, seq: int) -> str:
        with self._raw() as conn:
            return conn.execute("SELECT payload FROM events WHERE seq = ?", (seq,)).fetchone()[0]

    def set_payload(self, seq: int, payload: str) -> None:
        with self._raw() as conn:
            conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (payload, seq))

    def set_ts(self, seq: int, ts: float) -> None:
        with self._raw() as conn:
            conn.execute("UPDATE events SET ts = ? WHERE seq = ?", (ts, seq))

    def delete(self, seq: int) -> None:
        with self._raw() as conn:
            conn.execute("DELETE FROM events WHERE seq = ?", (seq,))

    def truncate_after(self, seq: int) -> None:
        with self._raw() as conn:
            conn.execute("DELETE FROM events WHERE seq > ?", (seq,))

    def set_snapshot_state(self, upto_seq: int, state: str) -> None:
        with self._raw() as conn:
            conn.execute("UPDATE snapshots SET state = ? WHERE upto_seq = ?", (state, upto_seq))

    def forge_row(self, row: tuple) -> None:
        """Insert a row behind the store's back (the meta head is not moved)."""
        with self._raw() as conn:
            conn.execute("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)

    @contextlib.contextmanager
    def during_scan(self, callback: Callable[[], None]) -> Iterator[None]:
        """Run ``callback`` once, after the first page of the next scan was read."""
        store = self.store
        original = store._pages

        def pages(*args: object, **kwargs: object) -> Iterator[list]:
            for i, page in enumerate(original(*args, **kwargs)):
                yield page
                if i == 0:
                    callback()

        store._pages = pages
        try:
            yield
        finally:
            del store._pages

    def everything_but_secrets(self) -> str:
        """Every value of every table except ``secrets``, as one string (what an export may show)."""
        with self._raw() as conn:
            tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
            parts = [
                repr(row)
                for table in tables
                if table != "secrets"
                for row in conn.execute(f'SELECT * FROM "{table}"')
            ]
        return "\n".join(parts)

    def close(self) -> None:
        self.store.close()


class MemoryBackend:
    name = "memory"

    def __init__(self, tmp_path: Path) -> None:
        self.clock = FakeClock()
        self.store = MemoryStore(clock=self.clock)

    def set_clock(self, clock: FakeClock) -> None:
        self.store._clock = clock

    def readonly(self) -> MemoryStore:
        return self.store._readonly_view()

    def _index(self, seq: int) -> int:
        return next(i for i, row in enumerate(self.store._rows) if row[0] == seq)

    def payload(self, seq: int) -> str:
        return self.store._rows[self._index(seq)][5]

    def _replace(self, seq: int, column: int, value: object) -> None:
        i = self._index(seq)
        row = list(self.store._rows[i])
        row[column] = value
        self.store._rows[i] = tuple(row)

    def set_payload(self, seq: int, payload: str) -> None:
        self._replace(seq, 5, payload)

    def set_ts(self, seq: int, ts: float) -> None:
        self._replace(seq, 1, ts)

    def delete(self, seq: int) -> None:
        del self.store._rows[self._index(seq)]

    def truncate_after(self, seq: int) -> None:
        self.store._rows[:] = [row for row in self.store._rows if row[0] <= seq]

    def set_snapshot_state(self, upto_seq: int, state: str) -> None:
        snaps = self.store._snapshots
        for i, snap in enumerate(snaps):
            if snap[2] == upto_seq:
                snaps[i] = (*snap[:4], state, snap[5])

    def forge_row(self, row: tuple) -> None:
        self.store._rows.append(row)

    @contextlib.contextmanager
    def during_scan(self, callback: Callable[[], None]) -> Iterator[None]:
        store = self.store
        original = store._scan

        def scan(after_seq: int) -> Iterator[tuple]:
            for i, row in enumerate(original(after_seq)):
                yield row
                if i == 0:
                    callback()

        store._scan = scan
        try:
            yield
        finally:
            del store._scan

    def everything_but_secrets(self) -> str:
        s = self.store
        return "\n".join(map(repr, [s._rows, s._snapshots, s._meta]))

    def close(self) -> None:
        self.store.close()


# -- event factories -------------------------------------------------------------------------------

_ids = itertools.count(1)


def registered(worker_id: str = "w1", **kw: object) -> WorkerRegistered:
    fields: dict[str, object] = {
        "worker_id": worker_id,
        "url": f"http://{worker_id}:8000",
        "base_url": f"http://{worker_id}:8000",
        "source": "api",
        "labels": {"pool": "a"},
        "model_id": "llama",
    }
    fields.update(kw)
    return WorkerRegistered(**fields)  # type: ignore[arg-type]


def started(op_id: str = "op1", body: bytes = b'{"abort_all": true}', **kw: object) -> ControlStarted:
    fields: dict[str, object] = {
        "op_id": op_id,
        "kind": "fanout",
        "method": "POST",
        "path": "/flush_cache",
        "selector": "pool=a",
        "targets": [{"worker_id": "w1", "url": "http://w1:8000", "control_url": None}],
        "content_type": "application/json",
        **ControlStarted.body_fields(body),
    }
    fields.update(kw)
    return ControlStarted(**fields)  # type: ignore[arg-type]


def outcome(op_id: str = "op1", worker_id: str = "w1", status: int = 200) -> ControlOutcome:
    return ControlOutcome(
        op_id=op_id,
        worker_id=worker_id,
        url=f"http://{worker_id}:8000",
        status=status,
        latency_ms=3,
        excerpt="ok",
    )


def finished(op_id: str = "op1") -> ControlFinished:
    return ControlFinished(
        op_id=op_id, result="ok", http_status=200, total=1, succeeded=1, failed=0, latency_ms=4
    )


def removed(worker_id: str = "w1") -> WorkerRemoved:
    return WorkerRemoved(worker_id=worker_id, reason="api")


def a_few(n: int, stream: str = "control") -> list[Append]:
    """n ordinary appends (outcomes with distinct op ids)."""
    return [Append(stream, outcome(op_id=f"op{next(_ids)}")) for _ in range(n)]


class PgBackend:
    """PgStore on a fresh schema of the session's PostgreSQL server (``pg_server`` fixture)."""

    name = "postgres"

    def __init__(self, url: str) -> None:
        import psycopg

        from journal._pg_schema import split_url as _split_url
        from journal.postgres import PgStore

        self.url = url
        self.store = PgStore.open(url)
        libpq, self.schema, _pw = _split_url(url)
        self._conn = psycopg.connect(libpq, autocommit=True)

    def set_clock(self, clock: FakeClock) -> None:
        self.store._clock = clock

    def readonly(self):
        from journal.postgres import PgStore

        return PgStore.open(self.url, readonly=True)

    def _exec(self, sql: str, params: tuple = ()) -> list:
        cur = self._conn.execute(sql.replace("{s}", self.schema), params)
        return cur.fetchall() if cur.description else []

    def payload(self, seq: int) -> str:
        return self._exec("SELECT payload FROM {s}.events WHERE seq = %s", (seq,))[0][0]

    def set_payload(self, seq: int, payload: str) -> None:
        self._exec("UPDATE {s}.events SET payload = %s WHERE seq = %s", (payload, seq))

    def set_ts(self, seq: int, ts: float) -> None:
        self._exec("UPDATE {s}.events SET ts = %s WHERE seq = %s", (ts, seq))

    def delete(self, seq: int) -> None:
        self._exec("UPDATE {s}.secrets SET seq = NULL WHERE seq = %s", (seq,))
        self._exec("DELETE FROM {s}.events WHERE seq = %s", (seq,))

    def truncate_after(self, seq: int) -> None:
        self._exec("UPDATE {s}.secrets SET seq = NULL WHERE seq > %s", (seq,))
        self._exec("DELETE FROM {s}.events WHERE seq > %s", (seq,))

    def set_snapshot_state(self, upto_seq: int, state: str) -> None:
        self._exec("UPDATE {s}.snapshots SET state = %s WHERE upto_seq = %s", (state, upto_seq))

    def forge_row(self, row: tuple) -> None:
        self._exec("INSERT INTO {s}.events VALUES (%s, %s, %s, %s, %s, %s, %s, %s)", row)

    @contextlib.contextmanager
    def during_scan(self, callback: Callable[[], None]) -> Iterator[None]:
        store = self.store
        original = store._pages

        def pages(*args: object, **kwargs: object) -> Iterator[list]:
            for i, page in enumerate(original(*args, **kwargs)):
                yield page
                if i == 0:
                    callback()

        store._pages = pages
        try:
            yield
        finally:
            del store._pages

    def everything_but_secrets(self) -> str:
        tables = [
            r[0]
            for r in self._exec(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (self.schema,)
            )
        ]
        return "\n".join(
            repr(row) for t in tables if t != "secrets" for row in self._exec(f'SELECT * FROM {{s}}."{t}"')
        )

    def close(self) -> None:
        self.store.close()
        self._conn.close()

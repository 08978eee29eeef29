"""PgTail: PgStore's LISTEN thread and its cache of the newest events (see "Tailing" in
journal/postgres.py's docstring), and what an append's NOTIFY carries."""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import logging
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from .codec import Recorded, decode

__all__ = ["PgTail"]

logger = logging.getLogger("smgrl.journal")

_LISTENING: weakref.WeakSet[PgTail] = weakref.WeakSet()


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


class PgTail:
    """The change token, the change listeners and the tail cache of a PgStore (a mixin: PgStore
    gives ``_libpq_url``, ``_channel``, ``_s``, ``_closed`` and ``_scrub``)."""

    recent_limit = 2048  # events the tail cache keeps; a larger burst is read by the tail itself

    _libpq_url: str
    _channel: str
    _s: str
    _closed: bool

    def _scrub(self, exc: object) -> str:
        raise NotImplementedError

    def _init_tail(self) -> None:
        self._listen_lock = threading.Lock()
        self._listen_thread: threading.Thread | None = None
        self._listen_stop = threading.Event()
        self._listen_ready = threading.Event()
        self._changes = 0
        self._listeners: list[Callable[[], None]] = []
        # The tail cache (journal/postgres.py's docstring): the events (end - len, end] and the
        # secrets rows (seq, worker_id, key or None) set by them; None while unknown. Under
        # _recent_lock (written by the LISTEN thread and by the appending thread).
        self._recent_lock = threading.Lock()
        self._recent: list[Recorded] | None = None
        self._recent_end = 0
        self._recent_secrets: list[tuple[int, str, str | None]] = []

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

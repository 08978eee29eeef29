"""MemoryStore: the journal in memory, same interface and same hash chain as SqliteStore.

For unit tests (a projection test needs no file) and as the second backend of the store contract
suite, which keeps SqliteStore honest about what is SQLite-specific. Ships with the package, like
trio ships ``trio.testing``.
"""

from __future__ import annotations

import bisect
import itertools
import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

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
    snapshot_hash,
    verify_journal,
)
from .base import Append, Expect, Lease, RawRow, check_expect, type_names
from .codec import ControlStarted, Event, Recorded, decode
from .errors import JournalReadOnlyError
from .retention import DEFAULT as DEFAULT_RETENTION
from .retention import Retention

__all__ = ["MemoryStore"]

_PAGE = 2000
_seq_of = itemgetter(0)


class MemoryStore:
    """An in-memory journal. ``clock`` (default ``time.time``) lets tests pin commit times."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._readonly = False
        self._lock = threading.Lock()  # the writer calls us from a worker thread
        self._rows: list[Row] = []
        self._secrets: dict[str, tuple[str | None, int]] = {}  # None: deleted (a tombstone)
        self._snapshots: list[tuple[int, str, int, float, str, str]] = []  # id, kind, upto, ts, state, hash
        self._meta: dict[str, Any] = {"high_water": EMPTY_HEAD, "bodies_compacted_before": 0}
        self._leases: dict[str, Lease] = {}
        self._changes = [0]  # commits so far (a list: shared with read-only views)

    def _readonly_view(self) -> MemoryStore:
        """A read-only store over the same data (what ``SqliteStore.open(readonly=True)`` is to a file)."""
        view = MemoryStore(clock=self._clock)
        view._readonly = True
        view._lock, view._rows, view._secrets = self._lock, self._rows, self._secrets
        view._snapshots, view._meta = self._snapshots, self._meta
        view._leases, view._changes = self._leases, self._changes
        return view

    @property
    def readonly(self) -> bool:
        return self._readonly

    # Appending to a list never blocks: JournalWriter commits on the event loop.
    commits_are_cheap = True

    def checkpoint(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _check_writable(self) -> None:
        if self._readonly:
            raise JournalReadOnlyError("this MemoryStore view is read-only")

    def _head(self) -> Head:
        if not self._rows:
            return EMPTY_HEAD
        seq, ts, *_rest, hash_ = self._rows[-1]
        return Head(seq, ts, hash_)

    # -- writing ----------------------------------------------------------------------------------

    def change_token(self) -> int:
        return self._changes[0]

    def append_batch(
        self, items: Sequence[Append], *, wait: float | None = None, expect: Expect | None = None
    ) -> list[Recorded]:
        # ``wait`` (how long to wait for another writer's lock) means nothing here: one process.
        if not items:
            return []
        self._check_writable()
        with self._lock:
            head = self._head()
            if expect is not None:
                self._check_expect(expect, head.seq)
            rows, recorded, secret_ops = build_batch(items, head, self._clock())
            self._rows.extend(rows)
            for worker_id, api_key, seq in secret_ops:
                self._secrets[worker_id] = (api_key, seq)
            self._meta["high_water"] = Head(recorded[-1].seq, recorded[-1].ts, recorded[-1].hash)
            self._changes[0] += 1
        return recorded

    def _check_expect(self, expect: Expect, head: int) -> None:
        last = None
        types = None if expect.types is None else frozenset(expect.types)
        streams = None if expect.streams is None else frozenset(expect.streams)
        for row in reversed(self._rows):
            if row[0] <= expect.after:
                break
            if (types is None or row[3] in types) and (streams is None or row[2] in streams):
                last = row[0]
                break
        check_expect(expect, head, last)

    # -- leases (journal/lease.py) ------------------------------------------------------------------

    def take_lease(self, name: str, holder: str, ttl: float) -> Lease | None:
        leases.check_args(name, holder, ttl)
        self._check_writable()
        with self._lock:
            new = leases.taken(self._leases.get(name), name, holder, self._clock(), ttl)
            if new is not None:
                self._leases[name] = new
        return new

    def renew_lease(self, name: str, holder: str, ttl: float) -> Lease:
        leases.check_args(name, holder, ttl)
        self._check_writable()
        with self._lock:
            new = leases.renewed(self._leases.get(name), name, holder, self._clock(), ttl)
            self._leases[name] = new
        return new

    def release_lease(self, name: str, holder: str) -> bool:
        leases.check_args(name, holder)
        self._check_writable()
        with self._lock:
            new = leases.released(self._leases.get(name), holder)
            if new is not None:
                self._leases[name] = new
        return new is not None

    def lease(self, name: str) -> Lease | None:
        with self._lock:
            return self._leases.get(name)

    def save_snapshot(
        self, kind: str, upto_seq: int, state_json: str, *, retention: Retention = DEFAULT_RETENTION
    ) -> list[int]:
        json.loads(state_json)
        self._check_writable()
        with self._lock:
            anchor = self._anchor(upto_seq)
            if anchor is None:
                raise ValueError(f"cannot snapshot at seq {upto_seq}: no such event")
            h = snapshot_hash(kind, upto_seq, anchor, state_json)
            next_id = max((row[0] for row in self._snapshots), default=0) + 1
            self._snapshots.append((next_id, kind, upto_seq, self._clock(), state_json, h))
            mine = [(row[0], row[2]) for row in self._snapshots if row[1] == kind]
            stale = dict(retention.drop(mine, self._head().seq))
            self._snapshots = [row for row in self._snapshots if row[0] not in stale]
        return sorted(stale.values())

    def compact_bodies(self, before_seq: int) -> int:
        self._check_writable()
        with self._lock:
            start = self._meta["bodies_compacted_before"]
            stop = min(before_seq, self._head().seq + 1)
            if stop <= start:
                return 0
            candidates = [
                (row[0], row[5])
                for row in self._rows
                if start <= row[0] < stop and row[3] == ControlStarted.TYPE
            ]
            index = {row[0]: i for i, row in enumerate(self._rows)}
            updates = compacted_payloads(candidates)
            for payload, seq in updates:
                i = index[seq]
                self._rows[i] = (*self._rows[i][:5], payload, *self._rows[i][6:])
            self._meta["bodies_compacted_before"] = stop
            self._changes[0] += 1
            return len(updates)

    # -- reading ----------------------------------------------------------------------------------

    def _anchor(self, upto_seq: int) -> str | None:
        if upto_seq == 0:
            return GENESIS
        i = bisect.bisect_left(self._rows, upto_seq, key=_seq_of)
        if i < len(self._rows) and self._rows[i][0] == upto_seq:
            return self._rows[i][7]
        return None

    def _scan(self, after_seq: int) -> Iterator[Row]:
        # Page under the lock, yield outside it: a slow consumer never blocks the writer thread.
        while True:
            with self._lock:
                i = bisect.bisect_right(self._rows, after_seq, key=_seq_of)
                page = self._rows[i : i + _PAGE]
            yield from page
            if len(page) < _PAGE:
                return
            after_seq = page[-1][0]

    def last_seq(self) -> int:
        with self._lock:
            return self._rows[-1][0] if self._rows else 0

    def count(self) -> int:
        with self._lock:
            return len(self._rows)

    def secrets(self) -> dict[str, str]:
        with self._lock:
            return {w: key for w, (key, _seq) in sorted(self._secrets.items()) if key is not None}

    def secret_changes(self, after_seq: int, until_seq: int) -> dict[str, str | None]:
        with self._lock:
            return {w: key for w, (key, seq) in self._secrets.items() if after_seq < seq <= until_seq}

    def get_secret(self, worker_id: str) -> str | None:
        with self._lock:
            entry = self._secrets.get(worker_id)
        return entry[0] if entry else None

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
        names = type_names(types)
        wanted = None if names is None else frozenset(names)
        return self._read(after_seq, limit, wanted, stream, until_seq, since_ts, until_ts)

    def _read(
        self,
        after_seq: int,
        limit: int | None,
        wanted: frozenset[str] | None,
        stream: str | None,
        until_seq: int | None,
        since_ts: float | None,
        until_ts: float | None,
    ) -> Iterator[Recorded]:
        if limit is not None and limit <= 0:
            return
        n = 0
        for seq, ts, st, type_, schema, payload, _prev, hash_ in self._scan(after_seq):
            if until_seq is not None and seq > until_seq:
                return
            if until_ts is not None and ts >= until_ts:
                return
            if (
                (since_ts is not None and ts < since_ts)
                or (stream is not None and st != stream)
                or (wanted is not None and type_ not in wanted)
            ):
                continue
            yield Recorded(seq, ts, st, decode(type_, schema, payload), hash_)
            n += 1
            if limit is not None and n >= limit:
                return

    def read_raw(
        self, after_seq: int = 0, types: Iterable[str | type[Event]] | None = None
    ) -> Iterator[RawRow]:
        names = type_names(types)
        wanted = None if names is None else frozenset(names)
        return (row[:6] for row in self._scan(after_seq) if wanted is None or row[3] in wanted)

    def latest_snapshot(self, kind: str, max_seq: int | None = None) -> tuple[int, str] | None:
        with self._lock:
            candidates = sorted(
                (s for s in self._snapshots if s[1] == kind and (max_seq is None or s[2] <= max_seq)),
                key=lambda s: (s[2], s[0]),
                reverse=True,
            )
            for _id, _kind, upto_seq, _ts, state, stored in candidates:
                anchor = self._anchor(upto_seq)
                if anchor is not None and snapshot_hash(kind, upto_seq, anchor, state) == stored:
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
            return itertools.takewhile(lambda row: row[0] <= limit, self._scan(start))

        if anchor is None:
            with self._lock:
                anchor = self._anchor(after)
            if anchor is None:
                return VerifyReport(
                    ok=False, checked=0, first_bad_seq=after, reason=f"row {after} is missing"
                )
        return verify_journal(self._marks, scan, upto, after=after, anchor=anchor, on_row=on_row)

    def snapshot_seqs(self, kind: str) -> list[int]:
        with self._lock:
            return sorted((s[2] for s in self._snapshots if s[1] == kind), reverse=True)

    def _marks(self) -> Marks:
        with self._lock:
            last = self._rows[-1][0] if self._rows else 0
            return Marks(self._meta["high_water"], self._meta["bodies_compacted_before"], last)

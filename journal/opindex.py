"""The operation index: one derived row per control operation, kept beside the events.

``smgrl journal ops --all``, ``refits --all`` and ``versions`` walk every operation of a journal.
Read from the events, that costs parsing 90,000 ``control.started`` payloads and their ends per
million events (seconds). The ``op_index`` table holds what those readers need of each operation,
one narrow row, so they read it instead of the events:

    op_index(seq INTEGER PRIMARY KEY  -- the operation's control.started
             op_id, ts, kind, method, path, selector, phase, version  -- intent.phase, intent.version
             targets   -- the started payload's targets, canonical JSON
             outcomes  -- every control.outcome, seq order: JSON [[seq, worker_id, status, error?, stage], ...]
             closed_seq  -- the first control.finished / control.interrupted
             end_ts, result, http_status, total, succeeded, failed, latency_ms)  -- as OpsFold ends it

It is **derived, never a second source of truth**:

* written by ``SqliteStore.append_batch`` in the transaction that appends the events it derives
  from (``apply_rows``), so the two can never disagree after a commit or a crash;
* rebuilt by the same code from the events (``rebuild``: the schema migration that adds it to an
  older journal, and ``smgrl journal verify``, which rebuilds it into a temporary file and compares
  row by row, naming the first operation that differs);
* readers never trust it for anything the chain protects: a row only says where to look
  (``ops show`` and failed operations' outcomes are still read from the events).

The rules are ``smgrl.state.refits.OpsFold``'s: an event belongs to the newest operation with its
op id started before it; an outcome is appended; ``control.finished`` sets the end (the last one
wins); ``control.interrupted`` ends an operation that has no result yet. A control row whose
payload is not a JSON object with a string ``op_id`` is no operation (verify reports it).
"""

from __future__ import annotations

import itertools
import json
import json.encoder
import os
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from .codec import _dumps as _canonical

__all__ = [
    "COLUMNS",
    "CREATE",
    "TYPES",
    "IndexReport",
    "apply_rows",
    "check",
    "fields_of",
    "rebuild",
    "rows_of",
]

TYPES = ("control.started", "control.outcome", "control.finished", "control.interrupted")

CREATE = (
    """CREATE TABLE op_index (
    seq INTEGER PRIMARY KEY, -- the control.started event of the operation
    op_id TEXT NOT NULL,
    ts REAL NOT NULL, -- its commit time
    kind TEXT, method TEXT, path TEXT, selector TEXT,
    phase TEXT, -- intent.phase
    version TEXT, -- intent.version
    targets TEXT NOT NULL, -- canonical JSON of the payload's targets
    outcomes TEXT, -- JSON [[seq, worker_id, status, error_set, stage], ...] in seq order
    closed_seq INTEGER, -- the first control.finished or control.interrupted
    end_ts REAL, result TEXT, http_status INTEGER, total INTEGER, succeeded INTEGER,
    failed INTEGER, latency_ms INTEGER -- from the last control.finished (or interrupted)
) -- derived from the events (journal/opindex.py): rebuildable, checked by verify""",
    "CREATE INDEX idx_op_index_op_id ON op_index (op_id, seq)",
    "CREATE INDEX idx_op_index_version ON op_index (seq) WHERE version IS NOT NULL",
)

COLUMNS = (
    "seq", "op_id", "ts", "kind", "method", "path", "selector", "phase", "version", "targets",
    "outcomes", "closed_seq", "end_ts", "result", "http_status", "total", "succeeded", "failed",
    "latency_ms",
)  # fmt: skip
_I = {c: i for i, c in enumerate(COLUMNS)}
_OUTCOMES, _CLOSED, _END = _I["outcomes"], _I["closed_seq"], _I["end_ts"]
_RESULT = _I["result"]
_NEWEST = f"SELECT {', '.join(COLUMNS)} FROM op_index WHERE op_id = ? ORDER BY seq DESC LIMIT 1"
_REPLACE = f"INSERT OR REPLACE INTO op_index ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"
# A stored row's later events change only these columns (from outcomes on). An UPDATE of them
# leaves the op id and version indexes' pages alone, where a REPLACE (delete + insert) rewrites
# them: one 4 KiB page less in every fan-out's final transaction.
_MUTABLE = COLUMNS[_OUTCOMES:]
_UPDATE = f"UPDATE op_index SET {', '.join(f'{c} = ?' for c in _MUTABLE)} WHERE seq = ?"

# The journal's canonical JSON encoder (the C one): the same text the payloads are encoded with,
# and the string escaping it uses (ensure_ascii off).
_dumps = _canonical
_string = json.encoder.encode_basestring


def _scalar(value: Any) -> Any:
    """A column value: JSON scalars as they are, anything else (a hand-made row) as canonical JSON."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    return _dumps(value)


def _split(payload: str) -> dict[str, Any] | None:
    """A canonical control.started payload without its body (up to 64 KiB) and with its targets
    as text, parsed cheaply; None when it does not have the canonical shape (parse it whole)."""
    b = payload.find(',"body_encoding":')
    t = payload.find(',"targets":', b)
    if b < 0 or t < 0 or not payload.startswith('{"body":') or not payload.endswith("]}"):
        return None
    head: dict[str, Any] = json.loads("{" + payload[b + 1 : t] + "}")
    head["targets"] = payload[t + 11 : -1]  # canonical already: the payload is canonical JSON
    return head


def fields_of(type_: str, payload: str) -> dict[str, Any] | None:
    """The payload as a dict (a started one's targets as canonical JSON text), or None when the
    row is no operation event (not a JSON object with a string op_id)."""
    p = _split(payload) if type_ == "control.started" else None
    if p is None:
        try:
            p = json.loads(payload)
        except ValueError:
            return None
        if not isinstance(p, dict):
            return None
        if type_ == "control.started":
            targets = p.get("targets")
            p["targets"] = _dumps(targets if targets is not None else [])
    if not isinstance(p.get("op_id"), str):
        return None
    return p


def _targets_text(payload: str, targets: Any) -> str:
    """The canonical JSON of a started event's targets: the slice of its canonical payload (the
    last key), else encoded (the same text: the payload is encoded with the same rules)."""
    t = payload.find(',"targets":', max(0, payload.find(',"body_encoding":')))
    if t >= 0 and payload.endswith("]}") and payload.startswith('{"body":'):
        return payload[t + 11 : -1]
    return _dumps(targets if targets is not None else [])


# What each control event class contributes, read from the appended event object itself: the
# same values ``fields_of`` parses from its payload (the payload is encoded from these attributes),
# without parsing 10 payloads per fan-out on the gateway's commit path.
_FROM_EVENT = {
    "ControlStarted": lambda ev, payload: {
        "op_id": ev.op_id, "kind": ev.kind, "method": ev.method, "path": ev.path,
        "selector": ev.selector, "intent": ev.intent, "targets": _targets_text(payload, ev.targets),
    },
    "ControlOutcome": lambda ev, payload: {
        "op_id": ev.op_id, "worker_id": ev.worker_id, "status": ev.status, "error": ev.error,
        "stage": ev.stage,
    },
    "ControlFinished": lambda ev, payload: {
        "op_id": ev.op_id, "result": ev.result, "http_status": ev.http_status, "total": ev.total,
        "succeeded": ev.succeeded, "failed": ev.failed, "latency_ms": ev.latency_ms,
    },
    "ControlInterrupted": lambda ev, payload: {"op_id": ev.op_id},
}  # fmt: skip


def _fields(type_: str, payload: str, event: Any) -> dict[str, Any] | None:
    make = _FROM_EVENT.get(type(event).__name__) if event is not None else None
    if make is None or getattr(event, "TYPE", None) != type_:
        return fields_of(type_, payload)
    p = make(event, payload)
    return p if isinstance(p["op_id"], str) else None


def _started_row(seq: int, ts: float, p: dict[str, Any]) -> list[Any]:
    intent = p.get("intent")
    intent = intent if isinstance(intent, dict) else {}
    row: list[Any] = [None] * len(COLUMNS)
    row[:10] = (
        seq, p["op_id"], ts, _scalar(p.get("kind")), _scalar(p.get("method")), _scalar(p.get("path")),
        _scalar(p.get("selector")), _scalar(intent.get("phase")), _scalar(intent.get("version")),
        p["targets"],
    )  # fmt: skip
    return row


def _outcome_record(seq: int, worker_id: Any, status: Any, error_set: bool, stage: Any) -> str:
    """One entry of the ``outcomes`` column: the canonical JSON of ``[seq, worker_id, status,
    error_set, stage]``. Formatted directly when the values have their usual types (a string id,
    an integer status or none, a string stage or none): the same text ``_dumps`` gives, about a
    third of its cost, eight times per 8-engine fan-out."""
    if (
        type(worker_id) is str
        and (status is None or type(status) is int)
        and (stage is None or type(stage) is str)
    ):
        status_text = "null" if status is None else str(status)
        stage_text = "null" if stage is None else _string(stage)
        return f"[{seq},{_string(worker_id)},{status_text},{'true' if error_set else 'false'},{stage_text}]"
    return _dumps([seq, _scalar(worker_id), _scalar(status), error_set, _scalar(stage)])


def _add_outcome(added: dict[int, list[str]], target: int, record: str) -> None:
    """``record`` onto the outcome entries of op row ``target`` gathered by this ``apply_rows``."""
    entries = added.get(target)
    if entries is None:
        added[target] = [record]
    else:
        entries.append(record)


def apply_rows(conn: sqlite3.Connection, rows: Iterable[tuple[int, float, str, str, Any]]) -> None:
    """Fold ``(seq, ts, type, payload, event or None)`` control rows, in seq order and all newer
    than every row of ``op_index``, into ``op_index`` on ``conn``: the one code path of appends
    (which hand in the event objects) and rebuilds (which parse the payloads)."""
    touched: dict[int, list[Any]] = {}  # op row seq -> the row, as it will be written
    stored_seqs: set[int] = set()  # rows read from op_index (updated), not started in `rows`
    latest: dict[str, int | None] = {}  # op id -> its newest op row seq (None: there is none)
    # op row seq -> its outcome entries of this call, in seq order: joined onto the column once
    # (only outcomes change that column, so deferring the join changes nothing).
    added: dict[int, list[str]] = {}
    for seq, ts, type_, payload, event in rows:
        if type_ == "control.outcome" and type(event).__name__ == "ControlOutcome":
            # The common row, read straight from the appended event (as ``_FROM_EVENT`` does).
            op_id = event.op_id
            if type(op_id) is not str or getattr(event, "TYPE", None) != type_:
                p = _fields(type_, payload, event)
                if p is None:
                    continue
                op_id = p["op_id"]
                worker_id, status, error_set, stage = (
                    p.get("worker_id"), p.get("status"), p.get("error") is not None, p.get("stage"),
                )  # fmt: skip
            else:
                worker_id, status, error_set, stage = (
                    event.worker_id, event.status, event.error is not None, event.stage,
                )  # fmt: skip
            target = _target(conn, op_id, latest, touched, stored_seqs)
            if target is not None:
                _add_outcome(added, target, _outcome_record(seq, worker_id, status, error_set, stage))
            continue
        p = _fields(type_, payload, event)
        if p is None:
            continue
        op_id = p["op_id"]
        if type_ == "control.started":
            touched[seq] = _started_row(seq, ts, p)
            latest[op_id] = seq
            continue
        target = _target(conn, op_id, latest, touched, stored_seqs)
        if target is None:
            continue  # its start is not in the journal: no operation (as OpsFold)
        row = touched[target]
        if type_ == "control.outcome":
            record = _outcome_record(
                seq, p.get("worker_id"), p.get("status"), p.get("error") is not None, p.get("stage")
            )
            _add_outcome(added, target, record)
            continue
        if row[_CLOSED] is None:
            row[_CLOSED] = seq
        if type_ == "control.finished":
            row[_END:] = (
                ts, _scalar(p.get("result")), _scalar(p.get("http_status")), _scalar(p.get("total", 0)),
                _scalar(p.get("succeeded", 0)), _scalar(p.get("failed", 0)), _scalar(p.get("latency_ms")),
            )  # fmt: skip
        elif row[_RESULT] is None:  # control.interrupted ends an operation still open
            row[_END], row[_RESULT] = ts, "interrupted"
    for target, entries in added.items():
        row = touched[target]
        old, joined = row[_OUTCOMES], ",".join(entries)
        row[_OUTCOMES] = f"[{joined}]" if old is None else f"{old[:-1]},{joined}]"
    if stored_seqs:
        conn.executemany(_UPDATE, [(*touched[seq][_OUTCOMES:], seq) for seq in stored_seqs])
    fresh = [row for seq, row in touched.items() if seq not in stored_seqs]
    if fresh:
        conn.executemany(_REPLACE, fresh)


def _target(
    conn: sqlite3.Connection,
    op_id: str,
    latest: dict[str, int | None],
    touched: dict[int, list[Any]],
    stored_seqs: set[int],
) -> int | None:
    """The op row seq an event of ``op_id`` belongs to (None: its start is not in the journal)."""
    if op_id in latest:
        return latest[op_id]
    # Its newest operation stored before this batch, whole (one probe of (op_id, seq)).
    stored = conn.execute(_NEWEST, (op_id,)).fetchone()
    target = latest[op_id] = stored[0] if stored else None
    if stored:
        touched[stored[0]] = list(stored)
        stored_seqs.add(stored[0])
    return target


_CHUNK = 20_000  # events per rebuild step: memory holds one step's touched rows


def _control_rows(
    src: sqlite3.Connection, after: int, upto: int
) -> Iterator[tuple[int, float, str, str, None]]:
    sql = (
        "SELECT seq, ts, type, payload, NULL FROM events WHERE seq > ? AND seq <= ?"
        f" AND type IN ({', '.join('?' * len(TYPES))}) ORDER BY seq"
    )
    return src.execute(sql, (after, upto, *TYPES))


def rebuild(src: sqlite3.Connection, dst: sqlite3.Connection, upto: int | None = None) -> int:
    """Fill ``dst``'s (empty) ``op_index`` from ``src``'s events up to ``upto`` (default: all), in
    steps of ``_CHUNK`` events through ``apply_rows``; returns the rows written. ``src`` and ``dst``
    may be one connection (the migration) or two (verify: a temporary file)."""
    if upto is None:
        upto = src.execute("SELECT max(seq) FROM events").fetchone()[0] or 0
    after = 0
    while after < upto:
        stop = min(upto, after + _CHUNK)
        apply_rows(dst, list(_control_rows(src, after, stop)))
        after = stop
    return int(dst.execute("SELECT count(*) FROM op_index").fetchone()[0])


def rows_of(conn: sqlite3.Connection) -> Iterator[tuple[Any, ...]]:
    """Every op_index row in seq order (a cursor: streamed)."""
    return conn.execute(f"SELECT {', '.join(COLUMNS)} FROM op_index ORDER BY seq")


class IndexReport(NamedTuple):
    ok: bool
    checked: int  # op_index rows compared
    first_bad_seq: int | None = None  # the operation (its control.started seq) that differs
    reason: str | None = None


def check(conn: sqlite3.Connection, workdir: str) -> IndexReport:
    """Rebuild the index from ``conn``'s events into a temporary file under ``workdir`` (memory
    stays flat) and compare it with the stored one row by row. ``conn`` must read one snapshot of
    the file throughout (the caller holds a read transaction), so a live gateway's appends do not
    show up halfway."""
    path = os.path.join(workdir, "op_index.db")
    dst = sqlite3.connect(path)
    try:
        dst.execute("PRAGMA journal_mode = OFF")
        dst.execute("PRAGMA synchronous = OFF")
        for statement in CREATE:
            dst.execute(statement)
        rebuild(conn, dst)
        dst.commit()
        checked = 0
        fresh, stored = rows_of(dst), rows_of(conn)
        for want, have in itertools.zip_longest(fresh, stored):
            if want == have:
                checked += 1
                continue
            if have is None or (want is not None and want[0] < have[0]):
                return IndexReport(False, checked, want[0], "operation index row missing")
            if want is None or have[0] < want[0]:
                return IndexReport(False, checked, have[0], "operation index row derived from no operation")
            column = next(c for c, a, b in zip(COLUMNS, want, have, strict=True) if a != b)
            return IndexReport(
                False, checked, want[0], f"operation index row differs from the events ({column})"
            )
        return IndexReport(True, checked)
    finally:
        dst.close()

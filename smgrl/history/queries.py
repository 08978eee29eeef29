"""History queries that must stay fast on a journal of millions of events: the fleet as it was at
a seq (``workers --at``, from the nearest snapshot below it) and every version change
(``versions``, reading only the operations that set a version).

What costs time at that size is Python, not SQLite: parsing each JSON payload and building an
event object. So the replay after the snapshot asks SQLite (one range scan by seq, which is the
table's rowid) for only the event types the registry and engine projections fold, and for the
few fields those projections read of the control events, already extracted by ``json_extract``
in C. Registry and engine events (a few per worker) are decoded as usual. The fold itself is
the projections' own ``apply``: nothing here decides what an event means.

Operations are not folded: ``workers`` shows the registry and the engine facts, and the
operations projection (open operations, recent outcomes) is what startup needs, not history.

``versions`` reads the operations that set a version from the journal's operation index
(``journal/opindex.py``: one row per operation with its targets, outcomes and end, derived from
the events in their transaction and checked by ``smgrl journal verify``), and the registry and
``engine.version_set`` events through the (type, seq) index.
"""

from __future__ import annotations

import heapq
import json
import sqlite3
from collections.abc import Iterable, Iterator
from typing import Any

from smgrl.core.worker import strip_rank
from smgrl.events import decode, event_class
from smgrl.history import sqlview
from smgrl.history.opscan import gc_paused
from smgrl.history.replay import load_snapshot
from smgrl.state import OK, SETTLED, UNKNOWN, Change, FleetState, VersionFold, engines, registry

__all__ = ["add_times", "fleet_at", "grouped", "version_changes"]

_CONTROL = ("control.started", "control.outcome", "control.finished", "control.interrupted")
_TYPES = sorted(registry.TYPES | engines.TYPES)
_SCHEMAS = {t: event_class(t).SCHEMA for t in _CONTROL}  # type: ignore[union-attr]

# One pass over (after, upto] by rowid; control rows come cut apart, other rows whole.
_QUERY = f"""
SELECT seq, type, schema,
  CASE WHEN type LIKE 'control.%' THEN NULL ELSE payload END,
  CASE WHEN type LIKE 'control.%' THEN json_extract(payload, '$.op_id') END,
  CASE WHEN type = 'control.outcome' THEN json_extract(payload, '$.worker_id') END,
  CASE WHEN type = 'control.outcome' THEN json_extract(payload, '$.status') END,
  CASE WHEN type = 'control.outcome' THEN json_extract(payload, '$.error') END,
  CASE WHEN type = 'control.outcome' THEN json_extract(payload, '$.stage') END,
  CASE WHEN type = 'control.started' THEN json_extract(payload, '$.intent') END,
  CASE WHEN type = 'control.started' THEN json_extract(payload, '$.targets') END
FROM events
WHERE seq > ? AND seq <= ? AND type IN ({", ".join("?" * len(_TYPES))})
ORDER BY seq
"""


class _Control:
    """The fields of a control event the engine projection reads (``EngineStates.apply``)."""

    __slots__ = ("TYPE", "error", "intent", "op_id", "stage", "status", "targets", "worker_id")

    def __init__(self, type_: str, op_id, worker_id, status, error, stage, intent, targets) -> None:
        self.TYPE = type_
        self.op_id, self.worker_id, self.status = op_id, worker_id, status
        self.error, self.stage, self.intent, self.targets = error, stage, intent, targets


class _NoOperations:
    """Stands in for the operations projection, which ``workers`` does not show."""

    open: dict = {}  # noqa: RUF012 - never written

    def apply(self, seq: int, event: Any) -> None:
        return None


def _events(conn: sqlite3.Connection, after: int, upto: int) -> Iterator[tuple[int, Any]]:
    targets_cache: dict[str, Any] = {}
    loads = json.loads
    cur = conn.execute(_QUERY, (after, upto, *_TYPES))
    for seq, type_, schema, payload, op_id, wid, status, error, stage, intent, targets in cur:
        if payload is not None:
            yield seq, decode(type_, schema, payload)
            continue
        if schema != _SCHEMAS[type_] or not isinstance(op_id, str):
            # Another schema (a newer smgrl) or a hand-made row: the ordinary decode decides.
            row = conn.execute("SELECT payload FROM events WHERE seq = ?", (seq,)).fetchone()
            yield seq, decode(type_, schema, row[0])
            continue
        if type_ == "control.started":
            parsed = targets_cache.get(targets)
            if parsed is None:
                # Consecutive fan-outs to one fleet have byte-identical targets: parse each once.
                parsed = targets_cache[targets] = loads(targets) if targets else []
            intent = loads(intent) if intent else None
            yield seq, _Control(type_, op_id, None, None, None, None, intent, parsed)
        else:
            yield seq, _Control(type_, op_id, wid, status, error, stage, None, None)


def fleet_at(path: str, store, upto: int) -> tuple[FleetState, int]:
    """The registry and engine projections after event ``upto``: ``(fleet, snapshot_seq)``.

    Starts from the newest valid snapshot at or below ``upto`` (0: from the start). Equal, for
    the registry and the engine facts, to a full replay (``tests/journal_cli/test_history.py``).
    """
    snap_seq, fleet, _problem = load_snapshot(store, upto)
    fleet.operations = _NoOperations()  # type: ignore[assignment]
    apply = fleet.apply
    with sqlview.view(path) as conn:
        for seq, event in _events(conn, snap_seq, upto):
            apply(seq, event)
    fleet.last_seq = max(fleet.last_seq, upto)
    return fleet, snap_seq


# -- versions ---------------------------------------------------------------------------------------

# One row per operation whose intent sets a version, from the journal's operation index
# (``journal/opindex.py``: derived from the events in their own transaction, checked by verify):
# its targets, its outcomes ([seq, worker_id, status, error set, stage] in seq order) and the seq
# that closed it, through the partial index over the rows with a version.
_VERSION_OPS = (
    "SELECT seq, op_id, version, path, targets, outcomes, closed_seq FROM op_index"
    " WHERE version IS NOT NULL ORDER BY seq"
)
# Health changes move neither an address nor a label, so they cannot change what `versions` shows.
_OTHER_TYPES = sorted((registry.TYPES - {"worker.health_changed"}) | {"engine.version_set"})
_BY_TYPE = "SELECT seq, type, schema, payload FROM events WHERE type = ? ORDER BY seq"


def _outcomes(text: str | None) -> list[tuple[int, str, int]]:
    """``(seq, worker_id, kind)`` per outcome; kind is the engine projection's classification
    (``EngineStates.apply``): OK for a 2xx without error, UNKNOWN for an exchange that stopped at
    ``head`` or ``body`` (the engine may have acted), SETTLED for anything else."""
    if not text:
        return []
    return [
        (
            seq,
            wid,
            OK if not error and type(status) is int and 200 <= status < 300 else _KIND.get(stage, SETTLED),
        )
        for seq, wid, status, error, stage in json.loads(text)
    ]


_KIND = {"head": UNKNOWN, "body": UNKNOWN}


def _operations(conn: sqlite3.Connection) -> Iterator[tuple[int, int, tuple]]:
    """``(first seq, last seq, (op_id, version, path, targets, outcomes, close))`` per version op."""
    bases_of: dict[str, dict[str, str]] = {}
    for seq, op_id, version, path, targets, outcomes_text, close in conn.execute(_VERSION_OPS):
        bases = bases_of.get(targets)
        if bases is None:
            if len(bases_of) > 1024:
                bases_of.clear()  # bounded: a fleet that keeps changing
            # Consecutive fan-outs to one fleet have byte-identical targets: convert each once.
            parsed = json.loads(targets) if targets else []
            bases = bases_of[targets] = {t["worker_id"]: strip_rank(t["url"]) for t in parsed}
        outcomes = _outcomes(outcomes_text)
        last = max(close or 0, outcomes[-1][0] if outcomes else 0, seq)
        yield seq, last, (op_id, version, f"/{(path or '').lstrip('/')}", bases, outcomes, close)


def version_changes(path: str) -> Iterator[tuple[Change, str | None]]:
    """Every version change in the journal, oldest first: ``(change, via)``, ``via`` being the
    operation's engine path (``/update_weights_from_disk``) or the event type. Streamed: memory
    holds the projections' state and one run of overlapping operations, not the journal."""
    fold = VersionFold()
    # The collector paused as in opscan: 30,000 rows of small acyclic objects per million events.
    with sqlview.view(path) as conn, sqlview.view(path) as conn2, gc_paused():
        others = heapq.merge(*(conn2.execute(_BY_TYPE, (t,)) for t in _OTHER_TYPES))
        items = heapq.merge(
            ((r[0], r[0], 0, r) for r in others),
            ((first, last, 1, op) for first, last, op in _operations(conn)),
        )
        run: list[tuple] = []
        run_end = -1
        for item in items:
            if run and item[0] > run_end:
                yield from _fold_run(fold, run)
                run = []
            run.append(item)
            run_end = max(run_end, item[1])
        if run:
            yield from _fold_run(fold, run)


def _fold_run(fold: VersionFold, run: list[tuple]) -> Iterator[tuple[Change, str | None]]:
    """Fold items whose effects do not interleave with anything else: an operation alone goes
    whole (``VersionFold.operation``); otherwise every event of the run in seq order."""
    if len(run) == 1:
        _first, _last, source, row = run[0]
        if source == 0:
            seq, type_, schema, payload = row
            for change in fold.event(seq, decode(type_, schema, payload)):
                yield change, type_
        else:
            op_id, version, via, targets, outcomes, close = row
            for change in fold.operation(op_id, version, (), outcomes, close, bases=targets):
                yield change, via
        return
    steps: list[tuple] = []
    for _first, _last, source, row in run:
        if source == 0:
            steps.append((row[0], 0, row))
            continue
        op_id, version, via, targets, outcomes, close = row
        steps.append((_first, 1, (op_id, version, via, targets)))
        steps += [(seq, 2, (op_id, via, wid, kind)) for seq, wid, kind in outcomes]
        if close is not None:
            steps.append((close, 3, (op_id, via)))
    steps.sort(key=lambda s: s[0])
    for seq, step, data in steps:
        if step == 0:
            _seq, type_, schema, payload = data
            for change in fold.event(seq, decode(type_, schema, payload)):
                yield change, type_
        elif step == 1:
            fold.started(data[0], data[1], (), data[3])
        elif step == 2:
            for change in fold.outcome(seq, data[0], data[2], data[3]):
                yield change, data[1]
        else:
            for change in fold.closed(seq, data[0]):
                yield change, data[1]


def grouped(changes: Iterable[tuple[Change, str | None]]) -> Iterator[dict[str, Any]]:
    """One row per run of changes that one operation (or one event) made to the same version,
    status and source: a fan-out that moved 8 engines to step-7 is one row naming 8 engines."""
    row: dict[str, Any] | None = None
    key = None
    for change, via in changes:
        k = (change.op_id or change.seq, change.weight_version, change.version_source, change.version_status)
        if row is not None and k == key:
            row["engines"].extend(change.engines)
            continue
        if row is not None:
            yield row
        key = k
        row = {
            "seq": change.seq,
            "engines": list(change.engines),
            "weight_version": change.weight_version,
            "version_source": change.version_source,
            "version_status": change.version_status,
            "op_id": change.op_id,
            "via": via,
        }
    if row is not None:
        yield row


def add_times(conn: sqlite3.Connection, rows: list[dict[str, Any]]) -> None:
    """Set each row's ``ts`` (the commit time of its seq): one query per chunk of rows."""
    seqs = sorted({r["seq"] for r in rows})
    ts = dict(conn.execute(f"SELECT seq, ts FROM events WHERE seq IN ({','.join('?' * len(seqs))})", seqs))
    for r in rows:
        r["ts"] = ts.get(r["seq"])

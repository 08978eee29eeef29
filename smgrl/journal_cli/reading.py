"""Reading the journal for the CLI: merged type reads, points in time, operations, workers.

Several event types are read one type at a time and merged by seq (``read_types``; see there
why), so every read costs the rows it returns, through the journal's (type, seq) index.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Iterable, Iterator

from journal import SqliteStore
from journal.events import Recorded
from smgrl.journal_cli.filters import WorkerFilter
from smgrl.journal_cli.group import EXIT_BAD_VALUE, EXIT_CHECK, CliError
from smgrl.journal_cli.values import Point
from smgrl.state.refits import OpsFold
from smgrl.state.replay import read_types

__all__ = [
    "add_outcomes",
    "find_op",
    "load_ops",
    "read_events",
    "resolve_worker",
    "seq_at",
    "worker_filter",
]

OP_TYPES = ("control.started", "control.finished", "control.interrupted")


def read_events(
    store: SqliteStore,
    types: list[str] | None,
    *,
    after: int = 0,
    until_seq: int | None = None,
    since_ts: float | None = None,
    until_ts: float | None = None,
) -> Iterator[Recorded]:
    """Decoded events in seq order, optionally of some types only (one index range per type)."""
    kw = {"until_seq": until_seq, "since_ts": since_ts, "until_ts": until_ts}
    if types is None:
        return store.read(after, **kw)
    return heapq.merge(*(store.read(after, types=[t], **kw) for t in types), key=lambda r: r.seq)


def seq_at(store: SqliteStore, point: Point) -> int:
    """The last seq at ``point``: the seq itself, or the last event committed at or before a time."""
    last = store.last_seq()
    if point.seq is not None:
        if point.seq > last:
            raise CliError(f"seq {point.seq} is beyond the journal's last event ({last})", EXIT_BAD_VALUE)
        return point.seq
    assert point.ts is not None
    nxt = next(iter(store.read(0, since_ts=math.nextafter(point.ts, math.inf), limit=1)), None)
    return last if nxt is None else nxt.seq - 1


def resolve_worker(store: SqliteStore, value: str) -> str:
    """A worker id for ``--worker``: an id as is, or the newest registration of a URL."""
    if "://" not in value:
        return value
    found = None
    for _seq, _ts, _stream, _type, _schema, payload in store.read_raw(0, types=["worker.registered"]):
        p = json.loads(payload)
        if p.get("url") == value or p.get("base_url") == value:
            found = p.get("worker_id")
    if found is None:
        raise CliError(f"no worker was ever registered at {value}", EXIT_CHECK)
    return found


def worker_filter(store: SqliteStore, worker_id: str, before_seq: int) -> WorkerFilter:
    """A WorkerFilter knowing the worker's DP group and the operations started for it up to
    ``before_seq`` (later ones it learns while reading)."""
    filt = WorkerFilter(worker_id)
    needle = f'"{worker_id}"'
    for seq, _ts, stream, type_, _schema, payload in read_types(
        store, ["worker.discovered", "control.started"]
    ):
        if seq > before_seq:
            break
        if needle in payload:  # cheap pre-check before parsing
            filt.see(stream, type_, json.loads(payload))
    return filt


def find_op(store: SqliteStore, prefix: str) -> str:
    """The op id starting with ``prefix`` (exactly one must), from the control.started events."""
    needle = f'"op_id":"{prefix}'
    matches = []
    for _seq, _ts, _stream, _type, _schema, payload in store.read_raw(0, types=["control.started"]):
        if needle in payload:
            matches.append(json.loads(payload)["op_id"])
            if len(matches) > 5:
                break
    if not matches:
        raise CliError(f"no operation id starts with {prefix!r}", EXIT_CHECK)
    if len(set(matches)) > 1:
        shown = ", ".join(matches[:5])
        raise CliError(
            f"{prefix!r} is ambiguous: {shown}{' ...' if len(matches) > 5 else ''}", EXIT_BAD_VALUE
        )
    return matches[0]


def load_ops(
    store: SqliteStore,
    *,
    until_seq: int | None = None,
    outcomes: str = "needed",
) -> OpsFold:
    """Operations from control.started/finished/interrupted (raw rows, parsed here).

    ``outcomes``: "needed" reads the control.outcome events of operations that did not fully
    succeed (the only ones whose targets differ), "all" of every operation, "none" of none. They
    are read per operation through the (stream, seq) index, so a journal of clean refits costs
    two index ranges, not its million outcome rows.
    """
    fold = OpsFold()
    for seq, ts, _stream, type_, _schema, payload in read_types(store, OP_TYPES):
        if until_seq is not None and seq > until_seq:
            break
        fold.apply(seq, ts, type_, json.loads(payload))
    if outcomes == "none":
        return fold
    ops = [op for op in fold.ops.values() if outcomes == "all" or fold.needs_outcomes(op)]
    add_outcomes(store, fold, [op.op_id for op in ops], until_seq=until_seq)
    return fold


def add_outcomes(
    store: SqliteStore, fold: OpsFold, op_ids: Iterable[str], *, until_seq: int | None = None
) -> None:
    """Read the control.outcome events of these operations into ``fold`` (one index range each)."""
    for op_id in op_ids:
        op = fold.ops.get(op_id)
        if op is None or op.outcomes:
            continue  # unknown, or already read
        for rec in store.read(op.seq, stream=f"op:{op_id}", types=["control.outcome"], until_seq=until_seq):
            fold.apply(rec.seq, rec.ts, "control.outcome", _outcome_dict(rec))


def _outcome_dict(rec: Recorded) -> dict:
    ev = rec.event
    return {
        "op_id": getattr(ev, "op_id", ""),
        "worker_id": getattr(ev, "worker_id", ""),
        "status": getattr(ev, "status", None),
        "error": getattr(ev, "error", None),
        "latency_ms": getattr(ev, "latency_ms", 0),
    }

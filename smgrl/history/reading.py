"""Reading the journal for the CLI: merged type reads, points in time, operations, workers.

Several event types are read one type at a time and merged by seq (``read_types``; see there
why), so every read costs the rows it returns, through the journal's (type, seq) index.
"""

from __future__ import annotations

import heapq
import json
import math
from collections.abc import Callable, Iterable, Iterator

from journal import SqliteStore
from journal.codec import Recorded
from smgrl.history import opscan
from smgrl.history.errors import EXIT_BAD_VALUE, EXIT_CHECK, QueryError
from smgrl.history.filters import WorkerFilter
from smgrl.history.opscan import scan_ops
from smgrl.history.replay import read_types
from smgrl.history.values import Point
from smgrl.state import Op, OpsFold

MIN_WINDOW = 4096  # events: the smallest window `recent` reads from the end

__all__ = [
    "add_outcomes",
    "find_op",
    "load_ops",
    "read_events",
    "recent",
    "resolve_worker",
    "seq_at",
    "stream_ops",
    "worker_filter",
]


def read_events(
    store: SqliteStore,
    types: list[str] | None,
    *,
    after: int = 0,
    until_seq: int | None = None,
    since_ts: float | None = None,
    until_ts: float | None = None,
    limit: int | None = None,
) -> Iterator[Recorded]:
    """Decoded events in seq order, optionally of some types only (one index range per type);
    ``limit``: at most that many of each type are read (cut the merge to ``limit`` too)."""
    kw = {"until_seq": until_seq, "since_ts": since_ts, "until_ts": until_ts, "limit": limit}
    if types is None:
        return store.read(after, **kw)
    return heapq.merge(*(store.read(after, types=[t], **kw) for t in types), key=lambda r: r.seq)


def seq_at(store: SqliteStore, point: Point) -> int:
    """The last seq at ``point``: the seq itself, or the last event committed at or before a time."""
    last = store.last_seq()
    if point.seq is not None:
        if point.seq > last:
            raise QueryError(f"seq {point.seq} is beyond the journal's last event ({last})", EXIT_BAD_VALUE)
        return point.seq
    assert point.ts is not None
    nxt = next(iter(store.read(0, since_ts=math.nextafter(point.ts, math.inf), limit=1)), None)
    return last if nxt is None else nxt.seq - 1


def resolve_worker(store: SqliteStore, value: str) -> str:
    """A worker id for ``--worker``: an id, a unique prefix of one (as the tables print them), or
    the newest registration of a URL."""
    url = "://" in value
    found = None
    prefixed: set[str] = set()
    for _seq, _ts, _stream, _type, _schema, payload in store.read_raw(0, types=["worker.registered"]):
        p = json.loads(payload)
        wid = p.get("worker_id") or ""
        if url and (p.get("url") == value or p.get("base_url") == value):
            found = wid
        elif not url and wid.lower().startswith(value.lower()):
            prefixed.add(wid)
    if not url:
        if value in prefixed or not prefixed:
            return value  # a full id (also of a DP rank), or none registered: nothing matches
        if len(prefixed) > 1:
            raise QueryError(
                f"worker id prefix {value} is ambiguous: {', '.join(sorted(prefixed))}", EXIT_CHECK
            )
        return prefixed.pop()
    if found is None:
        raise QueryError(f"no worker was ever registered at {value}", EXIT_CHECK)
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
        raise QueryError(f"no operation id starts with {prefix!r}", EXIT_CHECK)
    if len(set(matches)) > 1:
        shown = ", ".join(matches[:5])
        raise QueryError(
            f"{prefix!r} is ambiguous: {shown}{' ...' if len(matches) > 5 else ''}", EXIT_BAD_VALUE
        )
    return matches[0]


def load_ops(
    store: SqliteStore,
    *,
    after_seq: int = 0,
    until_seq: int | None = None,
    outcomes: str = "needed",
) -> OpsFold:
    """Operations started in ``(after_seq, until_seq]`` (``opscan``: the fast read).

    ``outcomes``: "needed" reads the control.outcome events of operations that did not fully
    succeed (the only ones whose targets differ), "all" of every operation, "none" of none. They
    are read per operation through the (stream, seq) index, so a journal of clean refits costs
    three index ranges, not its million outcome rows.
    """
    fold = scan_ops(store.path, after_seq, until_seq)
    if outcomes == "none":
        return fold
    ops = [op for op in fold.ops.values() if outcomes == "all" or fold.needs_outcomes(op)]
    add_outcomes(store, fold, [op.op_id for op in ops], until_seq=until_seq)
    return fold


def stream_ops(
    store: SqliteStore, *, after_seq: int = 0, until_seq: int | None = None, outcomes: str = "needed"
) -> Iterator[Op]:
    """``load_ops`` as a stream in start order with bounded memory (``opscan.stream_ops``): each
    op is yielded final, with its outcomes read (as ``outcomes`` says) just before."""

    def complete(fold: OpsFold, op: Op) -> None:
        if outcomes == "all" or (outcomes == "needed" and fold.needs_outcomes(op)):
            # The op is out of the fold already: put it back for the one index range it reads.
            fold.ops[op.op_id] = op
            add_outcomes(store, fold, [op.op_id], until_seq=until_seq)
            del fold.ops[op.op_id]

    if outcomes == "none":
        return opscan.stream_ops(store.path, after_seq, until_seq)
    # "needed": complete() is asked only for the ops that are not clean (opscan tests that).
    return opscan.stream_ops(store.path, after_seq, until_seq, complete=complete, clean_too=outcomes == "all")


def recent(
    store: SqliteStore, want: int | None, group: Callable[[OpsFold], list], *, per_item: int = 40
) -> tuple[OpsFold, list]:
    """The last ``want`` items (``group(fold)``: ops or cycles, oldest first) without reading the
    whole journal: read a window at the end, widen it (x4) until it holds ``want`` complete items.

    The first two items of a window that does not start at the beginning are dropped: they may
    have begun before it (a cycle whose pause came earlier). ``want`` None reads everything.
    """
    head = store.last_seq()
    window = head if want is None else max(MIN_WINDOW, (want + 2) * per_item)
    for _ in range(64):  # bounded: the window reaches the start after a few widenings
        start = max(0, head - window)
        fold = load_ops(store, after_seq=start, until_seq=head)
        items = group(fold)
        if start == 0:
            return fold, items if want is None else items[-want:]
        complete = items[2:]
        if len(complete) >= want:  # type: ignore[operator]
            return fold, complete[-want:]  # type: ignore[operator]
        window *= 4
    raise AssertionError("unreachable: the window covers the journal long before")


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

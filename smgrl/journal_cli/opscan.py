"""The fast read of operations for ``refits`` and ``ops``: a million-event journal in about a second.

What costs time at that size is not SQLite but Python: creating a string per row and parsing JSON.
So the scan asks SQLite (one statement per type, in seq order on the (type, seq) index) for the
parts of each ``control.started`` payload it needs, already cut apart:

* the payload is canonical JSON (sorted keys, no spaces: ``journal.events.encode``), so ``body``
  is its first key and ``targets`` its last. No JSON string can contain the text
  ``,"body_encoding":`` or ``,"targets":`` (a quote inside a string is always escaped), so the
  first occurrence of each is the key itself;
* the head without the body (request bodies may be 64 KiB) is parsed as a small object;
* the targets text is parsed once per distinct fleet: consecutive fan-outs to the same engines
  have byte-identical targets.

Any row that does not split that way (another schema, a hand-made payload) is parsed whole.
``control.finished`` rows are parsed with ``json.loads``; the garbage collector is paused during
the scan (a CLI process builds many small objects and no cycles).

``stream_ops`` yields the same operations one by one in start order with bounded state: an
operation is complete once its ``control.finished`` (or ``control.interrupted``) is read, and
only the operations started since the oldest still-open one are held (``--all`` over a million
events holds a handful, not 90,000).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import json
import sqlite3
from collections import deque
from collections.abc import Callable, Iterator

from smgrl.journal_cli import sqlview
from smgrl.state.refits import Op, OpsFold

__all__ = ["scan_ops", "stream_ops"]

_QUERY = "SELECT seq, ts, type, payload FROM events WHERE type = ? AND seq > ? AND seq <= ? ORDER BY seq"
_TYPES = ("control.started", "control.finished", "control.interrupted")


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _rows(conn: sqlite3.Connection, after: int, until: int) -> Iterator[tuple[int, float, str, str]]:
    return heapq.merge(*(conn.execute(_QUERY, (type_, after, until)) for type_ in _TYPES))


def _split(payload: str) -> tuple[str, str] | None:
    """(head without body and targets, targets text) of a canonical control.started payload."""
    b = payload.find(',"body_encoding":')
    t = payload.find(',"targets":', b)
    if b < 0 or t < 0 or not payload.startswith('{"body":') or not payload.endswith("]}"):
        return None
    return "{" + payload[b + 1 : t] + "}", payload[t + 11 : -1]


def _started_dicts(
    conn: sqlite3.Connection, after_seq: int, until_seq: int | None
) -> Iterator[tuple[int, float, str, dict]]:
    """(seq, ts, type, payload dict) of the control rows in ``(after_seq, until_seq]``, seq order."""
    targets_cache: dict[str, list] = {}
    loads = json.loads
    limit = until_seq if until_seq is not None else (1 << 62)
    for seq, ts, type_, payload in _rows(conn, after_seq, limit):
        parts = _split(payload) if type_ == "control.started" else None
        try:
            if parts is None:
                p = loads(payload)
            else:
                p = loads(parts[0])
                parsed = targets_cache.get(parts[1])
                if parsed is None:
                    parsed = targets_cache[parts[1]] = loads(parts[1])
                p["targets"] = parsed
        except ValueError:
            continue  # verify reports it; an unreadable row is no operation
        if isinstance(p, dict) and "op_id" in p:
            yield seq, ts, type_, p


def scan_ops(path: str, after_seq: int = 0, until_seq: int | None = None) -> OpsFold:
    """An OpsFold of the operations started in ``(after_seq, until_seq]`` (no outcomes: add them
    per op). Operations started before ``after_seq`` are not known: their later events are skipped."""
    fold = OpsFold()
    apply = fold.apply
    with sqlview.view(path) as conn, _gc_paused():
        for row in _started_dicts(conn, after_seq, until_seq):
            apply(*row)
    return fold


def stream_ops(
    path: str,
    after_seq: int = 0,
    until_seq: int | None = None,
    *,
    complete: Callable[[OpsFold, Op], None] | None = None,
) -> Iterator[Op]:
    """The operations of ``scan_ops`` one by one, in start order, each final when yielded (its
    finish read, or the range ended with it open). ``complete(fold, op)`` runs just before an op
    is yielded (to read its outcomes). Holds only the ops started since the oldest open one."""
    fold = OpsFold()
    ops = fold.ops
    order: deque[str] = deque()  # op ids in start order, not yet yielded
    with sqlview.view(path) as conn, _gc_paused():
        for seq, ts, type_, p in _started_dicts(conn, after_seq, until_seq):
            if type_ == "control.started":
                if p["op_id"] in ops:
                    order.remove(p["op_id"])  # a repeated id replaces the pending op (as scan_ops)
                fold.apply(seq, ts, type_, p)
                order.append(p["op_id"])
                continue
            fold.apply(seq, ts, type_, p)
            while order:
                first = ops.get(order[0])
                if first is not None and first.result is None:
                    break  # the oldest open op holds back every later one (start order)
                order.popleft()
                if first is not None:
                    del ops[first.op_id]
                    if complete is not None:
                        complete(fold, first)
                    yield first
        for op_id in order:  # still open at the end of the range
            op = ops.pop(op_id, None)
            if op is not None:
                if complete is not None:
                    complete(fold, op)
                yield op

"""The fast read of operations for ``refits`` and ``ops``: the journal's operation index.

Each operation is one row of ``op_index`` (``journal/opindex.py``: derived from the events in the
transaction that appends them, rebuilt and compared by ``smgrl journal verify``), so walking every
operation of a million-event journal reads 90,000 narrow rows in seq order instead of parsing
180,000 payloads. The row holds what ``OpsFold`` would make of the operation's events; this module
turns it into the same ``Op``. Targets are parsed once per distinct text (consecutive fan-outs to
one fleet have byte-identical targets). Outcomes are not filled in: ``reading.add_outcomes`` reads
them from the events for the operations that need them (not fully successful: rare).

``stream_ops`` yields the operations one by one in start order: every row is final as of the
range's end, so nothing is held but the row being turned into an ``Op``.
"""

from __future__ import annotations

import contextlib
import gc
import json
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

from smgrl.history import sqlview
from smgrl.state import Op, OpsFold, phase_of

__all__ = ["gc_paused", "scan_ops", "stream_ops"]

_QUERY = (
    "SELECT seq, op_id, ts, kind, method, path, selector, phase, version, targets, closed_seq,"
    " end_ts, result, total, succeeded, failed, latency_ms FROM op_index AS o"
    " WHERE seq > ?1 AND seq <= ?2"
    # An op id started again replaces the earlier operation (as OpsFold keys them by id); op ids
    # are UUIDs, so this is one probe of the (op_id, seq) index per row that finds nothing.
    " AND NOT EXISTS (SELECT 1 FROM op_index AS n WHERE n.op_id = o.op_id AND n.seq > o.seq AND n.seq <= ?2)"
    " ORDER BY seq"
)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    # A CLI process builds many small objects and no cycles: the collector would only cost time.
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _parse_targets(text: str) -> list[dict[str, Any]]:
    try:
        raw = json.loads(text)
    except ValueError:
        return []
    if not isinstance(raw, list):
        return []
    return [t for t in raw if isinstance(t, dict) and isinstance(t.get("worker_id"), str)]


def _ops(conn: sqlite3.Connection, fold: OpsFold, after_seq: int, until_seq: int | None) -> Iterator[Op]:
    """The operations started in ``(after_seq, until_seq]`` in start order, as of ``until_seq``."""
    limit = until_seq if until_seq is not None else (1 << 62)
    parsed_of: dict[str, tuple] = {}
    phases: dict[tuple, str | None] = {}
    targets_of = fold._targets
    for row in conn.execute(_QUERY, (after_seq, limit)):
        (seq, op_id, ts, kind, method, path, selector, phase, version, targets, closed, end_ts, result,
         total, succeeded, failed, latency_ms) = row  # fmt: skip
        converted = parsed_of.get(targets)
        if converted is None:
            if len(parsed_of) > 1024:
                parsed_of.clear()  # bounded: a fleet that keeps changing
            # OpsFold._targets hands out one map per parsed list: ops with identical targets
            # share it (as they did when each row asked the fold), converted once per text here.
            converted = parsed_of[targets] = targets_of(_parse_targets(targets))
        tmap, engines = converted
        method = method if isinstance(method, str) else ""
        path = path if isinstance(path, str) else ""
        key = (path, phase, method)
        try:
            op_phase = phases[key]
        except KeyError:
            op_phase = phases[key] = phase_of(path, {"phase": phase}, method)
        if closed is not None and closed <= limit:
            end, res = end_ts, result
            if total is None:  # interrupted, no control.finished: the fold's defaults
                total, succeeded, failed, latency_ms = len(tmap), 0, 0, None
        else:  # still open as of the range's end
            end = res = latency_ms = None
            total, succeeded, failed = len(tmap), 0, 0
        # Positional (every field, in Op's order): a third cheaper than keywords, 90,000 times.
        # tests/journal_cli/test_op_index.py compares every field with the fold over the events.
        op = Op(
            op_id, seq, ts, kind if kind is not None else "call", method, path, selector, op_phase,
            version, tmap, {}, end, res, total, succeeded, failed, latency_ms, engines,
        )  # fmt: skip
        yield op


def scan_ops(path: str, after_seq: int = 0, until_seq: int | None = None) -> OpsFold:
    """An OpsFold of the operations started in ``(after_seq, until_seq]`` (no outcomes: add them
    per op), each as of ``until_seq``."""
    fold = OpsFold()
    with sqlview.view(path) as conn, gc_paused():
        fold.ops = {op.op_id: op for op in _ops(conn, fold, after_seq, until_seq)}
    return fold


def stream_ops(
    path: str,
    after_seq: int = 0,
    until_seq: int | None = None,
    *,
    complete: Callable[[OpsFold, Op], None] | None = None,
    clean_too: bool = True,
) -> Iterator[Op]:
    """The operations of ``scan_ops`` one by one, in start order, each final when yielded.
    ``complete(fold, op)`` runs just before an op is yielded (to read its outcomes); with
    ``clean_too`` False only for ops that are not ``clean`` (the only ones that need outcomes)."""
    fold = OpsFold()
    with sqlview.view(path) as conn, gc_paused():
        for op in _ops(conn, fold, after_seq, until_seq):
            # ``op.clean`` inlined: asked 90,000 times at --all, where nearly every op is clean.
            if complete is not None and (clean_too or op.result != "ok" or op.failed != 0):
                complete(fold, op)
            yield op

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
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import json
import sqlite3
from collections.abc import Iterator
from typing import Any

from smgrl.journal_cli import sqlview
from smgrl.state.refits import OpsFold

__all__ = ["scan_ops"]

_STARTED = """
SELECT seq, ts, type,
       CASE WHEN b > 0 AND t > b THEN '{' || substr(payload, b + 1, t - b - 1) || '}' END,
       CASE WHEN b > 0 AND t > b THEN substr(payload, t + 11, length(payload) - t - 11) END,
       CASE WHEN b > 0 AND t > b THEN NULL ELSE payload END
FROM (SELECT seq, ts, type, payload, instr(payload, ',"body_encoding":') AS b,
             instr(payload, ',"targets":') AS t
      FROM events WHERE type = 'control.started' AND seq <= ?)
ORDER BY seq
"""
_OTHER = "SELECT seq, ts, type, NULL, NULL, payload FROM events WHERE type = ? AND seq <= ? ORDER BY seq"


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _rows(conn: sqlite3.Connection, until_seq: int) -> Iterator[tuple[Any, ...]]:
    started = conn.execute(_STARTED, (until_seq,))
    finished = conn.execute(_OTHER, ("control.finished", until_seq))
    interrupted = conn.execute(_OTHER, ("control.interrupted", until_seq))
    return heapq.merge(started, finished, interrupted)


def scan_ops(path: str, until_seq: int | None = None) -> OpsFold:
    """An OpsFold of every operation up to ``until_seq`` (no outcomes: add them per op)."""
    fold = OpsFold()
    targets_cache: dict[str, list] = {}
    loads = json.loads
    apply = fold.apply
    with sqlview.view(path) as conn, _gc_paused():
        limit = until_seq if until_seq is not None else (1 << 62)
        for seq, ts, type_, head, targets, whole in _rows(conn, limit):
            if whole is not None:
                try:
                    p = loads(whole)
                except ValueError:
                    continue  # verify reports it; an unreadable row is no operation
            else:
                try:
                    p = loads(head)
                    parsed = targets_cache.get(targets)
                    if parsed is None:
                        parsed = targets_cache[targets] = loads(targets)
                except ValueError:
                    p = _whole(conn, seq)
                    if p is None:
                        continue
                else:
                    p["targets"] = parsed
            if isinstance(p, dict) and "op_id" in p:
                apply(seq, ts, type_, p)
    return fold


def _whole(conn: sqlite3.Connection, seq: int) -> dict | None:
    row = conn.execute("SELECT payload FROM events WHERE seq = ?", (seq,)).fetchone()
    try:
        return json.loads(row[0]) if row else None
    except ValueError:
        return None

"""``smgrl journal loopbacks``: the requests the data plane looped back (partial-rollout loopback),
per refit cycle: "which requests were looped back during refit N, and how many tokens did that save".

A ``dataplane.request_looped_back`` event names, per segment, the operation whose abort ended it
(``segments[].op_id``). A refit cycle is a set of operations (``smgrl.state.refits``), so a
request belongs to every cycle one of whose operations aborted one of its segments, and what a
cycle saved is the tokens of the segments its operations aborted (decoded, kept, not regenerated).
Summed over the cycles that is the event's ``tokens_kept``.

The events are read by the (type, seq) index, a streamed cursor, and only from the first shown
cycle on: a loopback is journaled when its request ends, after the operation that caused it.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable, Iterator
from typing import Any

import attrs
import click

from smgrl.cli.journal.group import EXIT_BAD_VALUE, CliError, Ctx, command, last_or_all, refuse_last_with_all
from smgrl.cli.journal.render import table
from smgrl.history import sqlview
from smgrl.history.reading import load_ops
from smgrl.history.values import fmt_ts
from smgrl.state import Cycle, group_cycles

__all__ = ["LoopbackRecord", "per_cycle", "read_loopbacks"]

TYPE = "dataplane.request_looped_back"
LAST_DEFAULT = 50  # requests listed unless --last, --all or --refit say otherwise

_QUERY = """
SELECT seq, ts, schema,
  json_extract(payload, '$.request_id'), json_extract(payload, '$.model'),
  json_extract(payload, '$.generated_tokens'), json_extract(payload, '$.tokens_kept'),
  json_extract(payload, '$.loopbacks'), json_extract(payload, '$.outcome'),
  json_extract(payload, '$.segments')
FROM events WHERE type = ? AND seq > ? ORDER BY seq
"""


@attrs.frozen
class LoopbackRecord:
    seq: int
    ts: float
    request_id: str | None
    model: str | None
    generated_tokens: int
    tokens_kept: int
    loopbacks: int
    outcome: str
    kept_by_op: dict[str, int]  # op_id -> tokens of the segments its abort ended

    # A to_json of its own fields (shaped like every record's to_json; nothing to share).
    def to_json(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "ts": self.ts,
            "request_id": self.request_id,
            "model": self.model,
            "generated_tokens": self.generated_tokens,
            "tokens_kept": self.tokens_kept,
            "loopbacks": self.loopbacks,
            "outcome": self.outcome,
            "kept_by_op": dict(self.kept_by_op),
        }


def _int(v: Any) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def _kept_by_op(raw: Any) -> dict[str, int]:
    try:
        segments = json.loads(raw) if isinstance(raw, str) else []
    except ValueError:
        return {}
    out: dict[str, int] = {}
    for s in segments if isinstance(segments, list) else []:
        op = s.get("op_id") if isinstance(s, dict) else None
        if isinstance(op, str) and op:
            out[op] = out.get(op, 0) + max(0, _int(s.get("end")) - _int(s.get("start")))
    return out


def read_loopbacks(path: str, after_seq: int = 0) -> Iterator[LoopbackRecord]:
    """Every loopback event after ``after_seq``, oldest first, streamed (only the segments
    array is parsed in Python; the scalar fields come from ``json_extract``)."""
    with sqlview.view(path) as conn:
        for seq, ts, _schema, rid, model, gen, kept, n, outcome, segments in conn.execute(
            _QUERY, (TYPE, after_seq)
        ):
            yield LoopbackRecord(
                seq=seq,
                ts=ts,
                request_id=rid if isinstance(rid, str) else None,
                model=model if isinstance(model, str) else None,
                generated_tokens=_int(gen),
                tokens_kept=_int(kept),
                loopbacks=_int(n),
                outcome=outcome if isinstance(outcome, str) else "?",
                kept_by_op=_kept_by_op(segments),
            )


def per_cycle(cycles: Iterable[Cycle], loopbacks: Iterable[LoopbackRecord]) -> dict[int, tuple[int, int]]:
    """``{cycle index: (requests looped back, tokens kept)}`` for these cycles (0s included)."""
    owner = {op.op_id: c.index for c in cycles for op in c.ops}
    out = dict.fromkeys(set(owner.values()), (0, 0))
    for lb in loopbacks:
        for index, kept in _by_cycle(lb, owner).items():
            n, total = out[index]
            out[index] = (n + 1, total + kept)
    return out


def _by_cycle(lb: LoopbackRecord, owner: dict[str, int]) -> dict[int, int]:
    mine: dict[int, int] = {}
    for op, kept in lb.kept_by_op.items():
        index = owner.get(op)
        if index is not None:
            mine[index] = mine.get(index, 0) + kept
    return mine


CYCLE_WINDOW = 4096  # events read after a cycle's first seq at first (x4 until it is closed)


def _cycle(store, index: int) -> Cycle:
    """Refit cycle ``index`` (the seq of its first operation, as ``refits`` shows it), read from
    a window of the journal that starts there and widens until the cycle is closed (or the window
    reaches the end): a cycle long ago costs its own span, not the rest of the journal."""
    head = store.last_seq()
    window = CYCLE_WINDOW
    for _ in range(64):  # bounded: the window reaches the end after a few widenings
        upto = min(head, index + window)
        fold = load_ops(store, after_seq=index - 1, until_seq=upto)
        if not any(op.seq == index for op in fold.ops.values()):
            break  # no operation starts at that seq: not a cycle, whatever comes after
        found = next((c for c in group_cycles(fold.in_order()) if c.index == index), None)
        if found is not None and (found.stage == "done" or upto == head):
            return found
        if upto == head:
            break
        window *= 4
    raise CliError(f"no refit cycle {index} (see 'smgrl journal refits')", EXIT_BAD_VALUE)


@command("loopbacks")
@click.option(
    "--refit",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Only the requests looped back by refit cycle N (its 'cycle' in 'refits').",
)
# Option declarations shaped like the other commands' (each command its own flag and help).
@last_or_all(f"The N most recent requests (default {LAST_DEFAULT}).", "Every looped-back request.")
def loopbacks(ctx: Ctx, refit, last, everything) -> None:
    """Requests continued after a sync's abort (partial-rollout loopback): tokens kept, by refit."""
    refuse_last_with_all(last, everything)
    with ctx.reader() as store:
        if refit is not None:
            cycle = _cycle(store, refit)
            owner = {op.op_id: cycle.index for op in cycle.ops}
            after = cycle.index
        else:
            owner, after = {}, 0
        # Without --refit or --all only the last N are kept while the events stream by.
        keep = None if everything or (refit is not None and last is None) else (last or LAST_DEFAULT)
        found: collections.deque[LoopbackRecord] = collections.deque(maxlen=keep)
        requests = total = 0
        for lb in read_loopbacks(ctx.path, after):
            if refit is None:
                mine = lb.tokens_kept
            elif refit in (shares := _by_cycle(lb, owner)):
                mine = shares[refit]
            else:
                continue  # not looped back by this cycle's operations
            requests, total = requests + 1, total + mine
            found.append(lb)
    # With --refit, only this cycle's share: a request looped back by two refits counts in each
    # for its own.
    kept = {lb.seq: _by_cycle(lb, owner).get(refit, 0) if refit else lb.tokens_kept for lb in found}
    if ctx.json:
        items = [lb.to_json() for lb in found]
        out: dict[str, Any] = {"loopbacks": items}
        if refit is not None:
            for item, lb in zip(items, found):
                item["refit_tokens_kept"] = kept[lb.seq]
            out.update(cycle=refit, requests=requests, tokens_kept=total)
        ctx.emit(out)
        return
    if not found:
        click.echo("no looped-back requests" + (f" in refit cycle {refit}" if refit else ""))
        return
    rows = [
        {
            "seq": lb.seq,
            "time": fmt_ts(lb.ts),
            "request": lb.request_id or "-",
            "outcome": lb.outcome,
            "loops": lb.loopbacks,
            "kept": kept[lb.seq],
            "tokens": lb.generated_tokens,
            "ops": ", ".join(lb.kept_by_op) or "-",
        }
        for lb in found
    ]
    click.echo(table(rows, list(rows[0]), limits={"request": 36, "ops": 40}))
    if refit is not None:
        click.echo(f"refit cycle {refit}: {requests} requests looped back, {total} tokens kept")

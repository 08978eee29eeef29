"""The refit sagas behind the cycles ``smgrl journal refits`` shows (docs/refits.md): each saga's
``refit.*`` events folded by the gateway's own projection (``smgrl.state.sagas``), plus the states
it went through (``recovering`` after a crash, ``awaiting_transfer``, ...) and the quarantines it
set or lifted; and the quarantines set by hand or by the recovered-engine rule (stream
``quarantine``).

A cycle belongs to a saga when its operations were the saga's (their selector is
``refit:<id>``); each saga is read from its own stream (the ``(stream, seq)`` index), so only the
sagas shown are read.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from smgrl.history.values import fmt_ts
from smgrl.state import Sagas

PREFIX = "refit:"
QUARANTINE = ("worker.quarantined", "worker.released")
COLUMNS = ["refit", "start", "version", "source", "result", "states", "phases", "held"]
QUARANTINE_COLUMNS = ["seq", "time", "worker", "action", "by", "reason"]
LIMITS = {"held": 120, "phases": 120, "reason": 120, "version": 24}


def saga_ids(cycles: Iterable) -> Iterator[str]:
    """The saga ids of these cycles' operations, in order, each once."""
    seen: set[str] = set()
    for c in cycles:
        for op in c.ops:
            sel = op.selector or ""
            if sel.startswith(PREFIX) and sel[len(PREFIX) :] not in seen:
                seen.add(sel[len(PREFIX) :])
                yield sel[len(PREFIX) :]


def read_saga(store, refit_id: str) -> dict[str, Any] | None:
    """One saga as ``GET /v1/rl/refits/{id}`` shows it (without the plan), with ``started`` and
    ``ended`` times, the ``states`` it went through and the ``quarantines`` it set or lifted."""
    fold = Sagas()
    states: list[str] = []
    held: list[dict[str, Any]] = []
    ended = None
    for rec in store.read(0, stream=PREFIX + refit_id):
        ev = rec.event
        fold.apply(rec.seq, ev, rec.ts)
        kind = getattr(ev, "TYPE", None)
        if kind == "refit.state" and ev.state not in states:
            states.append(ev.state)
        elif kind in QUARANTINE:
            held.append(quarantine_row(rec))
        elif kind == "refit.finished":
            ended = rec.ts
    saga = fold.get(refit_id)
    if saga is None:
        return None
    body = saga.to_json()
    body.pop("plan", None)
    return {
        **body,
        "started": fmt_ts(saga.started_ts) if saga.started_ts is not None else None,
        "ended": fmt_ts(ended) if ended is not None else None,
        "states": states,
        "quarantines": held,
    }


def quarantine_row(rec) -> dict[str, Any]:
    ev = rec.event
    by = f"refit {ev.refit_id}" if ev.refit_id else f"by hand ({ev.principal})" if ev.principal else "rule"
    return {
        "seq": rec.seq,
        "time": fmt_ts(rec.ts),
        "worker": ev.worker_id,
        "action": "held" if ev.TYPE == "worker.quarantined" else "released",
        "by": by,
        "reason": ev.reason,
    }


def other_quarantines(store, after_seq: int, until_seq: int | None = None) -> list[dict[str, Any]]:
    """Quarantines set or lifted outside a saga (by hand, the recovered-engine rule)."""
    return [
        quarantine_row(rec)
        for rec in store.read(after_seq, stream="quarantine", types=list(QUARANTINE), until_seq=until_seq)
    ]


def saga_row(s: dict[str, Any]) -> dict[str, Any]:
    """One table row: per phase how many engines finished it; the engines held out and why."""
    engines = s["engines"]
    order: list[str] = []
    for e in engines:
        for p in e["done"]:
            if p not in order:
                order.append(p)
    phases = " ".join(f"{p} {sum(p in e['done'] for e in engines)}/{len(engines)}" for p in order)
    held = [e for e in engines if e["status"] in ("quarantined", "failed", "unknown")]
    return {
        "refit": s["refit_id"],
        "start": s["started"] or "-",
        "version": s["weight_version"],
        "source": s["source"],
        "result": s["state"],
        "states": ",".join(x for x in s["states"] if x != s["state"]) or "-",
        "phases": phases or "-",
        "held": "; ".join(f"{e['worker_id']} {e['status']}: {e['detail'] or '-'}" for e in held) or "-",
    }

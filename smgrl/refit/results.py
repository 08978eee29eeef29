"""One engine's verdict at a saga step, as ``refit.step_done`` records it, and the words the
saga uses for how its engines ended (pure)."""

from __future__ import annotations

from typing import Any

from smgrl.refit import plan as P
from smgrl.state import EngineRun, Saga


def result_of(run: EngineRun, result: str, detail: str | None) -> dict[str, Any]:
    return {"worker_id": run.worker_id, "result": result, "detail": detail}


def summary(saga: Saga) -> str:
    """How the engines ended, by status (``2 resumed, 1 refused, 1 quarantined``)."""
    counts: dict[str, int] = {}
    for r in saga.engines.values():
        counts[r.status] = counts.get(r.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def failure_reason(run: EngineRun) -> str:
    what = "failed" if run.status == "failed" else "outcome unknown"
    return f"{run.phase or 'refit'} {what}" + (f": {run.detail}" if run.detail else "")


def checksum_verdict(saga: Saga, run: EngineRun, body: Any) -> dict[str, Any]:
    """The engine's per-tensor checksums against the trainer's: any difference (or a name the
    engine does not report) fails the load, like a version mismatch."""
    expected = (saga.distributed or {}).get("checksums") or {}
    bad = P.checksum_mismatches(expected, body)
    if bad is None:
        return {
            **result_of(run, "failed", "the weight checker answered without checksums"),
            "checksums": "mismatch",
        }
    if bad:
        shown = ", ".join(bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
        detail = f"checksum mismatch on {len(bad)} of {len(expected)} tensor(s): {shown}"
        return {**result_of(run, "failed", detail), "checksums": "mismatch"}
    return {**result_of(run, "ok", None), "checksums": "verified"}


def excerpt(outcome) -> str:
    body = outcome.body
    if isinstance(body, dict):
        text = body.get("message") or body.get("error") or body.get("detail") or str(body)
        if isinstance(text, dict):
            text = text.get("message") or str(text)
    else:
        text = str(body)
    return f"HTTP {outcome.status}: {str(text)[:300]}"

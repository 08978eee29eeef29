"""The recovered-engine rule (docs/refits.md, docs/deviations.md): an engine that comes back after
being unreachable for at least one health interval may have restarted on its initial weights
(and served rollouts with them elsewhere), so it is held out of routing (quarantined, reason
``recovered``) until a refit loads it, its version is confirmed (``POST
/v1/rl/workers/{id}/version``: an explicit confirmation) or an operator releases it."""

from __future__ import annotations

from smgrl.journaling import ev

REASON_PREFIX = "recovered"


def recovered_reason(interval_secs: float) -> str:
    return (
        f"{REASON_PREFIX}: back after being unreachable for at least {interval_secs:g}s (one health "
        "interval); its weights may be its initial ones: refit it, confirm its version or release it"
    )


async def hold_recovered(journal, worker, interval_secs: float) -> None:
    """Journal the hold (raises JournalWriteError like any append; the caller decides)."""
    await journal.append(
        "quarantine",
        ev(
            "worker.quarantined",
            worker_id=worker.id,
            base_url=worker.base_url,
            reason=recovered_reason(interval_secs),
        ),
    )

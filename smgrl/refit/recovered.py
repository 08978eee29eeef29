"""The recovered-engine rule (docs/refits.md, docs/deviations.md): an engine that may have
restarted on its initial weights (and served rollouts with them elsewhere) is held out of routing
(quarantined, reason ``recovered: ...``) until a refit loads it, its version is confirmed (``POST
/v1/rl/workers/{id}/version``: an explicit confirmation) or an operator releases it. Two signs:

- it comes back after being unreachable for at least one health interval (``hold_recovered``);
- its reported startup identity changed (``identity_events``: SGLang's ``startup_time``,
  TokenSpeed's ``start_time``; ``smgrl.core.identity``), even when no health round saw it down.
"""

from __future__ import annotations

from smgrl.core.identity import startup_identity
from smgrl.events import WorkerIdentitySeen, WorkerQuarantined

REASON_PREFIX = "recovered"
STREAM = "quarantine"


def recovered_reason(interval_secs: float) -> str:
    return (
        f"{REASON_PREFIX}: back after being unreachable for at least {interval_secs:g}s (one health "
        "interval); its weights may be its initial ones: refit it, confirm its version or release it"
    )


def restarted_reason(previous: str, identity: str) -> str:
    return (
        f"{REASON_PREFIX}: its startup identity changed ({previous} -> {identity}): it restarted and "
        "may serve its initial weights: refit it, confirm its version or release it"
    )


async def hold_recovered(journal, worker, interval_secs: float) -> None:
    """Journal the hold (raises JournalWriteError like any append; the caller decides)."""
    await journal.append(
        STREAM,
        WorkerQuarantined(
            worker_id=worker.id,
            base_url=worker.base_url,
            reason=recovered_reason(interval_secs),
        ),
    )


def identity_events(worker, info, sagas) -> list:
    """What to journal after reading ``worker``'s server info (pure): nothing when its identity is
    the one last seen (or the kind reports none); ``worker.identity_seen`` the first time; and with
    it a ``worker.quarantined`` when the identity changed and the engine is not held already."""
    identity = startup_identity(worker.engine, info)
    if identity is None:
        return []
    seen = sagas.identities.get(worker.base_url)
    previous = seen[1] if seen is not None and seen[0] == worker.group else None
    if previous == identity:
        return []
    events = [
        WorkerIdentitySeen(
            worker_id=worker.group,
            base_url=worker.base_url,
            identity=identity,
            previous=previous,
        )
    ]
    if previous is not None and worker.base_url not in sagas.quarantined:
        events.append(
            WorkerQuarantined(
                worker_id=worker.group,
                base_url=worker.base_url,
                reason=restarted_reason(previous, identity)[:500],
            )
        )
    return events

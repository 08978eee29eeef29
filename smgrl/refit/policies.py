"""What a refit does when engines fail a step (``on_failure``, docs/refits.md): ``quarantine``
holds them out of routing (paused) and the rest goes on; ``rollback`` reloads the previous
checkpoint on every engine that was loaded, then resumes all on the old version; ``abort``
stops, all paused."""

from __future__ import annotations

from smgrl.events import RefitState, RefitStepDone, WorkerQuarantined
from smgrl.refit import plan as P
from smgrl.refit.results import failure_reason, result_of
from smgrl.state import EngineRun, Saga


class FailurePolicies:
    """Mixed into ``RefitService``: needs the phase runner (``_members``, ``_failed``, ``_step``,
    ``_calls``, ``_finish``, ``_append``) and the fail-safe's ``_keep_refused``."""

    async def _on_failure(self, saga: Saga, phase: str) -> bool:
        """Apply ``on_failure``; True when the saga is over."""
        failed = self._failed(saga)
        if saga.on_failure == "abort":
            await self._finish(
                saga, "aborted", f"{len(failed)} engine(s) failed at {phase}; everything left paused"
            )
            return True
        if saga.on_failure == "rollback":
            await self._rollback(saga)
            return True
        await self._keep_refused(saga)
        failed = self._failed(saga)
        if failed:
            await self._quarantine(saga, [(r, failure_reason(r)) for r in failed])
        if not any(r.status in ("pending", "ok") for r in saga.engines.values()):
            # Nothing goes on to the new version: the engines that kept their old weights are
            # resumed on them now (never left paused for a refit that is over).
            kept = self._members(saga, "resume")
            if kept:
                await self._step(saga, "resume", kept)
                bad = self._failed(saga)
                if bad:
                    await self._quarantine(saga, [(r, failure_reason(r)) for r in bad])
            await self._finish(saga)
            return True
        return False

    async def _quarantine(self, saga: Saga, runs: list[tuple[EngineRun, str]]) -> None:
        """Hold these engines out of routing; they stay paused (no further step reaches them)."""
        events = []
        for r, why in runs:
            reason = f"refit {saga.refit_id}: {why}"
            events.append(
                WorkerQuarantined(
                    worker_id=r.worker_id,
                    base_url=r.base_url,
                    reason=reason[:500],
                    refit_id=saga.refit_id,
                )
            )
        events.append(
            RefitStepDone(
                refit_id=saga.refit_id,
                phase="quarantine",
                results=[result_of(r, "quarantined", why) for r, why in runs],
            )
        )
        await self._append(saga.refit_id, events)

    async def _rollback(self, saga: Saga) -> None:
        """Reload the previous checkpoint on every engine that was asked to load (or whose
        weights are unknown), then version, flush, verify and resume ALL on the old version."""
        await self._append(saga.refit_id, [RefitState(refit_id=saga.refit_id, state="rolling_back")])
        paused = [r for r in saga.engines.values() if "pause" in r.done]
        touched = [
            r for r in paused if r.phase not in (None, "pause", "init", "begin") or r.status == "unknown"
        ]
        reloadable = [r for r in touched if r.previous_model_path and r.kind != "tokenspeed"]
        lost = [r for r in touched if r not in reloadable]
        if lost:
            await self._quarantine(saga, [(r, "no previous checkpoint to roll back to") for r in lost])
        for phase in ("load", "version", "flush", "verify", "resume"):
            runs = [
                r
                for r in (reloadable if phase in ("load", "version") else paused)
                if r.status != "quarantined" and rollback_call(r, phase) is not None
            ]
            if not runs:
                continue
            calls = {r.worker_id: rollback_call(r, phase) for r in runs}
            results = await self._calls(saga, phase, runs, calls, rollback=True, record=True)
            bad = [saga.engines[x["worker_id"]] for x in results if x["result"] != "ok"]
            if bad:
                await self._quarantine(saga, [(r, f"rollback {phase} failed: {r.detail}") for r in bad])
        await self._finish(saga, "rolled_back", "the fleet resumed on its previous weights")


def rollback_call(run: EngineRun, phase: str) -> P.Call | None:
    prev = run.previous_version
    if phase == "load":
        return P.load_call(run.kind, run.previous_model_path or "", prev, False)  # type: ignore[arg-type]
    if phase == "version":
        return P.version_call(run.kind, prev, False) if run.kind == "vllm" and prev is not None else None
    if phase == "flush":
        return P.flush_call(run.kind)
    if phase == "verify":
        return P.readback_call(run.kind)
    if phase == "resume":
        return P.resume_call(run.kind)
    return None

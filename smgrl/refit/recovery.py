"""A saga the journal left open, resumed (a restart, or another process after its driver died;
docs/refits.md "Crash recovery"): the step a crash cut short is settled first, then the phase
runner goes on over the same record. Repeatable phases run again; a weight-changing step (or an
unfinished transfer) is re-checked by reading the version back; anything still unknown stays
unknown (``on_failure`` decides, never a resume)."""

from __future__ import annotations

from typing import Any

import trio

from smgrl.events import RefitState, RefitStepDone
from smgrl.refit import plan as P
from smgrl.refit.results import result_of
from smgrl.refit.transfer import Transfer
from smgrl.state import EngineRun, Saga

# Phases safe to run again after a crash cut them short (idempotent on every kind).
REPEATABLE = frozenset({"pause", "version", "flush", "verify", "checksum", "resume", "destroy"})
# How long a restart waits, at most, for a load it cut short to end on the engine (read back).
RECHECK_MAX_SECS = 120.0


class Recovery:
    """Mixed into ``RefitService``: needs ``fleet``, ``cfg``, ``control``, ``_transfers`` and the
    phase runner's ``_calls`` and ``_append``."""

    async def _recover(self, saga: Saga) -> None:
        """A restart found this saga open. The step cut short is settled first: repeatable phases
        run again; a weight-changing step (or an unfinished transfer) is re-checked by reading the
        version back; anything still unknown stays unknown (on_failure decides, never a resume)."""
        prior = saga.state
        # The trainer's chunks since the saga last (re)entered awaiting_transfer: those are the
        # only operations of this saga after its last saga event (chunks append none of their own).
        cut = self._chunks_cut_short(saga, saga.last_seq) if prior == "awaiting_transfer" else []
        # Names this process as the saga's driver from here on (smgrl.cluster.sharing.saga_driver): the
        # trainer's hand-off landing on any process is forwarded here.
        await self._append(
            saga.refit_id,
            [RefitState(refit_id=saga.refit_id, state="recovering", gateway=self.control.identity)],
        )
        step = saga.open_step
        if step is not None:
            phase, worker_ids, _ops, _rb = step
            runs = [saga.engines[w] for w in worker_ids if w in saga.engines]
            if phase in REPEATABLE and not _rb:
                # "retry": the projection puts them back where they were; the loop runs it again.
                retry = [result_of(r, "retry", "cut short by a restart") for r in runs]
                await self._append(
                    saga.refit_id, [RefitStepDone(refit_id=saga.refit_id, phase=phase, results=retry)]
                )
            elif phase in P.WEIGHT_PHASES:
                await self._recheck(saga, phase, runs)
            else:
                results = [result_of(r, "unknown", f"{phase} cut short by a restart") for r in runs]
                await self._append(
                    saga.refit_id,
                    [RefitStepDone(refit_id=saga.refit_id, phase=phase, results=results)],
                )
        if prior == "awaiting_transfer" and cut:
            # A chunk's engine calls were cut short by the crash: what the engines received is
            # unknown. Read back and compared (a transfer not committed yet reads the old version:
            # unknown, on_failure decides); never resumed on unknown weights.
            runs = [r for r in saga.engines.values() if r.status in ("pending", "ok")]
            await self._recheck(saga, "transfer", runs)
        # Otherwise no engine call was in flight: the engines hold exactly the chunks the trainer
        # was answered for, its weight-update group (trainer <-> engines) does not pass through the
        # gateway, so the wait for the trainer goes on (_forward), for what is left of its timeout.

    def _chunks_cut_short(self, saga: Saga, since_seq: int) -> list[str]:
        """The trainer's transfer chunks of ``saga`` after ``since_seq`` that never finished
        (still open, or recorded interrupted when their process died)."""
        source = f"refit:{saga.refit_id}"
        ops = self.fleet.operations
        return [
            op.op_id
            for op in (*ops.open.values(), *ops.recent.values())
            if op.selector == source and op.started_seq > since_seq and op.result in (None, "interrupted")
        ]

    async def _recheck(self, saga: Saga, phase: str, runs: list[EngineRun]) -> None:
        """Read each engine's version back: the new version -> the phase counts as done; anything
        else (other version, no answer, no version route) -> unknown."""
        seen = await self._read_back(saga, runs, patient=phase in P.WEIGHT_PHASES)
        results = []
        for r, x in zip(runs, seen, strict=True):
            if x["result"] == "ok" and x.get("version") == saga.weight_version:
                results.append(
                    {**result_of(r, "ok", "version read back after a restart"), "version": x.get("version")}
                )
            else:
                why = x.get("detail") or "the engine does not report the new version"
                results.append(result_of(r, "unknown", f"load outcome unknown after a restart: {why}"))
        if phase == "transfer":
            if any(x["result"] != "ok" for x in results):
                await self._append(
                    saga.refit_id,
                    [RefitStepDone(refit_id=saga.refit_id, phase=phase, results=results)],
                )
            # A transfer confirmed by read-back needs no commit any more.
            transfer = self._transfers.setdefault(saga.refit_id, Transfer())
            transfer.verdict = "commit"
            transfer.decided.set()
            return
        await self._append(
            saga.refit_id, [RefitStepDone(refit_id=saga.refit_id, phase=phase, results=results)]
        )

    async def _read_back(self, saga: Saga, runs: list[EngineRun], *, patient: bool) -> list[dict[str, Any]]:
        """Each engine's version, read back. ``patient``: a load the crash cut short may still be
        running on the engine (it outlives the gateway), and until it ends the engine reports
        its previous version; such engines are asked again, less and less often, until they
        report the refit's version or for as long as the load itself could have taken
        (``--rl-control-timeout-secs``, at most ``RECHECK_MAX_SECS``). Any other answer is final."""
        calls = {r.worker_id: P.readback_call(r.kind) for r in runs}
        seen = dict(
            zip([r.worker_id for r in runs], await self._calls(saga, "recheck", runs, calls), strict=True)
        )
        deadline = trio.current_time() + min(float(self.cfg.rl.control_timeout_secs), RECHECK_MAX_SECS)
        pause = 0.5
        while patient:
            again = [
                r
                for r in runs
                if r.previous_version is not None
                and seen[r.worker_id].get("version") == r.previous_version
                and r.previous_version != saga.weight_version
            ]
            if not again or trio.current_time() + pause > deadline:
                break
            await trio.sleep(pause)
            pause = min(pause * 2, 5.0)
            fresh = await self._calls(
                saga, "recheck", again, {r.worker_id: calls[r.worker_id] for r in again}
            )
            seen.update(zip([r.worker_id for r in again], fresh, strict=True))
        return [seen[r.worker_id] for r in runs]

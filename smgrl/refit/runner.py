"""The refit saga's phase runner (docs/refits.md): per phase, ``refit.step`` (which engines,
through which control operations) is durable BEFORE any engine is called; the calls run as
ordinary control fan-outs (``ControlService.fanout``: ``control.*`` events in ``op:<id>``, so
discovery's version/pause state and ``smgrl journal refits`` see them); then ``refit.step_done``
records each engine's verdict. It decides only from the saga projection (``smgrl.state.sagas``),
never from local variables that a crash would lose.

Rules:
- one phase runs on the whole fleet before the next, so every load's outcome is known before
  any engine resumes;
- an engine whose step failed or whose outcome is unknown takes no further step: it is never
  resumed on weights nobody knows (``smgrl.refit.policies`` applies ``on_failure``);
- a load is verified by reading the version back from another route (``verify`` phase), and,
  when the trainer passed checksums, by the engine's per-tensor checksum route where its kind has
  one (``checksum`` phase; the others are recorded ``unverified``). A mismatch is a failed load.
"""

from __future__ import annotations

import logging
from typing import Any

import attrs
import trio

from journal import Expect, JournalConflict, JournalWriteError
from smgrl.control import CallContext, ControlRequest
from smgrl.core import Worker, new_operation_id
from smgrl.core.errors import JournalUnavailable
from smgrl.events import RefitFinished, RefitStep, RefitStepDone, WorkerReleased
from smgrl.refit import plan as P
from smgrl.refit.results import checksum_verdict, excerpt, result_of, summary
from smgrl.state import EngineRun, Saga
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.refit")

# Stages of a failed exchange after which the engine may have acted (control/outcome.py).
MAY_HAVE_ACTED = frozenset({"send", "head", "body"})


@attrs.frozen
class _Source:
    """What ``ControlService.fanout`` records as the operation's selector."""

    source: str


class Superseded(Exception):
    """Another process drives this saga now (it resumed it): this one stops, recording nothing."""


class PhaseRunner:
    """Mixed into ``RefitService``: needs ``fleet``, ``journal``, ``control``, ``changed`` and the
    other parts' ``_await_transfer`` (transfer) and ``_on_failure`` (policies)."""

    async def _forward(self, saga: Saga) -> None:
        for phase in P.phases_for(saga.source):
            if not saga.is_open:
                return
            runs = self._members(saga, phase)
            if runs:
                await self._step(saga, phase, runs)
            if saga.source == "distributed" and phase == P.TRANSFER_AFTER and saga.is_open:
                waiting = [r for r in saga.engines.values() if r.status in ("pending", "ok")]
                if any("transfer" not in r.done for r in waiting):
                    await self._await_transfer(saga)
            if self._failed(saga) and await self._on_failure(saga, phase):
                return
        await self._finish(saga)

    def _members(self, saga: Saga, phase: str) -> list[EngineRun]:
        """Engines that take ``phase`` now: still healthy in this saga, the phase in their plan
        (``transfer`` is every healthy engine) and not done yet. An engine that refused its load
        and still serves its old weights takes only ``resume``."""
        takes = ("pending", "ok", "refused") if phase == "resume" else ("pending", "ok")
        return [
            r
            for r in saga.engines.values()
            if r.status in takes and (phase == "transfer" or phase in r.phases) and phase not in r.done
        ]

    @staticmethod
    def _failed(saga: Saga) -> list[EngineRun]:
        return [r for r in saga.engines.values() if r.status in ("failed", "unknown")]

    async def _step(self, saga: Saga, phase: str, runs: list[EngineRun], *, rollback: bool = False) -> None:
        calls = {r.worker_id: call_of(r.plan, phase) for r in runs}
        await self._calls(saga, phase, runs, calls, rollback=rollback, record=True)

    async def _calls(
        self,
        saga: Saga,
        phase: str,
        runs: list[EngineRun],
        calls: dict[str, P.Call],
        *,
        rollback: bool = False,
        record: bool = False,
    ) -> list[dict[str, Any]]:
        """Run one phase's calls: engines sharing a call share one control fan-out. With
        ``record``, the phase is a saga step (intent and outcome journaled)."""
        groups: dict[tuple, list[EngineRun]] = {}
        for r in runs:
            c = calls[r.worker_id]
            groups.setdefault((c.method, c.path, c.query, c.body_bytes()), []).append(r)
        op_ids = [new_operation_id() for _ in groups]
        if record:
            intent = RefitStep(
                refit_id=saga.refit_id,
                phase=phase,
                worker_ids=[r.worker_id for r in runs],
                op_ids=op_ids,
                rollback=rollback,
            )
            await self._append(saga.refit_id, [intent])
        results: dict[str, dict[str, Any]] = {}
        ctx = CallContext(principal=saga.principal, request_id=f"refit:{saga.refit_id}:{phase}")

        async def one_group(op_id: str, members: list[EngineRun]) -> None:
            call = calls[members[0].worker_id]
            workers = []
            for r in members:
                w = self.fleet.registry.get(r.worker_id)
                if w is None:
                    results[r.worker_id] = result_of(r, "failed", "the worker was removed")
                else:
                    workers.append(w)
            if not workers:
                return
            req = ControlRequest(
                call.method,
                call.path,
                call.query,
                call.body_bytes(),
                "application/json" if call.body is not None else None,
            )

            def seen(worker: Worker, outcome) -> None:
                results[worker.id] = self._verdict(saga, phase, call, outcome)

            await self.control.fanout(
                _Source(f"refit:{saga.refit_id}"), workers, req, ctx, op_id=op_id, on_outcome=seen
            )

        # One nursery per phase: the phase's fan-outs run at once and all end before the next
        # phase (a fan-out bounds its own concurrency).
        async with trio.open_nursery() as nursery:
            for op_id, members in zip(op_ids, groups.values(), strict=True):
                nursery.start_soon(one_group, op_id, members)
        ordered = [results.get(r.worker_id) or result_of(r, "unknown", "no answer recorded") for r in runs]
        if record:
            done = RefitStepDone(refit_id=saga.refit_id, phase=phase, results=ordered, rollback=rollback)
            confirm = []
            if phase == "verify":
                seen = [
                    (r, x["version"])
                    for r, x in zip(runs, ordered, strict=True)
                    if x["result"] == "ok" and x.get("verification") == "verified" and x.get("version")
                ]
                confirm = self._confirmations(saga, seen)
            await self._append(saga.refit_id, [done, *confirm])
        return ordered

    def _verdict(self, saga: Saga, phase: str, call: P.Call, outcome) -> dict[str, Any]:
        run = saga.engines[outcome.worker_id]
        if outcome.error is not None:
            acted = outcome.stage in MAY_HAVE_ACTED
            return result_of(run, "unknown" if acted else "failed", outcome.error.message)
        if not P.answer_ok(call, outcome.status, outcome.body):
            return result_of(run, "failed", excerpt(outcome))
        if call.check == "checksum":
            return checksum_verdict(saga, run, outcome.body)
        if call.check != "version":
            return result_of(run, "ok", None)
        reported = P.readback(call, outcome.status, outcome.body)
        expected = run.previous_version if saga.state == "rolling_back" else saga.weight_version
        if reported is None or expected is None:
            return {**result_of(run, "ok", "no version to compare"), "verification": "unverified"}
        if reported != expected:
            return {
                **result_of(run, "failed", f"reports version `{reported}`, expected `{expected}`"),
                "version": reported,
                "verification": "mismatch",
            }
        return {**result_of(run, "ok", None), "version": reported, "verification": "verified"}

    async def _finish(self, saga: Saga, result: str | None = None, detail: str | None = None) -> None:
        if not saga.is_open:
            return
        quarantined = [r.worker_id for r in saga.engines.values() if r.status == "quarantined"]
        if result is None:
            # succeeded: every engine on the new version; failed: none (every load failed, the
            # engines quarantined or resumed on their old weights); otherwise quarantined (some
            # held out) or partial (some resumed on the weights they kept).
            ok = [r for r in saga.engines.values() if r.status == "resumed"]
            kept = [r for r in saga.engines.values() if r.status == "refused"]
            result = (
                "failed" if not ok else "quarantined" if quarantined else "partial" if kept else "succeeded"
            )
            if detail is None and result != "succeeded":
                detail = summary(saga)
        events = []
        if result in ("succeeded", "quarantined", "partial"):
            # A refit that loaded, verified and resumed an engine ends its EARLIER quarantine. One
            # set after the refit started (by hand while it ran, or an engine that went away and
            # came back mid-refit) is a decision the refit knows nothing about: it stays.
            for r in saga.engines.values():
                hold = self.fleet.sagas.quarantined.get(r.base_url)
                if r.status == "resumed" and hold is not None and hold.seq < saga.started_seq:
                    events.append(
                        WorkerReleased(
                            worker_id=r.worker_id,
                            base_url=r.base_url,
                            reason="refitted",
                            refit_id=saga.refit_id,
                        )
                    )
        events.append(
            RefitFinished(
                refit_id=saga.refit_id,
                result=result,
                weight_version=saga.weight_version,
                quarantined=quarantined,
                detail=detail,
            )
        )
        await self._append(saga.refit_id, events)
        log_event(log, "refit.finished", refit_id=saga.refit_id, result=result, quarantined=len(quarantined))

    async def _append(self, refit_id: str, events: list) -> None:
        stream = f"refit:{refit_id}"
        items = [(stream, e) for e in events]
        me = self.control.identity
        position = getattr(self.journal, "position", None)
        try:
            if not me or position is None:  # a lone gateway: nobody else drives its sagas
                await self.journal.append_many(items)
            else:
                # Several processes: fenced. Another process resumes a saga whose driver it
                # judged gone (its presence lease lapsed: dead, or its event loop stalled); the
                # old driver must then stop at its next record, never drive on beside the new
                # one. Refused when the saga names another driver (applied here), or when one
                # was named since this process's position (not applied yet: the conditional
                # append). The resumer's own ``recovering`` names it, so it passes.
                saga = self.fleet.sagas.get(refit_id)
                takeover = any(getattr(e, "gateway", None) == me for e in events)
                if saga is not None and saga.driver not in (None, "", me) and not takeover:
                    raise Superseded(saga.driver)
                expect = Expect(after=position, types=("refit.state",), streams=(stream,))
                try:
                    await self.journal.append_if(expect, items)
                except JournalConflict:
                    raise Superseded("(named since this process last read the journal)") from None
        except JournalWriteError as exc:
            raise JournalUnavailable(f"the journal cannot record this refit: {exc}") from exc
        self.changed()


def call_of(plan_json: dict[str, Any], phase: str) -> P.Call:
    for step in plan_json.get("steps", []):
        if step["phase"] == phase:
            c = step["calls"][0]
            path, _, query = c["target"].lstrip("/").partition("?")
            check = {"verify": "version", "checksum": "checksum"}.get(phase, "success")
            return P.Call(
                c["method"],
                path,
                query or None,
                c["body"],
                check,
                "weight_version" if check == "version" else None,
            )
    raise KeyError(phase)

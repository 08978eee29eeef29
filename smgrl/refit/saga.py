"""The refit saga runner: one refit across a fleet, every step intent-then-outcome in the journal.

Per phase (``smgrl.refit.plan``): ``refit.step`` (which engines, through which control
operations) is durable BEFORE any engine is called; the calls run as ordinary control fan-outs
(``ControlService.fanout``: ``control.*`` events in ``op:<id>``, so discovery's version/pause
state and ``smgrl journal refits`` see them); then ``refit.step_done`` records each engine's
verdict. The runner decides only from the saga projection (``smgrl.state.sagas``), never from
local variables that a crash would lose: the run after a restart is the same loop over the same
record, preceded by a re-check of the one step that was cut short (``_recover``).

Rules:
- one phase runs on the whole fleet before the next, so every load's outcome is known before
  any engine resumes;
- an engine whose step failed or whose outcome is unknown takes no further step: it is never
  resumed on weights nobody knows. ``on_failure`` then decides: ``quarantine`` holds it out of
  routing (paused) and the rest goes on; ``rollback`` reloads the previous checkpoint on every
  engine that was loaded, then resumes all on the old version; ``abort`` stops, all paused;
- a load is verified by reading the version back from another route (``verify`` phase), and,
  when the trainer passed checksums, by the engine's per-tensor checksum route where its kind has
  one (``checksum`` phase; the others are recorded ``unverified``). A mismatch is a failed load.

Tasks: every saga runs in the service's nursery (``run``), not in the request that started it,
so a client that disconnects does not cancel the refit. Cancelling the service (shutdown)
cancels sagas mid-step; the journal then has an open saga that the next start resumes.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
import trio

from journal import Expect, JournalConflict, JournalWriteError
from smgrl.control import CallContext, ControlRequest
from smgrl.core import Worker, facts_for, new_operation_id, parse_size
from smgrl.core.errors import JournalUnavailable, NoWorkersMatch
from smgrl.refit import plan as P
from smgrl.refit.errors import (
    RefitDriverUnavailable,
    RefitInProgress,
    RefitNotFound,
    RefitUnsupported,
    RefitWrongState,
    VersionLeft,
)
from smgrl.refit.failsafe import FailSafe, summary
from smgrl.refit.request import RefitRequest
from smgrl.state import EngineRun, Saga
from smgrl.telemetry.journaling import ev
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.refit")

# Stages of a failed exchange after which the engine may have acted (control/outcome.py).
MAY_HAVE_ACTED = frozenset({"send", "head", "body"})
# Phases safe to run again after a crash cut them short (idempotent on every kind).
REPEATABLE = frozenset({"pause", "version", "flush", "verify", "checksum", "resume", "destroy"})
# What deciding to start a refit depends on (several processes: another process's saga).
_SAGA_DECISIONS = ("refit.started", "refit.finished")
DECIDE_ROUNDS = 8


@attrs.frozen
class _Source:
    """What ``ControlService.fanout`` records as the operation's selector."""

    source: str


class _Superseded(Exception):
    """Another process drives this saga now (it resumed it): this one stops, recording nothing."""


@attrs.define(eq=False)
class _Transfer:
    """A distributed refit waiting for its trainer: set by commit/fail."""

    decided: trio.Event = attrs.Factory(trio.Event)
    verdict: str | None = None  # commit | fail
    detail: str | None = None


class RefitService(FailSafe):
    def __init__(self, *, fleet, journal, control, cfg) -> None:
        self.fleet = fleet
        self.journal = journal
        self.control = control
        self.cfg = cfg
        self._nursery: trio.Nursery | None = None
        self._transfers: dict[str, _Transfer] = {}
        self._changed = trio.Event()
        self._running: set[str] = set()
        self._starting: set[str] = set()  # engine addresses of refits whose start is being recorded

    # -- lifecycle -----------------------------------------------------------------------------

    async def run(self, *, resume: bool = True, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Own the sagas' nursery; first resume every saga the journal left open (a crash or a
        shutdown mid-refit). ``resume=False``: several processes share the journal, and an open
        saga may be another live process's (docs/scale-out.md)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for saga in list(self.fleet.sagas.open.values()) if resume else ():
                self._spawn(saga.refit_id, recovering=True)
            task_status.started()
            await trio.sleep_forever()

    def resume(self, refit_id: str) -> bool:
        """Several processes: drive an open saga whose process is gone (the recovery duty, after
        it recorded that process's operations interrupted), as a restart would. False when it
        already runs here or the service is not running."""
        if refit_id in self._running or self._nursery is None:
            return False
        self._spawn(refit_id, recovering=True)
        return True

    def drives(self, refit_id: str) -> bool:
        """Whether this process drives the saga now (its trainer hand-off is held here)."""
        return refit_id in self._running

    def _spawn(self, refit_id: str, recovering: bool = False) -> None:
        if self._nursery is None:
            raise RuntimeError("the refit service is not running")
        self._running.add(refit_id)
        self._nursery.start_soon(self._drive, refit_id, recovering)

    # -- change notification (SSE) ---------------------------------------------------------------

    def changed(self) -> None:
        event, self._changed = self._changed, trio.Event()
        event.set()

    def change_event(self) -> trio.Event:
        """Set at the next change of any saga or quarantine (take it, then read, then wait)."""
        return self._changed

    # -- requests ----------------------------------------------------------------------------------

    def get(self, refit_id: str) -> Saga:
        saga = self.fleet.sagas.get(refit_id)
        if saga is None:
            raise RefitNotFound(refit_id)
        return saga

    def view(self, saga: Saga) -> dict[str, Any]:
        body = saga.to_json()
        for e in body["engines"]:
            facts = self.fleet.engines.get(saga.engines[e["worker_id"]].base_url)
            e["quarantined"] = facts is not None and facts.quarantined is not None
        return body

    async def start(self, req: RefitRequest, principal: str | None, request_id: str | None) -> str:
        # Several processes on one journal: decided on the saga projection's position and
        # appended only if no refit started or finished since, in any process; on a conflict,
        # catch up and decide again (docs/scale-out.md).
        for _ in range(DECIDE_ROUNDS):
            position = getattr(self.journal, "position", None)
            try:
                return await self._start_once(req, principal, request_id, position)
            except JournalConflict:
                await self.journal.catch_up()
        raise JournalUnavailable("refits kept starting elsewhere while deciding; retry")

    async def _start_once(self, req: RefitRequest, principal, request_id, position: int | None) -> str:
        targets = self.control.targets(req.selector)
        if not targets:
            raise NoWorkersMatch(req.selector.source)
        refused = []
        for w in targets:
            why = P.refusal(w.engine, req.source, req.pause_mode)
            if why is not None:
                refused.append({"worker_id": w.id, "url": w.url, "engine": w.engine, "reason": why.reason})
        if refused:
            names = ", ".join(f"{r['worker_id']} ({r['engine']})" for r in refused)
            raise RefitUnsupported(
                f"{len(refused)} selected engine(s) cannot take a {req.source} refit: {names}",
                engines=refused,
            )
        await self._check_checkpoint(req, targets)
        sagas = self.fleet.sagas
        if sagas.left(req.weight_version) and not req.force:
            raise VersionLeft(
                f"the fleet already left version `{req.weight_version}` (published before "
                f"`{sagas.current_version()}`); set `force` to refit to it anyway",
                weight_version=req.weight_version,
                current_version=sagas.current_version(),
            )
        bases = {w.base_url for w in targets}
        busy = sagas.busy(bases)
        if busy is None and bases & self._starting:
            busy = "(being started)"
        if busy is not None:
            raise RefitInProgress(f"refit `{busy}` is still running on some of these engines", refit_id=busy)
        # Reserved until refit.started is applied: a second request for the same engines while
        # this one awaits its append must not pass the check above.
        self._starting |= bases
        try:
            return await self._start(req, targets, principal, request_id, position)
        finally:
            self._starting -= bases

    async def _start(self, req: RefitRequest, targets, principal, request_id, position=None) -> str:
        refit_id = new_operation_id()
        engines, world = self._plans(refit_id, req, targets)
        event = ev(
            "refit.started",
            refit_id=refit_id,
            source=req.source,
            weight_version=req.weight_version,
            on_failure=req.on_failure,
            selector=req.selector.source,
            model_path=req.model_path,
            distributed=_dist_json(req.dist),
            world_size=world,
            pause_mode=req.pause_mode,
            flush=req.flush,
            force=req.force,
            transfer_timeout_secs=req.transfer_timeout_secs if req.source == "distributed" else None,
            engines=engines,
            principal=principal,
            request_id=request_id,
            gateway=self.control.identity,
        )
        # Shielded from the request's cancellation (the client leaving): once refit.started is
        # queued it WILL be written (journal/writer.py), and a saga written but never spawned
        # stays open for ever, holding its engines (refit_in_progress) until a restart. The wait
        # is bounded by --journal-lock-wait-secs; a client that leaves still started its refit.
        # Several processes (``position``): appended only if no refit started or finished since
        # the decision (JournalConflict otherwise: nothing written, nothing to spawn).
        with trio.CancelScope(shield=True):
            if position is None:
                await self._append(refit_id, [event])
            else:
                try:
                    await self.journal.append_if(
                        Expect(after=position, types=_SAGA_DECISIONS), [(f"refit:{refit_id}", event)]
                    )
                except JournalWriteError as exc:
                    raise JournalUnavailable(f"the journal cannot record this refit: {exc}") from exc
                self.changed()
            self._spawn(refit_id)
        log_event(log, "refit.started", refit_id=refit_id, engines=len(engines), version=req.weight_version)
        return refit_id

    def _plans(
        self, refit_id: str, req: RefitRequest, targets: list[Worker]
    ) -> tuple[list[dict], int | None]:
        offsets, world = P.rank_offsets([parse_size(w.labels.get("tp_size")) for w in targets])
        facts = self.fleet.facts()
        engines = []
        for w, offset in zip(targets, offsets, strict=True):
            p = P.plan(
                w.engine,
                req.source,
                req.weight_version,
                model_path=req.model_path,
                dist=req.dist,
                rank_offset=offset,
                world_size=world,
                pause_mode=req.pause_mode,
                flush=req.flush,
            )
            f = facts_for(w, facts)
            engines.append(
                {
                    "worker_id": w.id,
                    "url": w.url,
                    "base_url": w.base_url,
                    "engine": w.engine,
                    "pause_mode": p.pause_mode,
                    "rank_offset": offset if req.source == "distributed" else None,
                    "previous_version": (f.weight_version if f and f.weight_version else None)
                    or w.labels.get("weight_version"),
                    "previous_model_path": self._previous_path(w),
                    "plan": p.to_json(),
                }
            )
        return engines, (world if req.source == "distributed" else None)

    def _previous_path(self, worker: Worker) -> str | None:
        """The checkpoint the engine serves, as the journal remembers it: the newest finished
        disk refit that loaded it, else what the engine reported at registration."""
        best: tuple[int, str] | None = None
        for saga in self.fleet.sagas.recent.values():
            run = saga.engines.get(worker.id)
            loaded = saga.source == "disk" and run is not None and "load" in run.done
            if loaded and saga.result != "rolled_back" and (best is None or saga.last_seq > best[0]):
                best = (saga.last_seq, saga.model_path)
        return best[1] if best else worker.labels.get("model_path")

    async def commit(self, refit_id: str) -> None:
        await self._decide(refit_id, "commit", None)

    async def fail(self, refit_id: str, detail: str | None) -> None:
        await self._decide(refit_id, "fail", detail or "the trainer reported a failed transfer")

    def _driven_here(self, saga: Saga, transfer: _Transfer | None) -> None:
        """A trainer's hand-off for an open saga that nobody drives right now (its driver died and
        is being replaced, or a restart resumes it): retryable, 503 ``refit_driver_unavailable``."""
        waiting = saga.state == "recovering" or (saga.state == "awaiting_transfer" and transfer is None)
        if saga.is_open and waiting:
            raise RefitDriverUnavailable(
                f"refit `{saga.refit_id}` is being resumed by a gateway process (its driver stopped):"
                " retry this call in a moment (docs/scale-out.md)",
                state=saga.state,
            )

    async def _decide(self, refit_id: str, verdict: str, detail: str | None) -> None:
        saga = self.get(refit_id)
        transfer = self._transfers.get(refit_id)
        # Idempotent: a trainer retrying its commit (or fail) whose first answer was lost (its
        # driver died after deciding, a connection broke) is told it was taken.
        if saga.transfer_verdict == verdict or (transfer is not None and transfer.verdict == verdict):
            return
        self._driven_here(saga, transfer)
        if not saga.is_open or saga.state != "awaiting_transfer" or transfer is None:
            raise RefitWrongState(
                f"refit `{refit_id}` is not awaiting a transfer (state `{saga.to_json()['state']}`)",
                state=saga.to_json()["state"],
            )
        if transfer.decided.is_set():
            raise RefitWrongState(f"refit `{refit_id}` was already {transfer.verdict}ed", state=saga.state)
        transfer.verdict, transfer.detail = verdict, detail
        transfer.decided.set()

    async def transfer_chunk(self, refit_id: str, names, dtypes, shapes) -> dict[str, Any]:
        """The engines' half of one broadcast chunk (the trainer sends the tensors meanwhile):
        each engine gets its kind's update call; the answer lists per-engine results."""
        saga = self.get(refit_id)
        self._driven_here(saga, self._transfers.get(refit_id))
        if saga.state != "awaiting_transfer" or not saga.is_open:
            raise RefitWrongState(
                f"refit `{refit_id}` is not awaiting a transfer", state=saga.to_json()["state"]
            )
        dist = _dist_of(saga)
        runs = self._members(saga, "transfer")
        calls = {r.worker_id: P.transfer_call(r.kind, dist, names, dtypes, shapes) for r in runs}
        results = await self._calls(saga, "transfer", runs, calls)
        return {"results": results}

    # -- the saga --------------------------------------------------------------------------------

    async def _drive(self, refit_id: str, recovering: bool) -> None:
        try:
            saga = self.fleet.sagas.get(refit_id)
            if saga is None:
                return
            if recovering:
                await self._recover(saga)
            await self._forward(saga)
        except _Superseded as exc:
            # Another process resumed this saga (it judged this one gone): it drives from here.
            log_event(
                log,
                "refit handed over: another gateway process resumed it",
                logging.WARNING,
                refit_id=refit_id,
                driver=str(exc),
            )
        except (JournalUnavailable, JournalWriteError) as exc:
            # Nothing more can be recorded: stop here; the saga stays open in the journal and
            # the next start resumes it from what was recorded.
            log.error("refit %s stopped: the journal cannot record it: %s", refit_id, exc)
        except Exception:
            # A bug in one saga must not take the gateway (and every other saga) down with it:
            # the saga stays open in the journal, its engines stay as recorded (never resumed
            # on unknown weights), and the next start resumes it. The traceback is logged.
            log.exception("refit %s stopped by an internal error; a restart resumes it", refit_id)
        finally:
            self._running.discard(refit_id)
            self._transfers.pop(refit_id, None)
            self.changed()

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
        calls = {r.worker_id: _call_of(r.plan, phase) for r in runs}
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
            intent = ev(
                "refit.step",
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
                    results[r.worker_id] = _result(r, "failed", "the worker was removed")
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
        ordered = [results.get(r.worker_id) or _result(r, "unknown", "no answer recorded") for r in runs]
        if record:
            done = ev(
                "refit.step_done", refit_id=saga.refit_id, phase=phase, results=ordered, rollback=rollback
            )
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
            return _result(run, "unknown" if acted else "failed", outcome.error.message)
        if not P.answer_ok(call, outcome.status, outcome.body):
            return _result(run, "failed", _excerpt(outcome))
        if call.check == "checksum":
            return _checksum_verdict(saga, run, outcome.body)
        if call.check != "version":
            return _result(run, "ok", None)
        reported = P.readback(call, outcome.status, outcome.body)
        expected = run.previous_version if saga.state == "rolling_back" else saga.weight_version
        if reported is None or expected is None:
            return {**_result(run, "ok", "no version to compare"), "verification": "unverified"}
        if reported != expected:
            return {
                **_result(run, "failed", f"reports version `{reported}`, expected `{expected}`"),
                "version": reported,
                "verification": "mismatch",
            }
        return {**_result(run, "ok", None), "version": reported, "verification": "verified"}

    async def _await_transfer(self, saga: Saga) -> None:
        """Wait for the trainer's commit or fail, at most the refit's transfer timeout."""
        transfer = self._transfers.setdefault(saga.refit_id, _Transfer())
        await self._append(
            saga.refit_id, [ev("refit.state", refit_id=saga.refit_id, state="awaiting_transfer")]
        )
        timeout = saga.transfer_timeout_secs or 600.0
        # Resumed (a restart, or another process after the driver died): what is left of the
        # timeout since the saga first awaited its trainer (journal time, a wall clock).
        waited = time.time() - saga.awaiting_since if saga.awaiting_since is not None else 0.0
        with trio.move_on_after(max(0.0, timeout - max(0.0, waited))):
            await transfer.decided.wait()
        if transfer.verdict == "commit":
            done = [_result(r, "ok", None) for r in saga.engines.values() if r.status in ("pending", "ok")]
            await self._append(
                saga.refit_id,
                [
                    ev("refit.state", refit_id=saga.refit_id, state="committing"),
                    ev("refit.step_done", refit_id=saga.refit_id, phase="transfer", results=done),
                ],
            )
            return
        detail = transfer.detail or f"the transfer did not commit within {timeout:g}s"
        # The engines may hold part of the new weights: unknown, never resumed as they are.
        results = [
            _result(r, "unknown", detail) for r in saga.engines.values() if r.status in ("pending", "ok")
        ]
        await self._append(
            saga.refit_id,
            [
                ev("refit.state", refit_id=saga.refit_id, state="transfer_failed", detail=detail),
                ev("refit.step_done", refit_id=saga.refit_id, phase="transfer", results=results),
            ],
        )

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
            await self._quarantine(saga, [(r, _why(r)) for r in failed])
        if not any(r.status in ("pending", "ok") for r in saga.engines.values()):
            # Nothing goes on to the new version: the engines that kept their old weights are
            # resumed on them now (never left paused for a refit that is over).
            kept = self._members(saga, "resume")
            if kept:
                await self._step(saga, "resume", kept)
                bad = self._failed(saga)
                if bad:
                    await self._quarantine(saga, [(r, _why(r)) for r in bad])
            await self._finish(saga)
            return True
        return False

    async def _quarantine(self, saga: Saga, runs: list[tuple[EngineRun, str]]) -> None:
        """Hold these engines out of routing; they stay paused (no further step reaches them)."""
        events = []
        for r, why in runs:
            reason = f"refit {saga.refit_id}: {why}"
            events.append(
                ev(
                    "worker.quarantined",
                    worker_id=r.worker_id,
                    base_url=r.base_url,
                    reason=reason[:500],
                    refit_id=saga.refit_id,
                )
            )
        events.append(
            ev(
                "refit.step_done",
                refit_id=saga.refit_id,
                phase="quarantine",
                results=[_result(r, "quarantined", why) for r, why in runs],
            )
        )
        await self._append(saga.refit_id, events)

    async def _rollback(self, saga: Saga) -> None:
        """Reload the previous checkpoint on every engine that was asked to load (or whose
        weights are unknown), then version, flush, verify and resume ALL on the old version."""
        await self._append(saga.refit_id, [ev("refit.state", refit_id=saga.refit_id, state="rolling_back")])
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
                if r.status != "quarantined" and _rollback_call(r, phase) is not None
            ]
            if not runs:
                continue
            calls = {r.worker_id: _rollback_call(r, phase) for r in runs}
            results = await self._calls(saga, phase, runs, calls, rollback=True, record=True)
            bad = [saga.engines[x["worker_id"]] for x in results if x["result"] != "ok"]
            if bad:
                await self._quarantine(saga, [(r, f"rollback {phase} failed: {r.detail}") for r in bad])
        await self._finish(saga, "rolled_back", "the fleet resumed on its previous weights")

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
            [ev("refit.state", refit_id=saga.refit_id, state="recovering", gateway=self.control.identity)],
        )
        step = saga.open_step
        if step is not None:
            phase, worker_ids, _ops, _rb = step
            runs = [saga.engines[w] for w in worker_ids if w in saga.engines]
            if phase in REPEATABLE and not _rb:
                # "retry": the projection puts them back where they were; the loop runs it again.
                retry = [_result(r, "retry", "cut short by a restart") for r in runs]
                await self._append(
                    saga.refit_id, [ev("refit.step_done", refit_id=saga.refit_id, phase=phase, results=retry)]
                )
            elif phase in P.WEIGHT_PHASES:
                await self._recheck(saga, phase, runs)
            else:
                results = [_result(r, "unknown", f"{phase} cut short by a restart") for r in runs]
                await self._append(
                    saga.refit_id,
                    [ev("refit.step_done", refit_id=saga.refit_id, phase=phase, results=results)],
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
        calls = {r.worker_id: P.readback_call(r.kind) for r in runs}
        seen = await self._calls(saga, "recheck", runs, calls)
        results = []
        for r, x in zip(runs, seen, strict=True):
            if x["result"] == "ok" and x.get("version") == saga.weight_version:
                results.append(
                    {**_result(r, "ok", "version read back after a restart"), "version": x.get("version")}
                )
            else:
                why = x.get("detail") or "the engine does not report the new version"
                results.append(_result(r, "unknown", f"load outcome unknown after a restart: {why}"))
        if phase == "transfer":
            if any(x["result"] != "ok" for x in results):
                await self._append(
                    saga.refit_id,
                    [ev("refit.step_done", refit_id=saga.refit_id, phase=phase, results=results)],
                )
            # A transfer confirmed by read-back needs no commit any more.
            transfer = self._transfers.setdefault(saga.refit_id, _Transfer())
            transfer.verdict = "commit"
            transfer.decided.set()
            return
        await self._append(
            saga.refit_id, [ev("refit.step_done", refit_id=saga.refit_id, phase=phase, results=results)]
        )

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
                        ev(
                            "worker.released",
                            worker_id=r.worker_id,
                            base_url=r.base_url,
                            reason="refitted",
                            refit_id=saga.refit_id,
                        )
                    )
        events.append(
            ev(
                "refit.finished",
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
                    raise _Superseded(saga.driver)
                expect = Expect(after=position, types=("refit.state",), streams=(stream,))
                try:
                    await self.journal.append_if(expect, items)
                except JournalConflict:
                    raise _Superseded("(named since this process last read the journal)") from None
        except JournalWriteError as exc:
            raise JournalUnavailable(f"the journal cannot record this refit: {exc}") from exc
        self.changed()

    # -- quarantine by hand ------------------------------------------------------------------------

    async def quarantine(self, worker: Worker, reason: str, principal: str | None) -> None:
        await self._hand_quarantine("worker.quarantined", worker, reason, principal)

    async def release(self, worker: Worker, reason: str, principal: str | None) -> None:
        await self._hand_quarantine("worker.released", worker, reason, principal)

    async def _hand_quarantine(
        self, type_name: str, worker: Worker, reason: str, principal: str | None
    ) -> None:
        event = ev(
            type_name, worker_id=worker.id, base_url=worker.base_url, reason=reason, principal=principal
        )
        try:
            await self.journal.append("quarantine", event)
        except JournalWriteError as exc:
            raise JournalUnavailable(f"the journal cannot record this change: {exc}") from exc
        self.changed()


def _result(run: EngineRun, result: str, detail: str | None) -> dict[str, Any]:
    return {"worker_id": run.worker_id, "result": result, "detail": detail}


def _checksum_verdict(saga: Saga, run: EngineRun, body: Any) -> dict[str, Any]:
    """The engine's per-tensor checksums against the trainer's: any difference (or a name the
    engine does not report) fails the load, like a version mismatch."""
    expected = (saga.distributed or {}).get("checksums") or {}
    bad = P.checksum_mismatches(expected, body)
    if bad is None:
        return {
            **_result(run, "failed", "the weight checker answered without checksums"),
            "checksums": "mismatch",
        }
    if bad:
        shown = ", ".join(bad[:5]) + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else "")
        detail = f"checksum mismatch on {len(bad)} of {len(expected)} tensor(s): {shown}"
        return {**_result(run, "failed", detail), "checksums": "mismatch"}
    return {**_result(run, "ok", None), "checksums": "verified"}


def _why(run: EngineRun) -> str:
    what = "failed" if run.status == "failed" else "outcome unknown"
    return f"{run.phase or 'refit'} {what}" + (f": {run.detail}" if run.detail else "")


def _excerpt(outcome) -> str:
    body = outcome.body
    if isinstance(body, dict):
        text = body.get("message") or body.get("error") or body.get("detail") or str(body)
        if isinstance(text, dict):
            text = text.get("message") or str(text)
    else:
        text = str(body)
    return f"HTTP {outcome.status}: {str(text)[:300]}"


def _call_of(plan_json: dict[str, Any], phase: str) -> P.Call:
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


def _rollback_call(run: EngineRun, phase: str) -> P.Call | None:
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


def _dist_json(dist: P.DistributedSource | None) -> dict[str, Any] | None:
    if dist is None:
        return None
    return {
        "master_address": dist.master_address,
        "master_port": dist.master_port,
        "group_name": dist.group_name,
        "backend": dist.backend,
        "checksums": dict(dist.checksums) if dist.checksums else None,
    }


def _dist_of(saga: Saga) -> P.DistributedSource:
    d = saga.distributed or {}
    return P.DistributedSource(
        d.get("master_address", ""),
        int(d.get("master_port") or 0),
        d.get("group_name") or P.DEFAULT_GROUP,
        d.get("backend") or "nccl",
    )

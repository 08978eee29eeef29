"""Starting a refit (docs/refits.md): the request checked against the fleet (engine kinds, the
checkpoint, the version order, refits already running), each engine's plan, and ``refit.started``
recorded before the saga is spawned. Several processes on one journal decide on the saga
projection's position and append only if no refit started or finished since (docs/scale-out.md)."""

from __future__ import annotations

import logging

import trio

from journal import Expect, JournalConflict, JournalWriteError
from smgrl.core import Worker, facts_for, new_operation_id, parse_size
from smgrl.core.errors import JournalUnavailable, NoWorkersMatch
from smgrl.events import RefitStarted
from smgrl.refit import plan as P
from smgrl.refit.errors import RefitInProgress, RefitUnsupported, VersionLeft
from smgrl.refit.request import RefitRequest
from smgrl.refit.transfer import dist_json
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.refit")

# What deciding to start a refit depends on (several processes: another process's saga).
_SAGA_DECISIONS = ("refit.started", "refit.finished")
DECIDE_ROUNDS = 8


class Starting:
    """Mixed into ``RefitService``: needs ``fleet``, ``journal``, ``control``, ``_starting``,
    ``_spawn``, ``changed``, the fail-safe's ``_check_checkpoint`` and the runner's ``_append``."""

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
        event = RefitStarted(
            refit_id=refit_id,
            source=req.source,
            weight_version=req.weight_version,
            on_failure=req.on_failure,
            selector=req.selector.source,
            model_path=req.model_path,
            distributed=dist_json(req.dist),
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

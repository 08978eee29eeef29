"""The refit saga service: one refit across a fleet, every step intent-then-outcome in the journal
(docs/refits.md). ``RefitService`` is the face; its parts, each mixed in:

- ``smgrl.refit.start``: checking a request against the fleet, each engine's plan, ``refit.started``;
- ``smgrl.refit.runner``: the phase runner (intent, control fan-outs, verdicts, the fenced append);
- ``smgrl.refit.policies``: ``on_failure`` (quarantine, rollback, abort);
- ``smgrl.refit.recovery``: settling the step a crash cut short before the runner goes on;
- ``smgrl.refit.transfer``: a distributed refit's trainer hand-off (commit, fail, chunks);
- ``smgrl.refit.failsafe``: what keeps a refit that goes wrong from taking the fleet down.

The runner decides only from the saga projection (``smgrl.state.sagas``), never from local
variables that a crash would lose: the run after a restart is the same loop over the same
record, preceded by a re-check of the one step that was cut short (``_recover``).

Tasks: every saga runs in the service's nursery (``run``), not in the request that started it,
so a client that disconnects does not cancel the refit. Cancelling the service (shutdown)
cancels sagas mid-step; the journal then has an open saga that the next start resumes.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from journal import JournalWriteError
from smgrl.core import Worker
from smgrl.core.errors import JournalUnavailable
from smgrl.events import WorkerQuarantined, WorkerReleased
from smgrl.refit.errors import RefitNotFound
from smgrl.refit.failsafe import FailSafe
from smgrl.refit.policies import FailurePolicies
from smgrl.refit.recovery import Recovery
from smgrl.refit.runner import PhaseRunner, Superseded
from smgrl.refit.start import Starting
from smgrl.refit.transfer import TrainerTransfer, Transfer
from smgrl.state import Saga
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.refit")


class RefitService(Starting, PhaseRunner, FailurePolicies, Recovery, TrainerTransfer, FailSafe):
    def __init__(self, *, fleet, journal, control, cfg) -> None:
        self.fleet = fleet
        self.journal = journal
        self.control = control
        self.cfg = cfg
        self._nursery: trio.Nursery | None = None
        self._transfers: dict[str, Transfer] = {}
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

    # -- the saga --------------------------------------------------------------------------------

    async def _drive(self, refit_id: str, recovering: bool) -> None:
        try:
            saga = self.fleet.sagas.get(refit_id)
            if saga is None:
                return
            if recovering:
                await self._recover(saga)
            await self._forward(saga)
        except Superseded as exc:
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

    # -- quarantine by hand ------------------------------------------------------------------------

    async def quarantine(self, worker: Worker, reason: str, principal: str | None) -> None:
        await self._hand_quarantine(WorkerQuarantined, worker, reason, principal)

    async def release(self, worker: Worker, reason: str, principal: str | None) -> None:
        await self._hand_quarantine(WorkerReleased, worker, reason, principal)

    async def _hand_quarantine(
        self,
        event_class: type[WorkerQuarantined | WorkerReleased],
        worker: Worker,
        reason: str,
        principal: str | None,
    ) -> None:
        event = event_class(worker_id=worker.id, base_url=worker.base_url, reason=reason, principal=principal)
        try:
            await self.journal.append("quarantine", event)
        except JournalWriteError as exc:
            raise JournalUnavailable(f"the journal cannot record this change: {exc}") from exc
        self.changed()

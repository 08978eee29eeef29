"""Refit sagas, quarantines and the order versions were published in: a pure fold of
``refit.*``, ``worker.quarantined``/``worker.released``, ``worker.identity_seen`` and
``engine.version_set`` events.

Three uses: ``GET /v1/rl/refits/{id}`` serves a saga from memory; the saga runner resumes an open
saga after a crash from exactly this record (``EngineRun.done`` says which phases each engine
finished, ``EngineRun.status`` whether its weights are known); the routing table holds
quarantined engines out (their reason reaches ``EngineFacts.quarantined`` through
``FleetState``); a refit to a version the fleet already left is refused (``left``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import attrs

from smgrl.events import (
    EngineVersionSet,
    RefitFinished,
    RefitStarted,
    RefitState,
    RefitStep,
    RefitStepDone,
    WorkerIdentitySeen,
    WorkerQuarantined,
    WorkerReleased,
)

TYPES = frozenset(
    {
        "refit.started",
        "refit.step",
        "refit.step_done",
        "refit.state",
        "refit.finished",
        "worker.quarantined",
        "worker.released",
        "worker.identity_seen",
        "engine.version_set",
    }
)
QUARANTINE_TYPES = frozenset({"worker.quarantined", "worker.released"})
# The events of TYPES.
_EVENTS = (
    RefitStarted,
    RefitStep,
    RefitStepDone,
    RefitState,
    RefitFinished,
    WorkerQuarantined,
    WorkerReleased,
    WorkerIdentitySeen,
    EngineVersionSet,
)
# Results of a saga that left some engine on its version (so the version was published).
PUBLISHED = ("succeeded", "quarantined", "partial")
RECENT = 256  # finished sagas kept in memory (open ones are always kept)
RECOVERED = "recovered"  # smgrl.refit.recovered.REASON_PREFIX (the state layer imports nothing above it)


@attrs.define
class EngineRun:
    worker_id: str
    url: str
    base_url: str
    kind: str
    pause_mode: str
    phases: tuple[str, ...]
    plan: dict[str, Any]
    rank_offset: int | None = None
    previous_version: str | None = None
    previous_model_path: str | None = None
    done: list[str] = attrs.Factory(list)  # phases finished ok, in order
    # pending | running | ok | failed | unknown | quarantined | resumed | refused | rolled_back
    # (``refused``: it refused the load and still serves ``kept``, read back; resumed on it at the
    # resume phase, when ``resume`` is in ``done``)
    status: str = "pending"
    phase: str | None = None  # the phase running or last run
    detail: str | None = None
    failure: str | None = None  # the first failure, ``phase: detail``: kept whatever comes after
    kept: str | None = None  # the previous version a refused engine still serves
    readback: str | None = None
    verified: str | None = None  # verified | unverified | mismatch
    checksums: str | None = None  # trainer checksums: pending | verified | unverified | mismatch

    # A to_json of its own fields (shaped like every record's to_json; nothing to share).
    def to_json(self) -> dict[str, Any]:
        return {
            "worker_id": self.worker_id,
            "url": self.url,
            "engine": self.kind,
            "pause_mode": self.pause_mode,
            "rank_offset": self.rank_offset,
            "phase": self.phase,
            "status": self.status,
            "done": list(self.done),
            "detail": self.detail,
            "failure": self.failure,
            "verification": self.verified,
            "checksums": self.checksums,
            "reported_version": self.readback,
            "previous_version": self.previous_version,
        }


@attrs.define
class Saga:
    refit_id: str
    started_seq: int
    started_ts: float | None
    source: str
    weight_version: str
    on_failure: str
    selector: str | None
    model_path: str | None
    distributed: dict[str, Any] | None
    world_size: int | None
    pause_mode: str | None
    flush: bool
    force: bool
    transfer_timeout_secs: float | None
    engines: dict[str, EngineRun]
    principal: str | None = None
    state: str = "running"
    open_step: tuple[str, tuple[str, ...], tuple[str, ...], bool] | None = None  # phase, workers, ops, rb
    result: str | None = None
    detail: str | None = None
    quarantined: tuple[str, ...] = ()
    last_seq: int = 0
    # When the saga first awaited its trainer's transfer (journal time): a driver that resumes the
    # wait after a restart or a takeover waits only what is left of transfer_timeout_secs.
    awaiting_since: float | None = None
    # The trainer's verdict once journaled: commit (``committing``) or fail (``transfer_failed``,
    # also after its timeout). A hand-off retried after its answer was lost is answered from it.
    transfer_verdict: str | None = None
    # The process driving it (several processes): refit.started's, then a resumer's
    # (``refit.state`` ``recovering`` naming it). A driver that finds another named stops.
    driver: str | None = None

    @property
    def is_open(self) -> bool:
        return self.result is None

    def transfer_info(self) -> dict[str, Any] | None:
        if self.source != "distributed" or self.distributed is None:
            return None
        return {
            "master_address": self.distributed.get("master_address"),
            "master_port": self.distributed.get("master_port"),
            "group_name": self.distributed.get("group_name"),
            "backend": self.distributed.get("backend"),
            "world_size": self.world_size,
            "ranks": {e.worker_id: e.rank_offset for e in self.engines.values()},
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "refit_id": self.refit_id,
            "state": self.state if self.result is None else self.result,
            "result": self.result,
            "detail": self.detail,
            "source": self.source,
            "model_path": self.model_path,
            "weight_version": self.weight_version,
            "on_failure": self.on_failure,
            "selector": self.selector,
            "flush": self.flush,
            "force": self.force,
            "transfer": self.transfer_info(),
            "quarantined": list(self.quarantined),
            "engines": [e.to_json() for e in self.engines.values()],
            "plan": {e.worker_id: e.plan for e in self.engines.values()},
            "started_seq": self.started_seq,
            "last_seq": self.last_seq,
        }


@attrs.frozen
class Quarantine:
    worker_id: str
    reason: str
    refit_id: str | None
    seq: int


class Sagas:
    def __init__(self, recent: int = RECENT) -> None:
        self.open: dict[str, Saga] = {}
        self.recent: OrderedDict[str, Saga] = OrderedDict()
        self.quarantined: dict[str, Quarantine] = {}  # engine base_url -> why
        self.published: dict[str, int] = {}  # version -> seq it was last published at
        # engine base_url -> (worker id, startup identity) last seen; the worker id tells a
        # re-registration at the same address (a new worker: nothing to compare) apart.
        self.identities: dict[str, tuple[str, str]] = {}
        self._cap = recent

    def get(self, refit_id: str) -> Saga | None:
        return self.open.get(refit_id) or self.recent.get(refit_id)

    def current_version(self) -> str | None:
        if not self.published:
            return None
        return max(self.published.items(), key=lambda kv: kv[1])[0]

    def left(self, version: str) -> bool:
        """True when ``version`` was published and another version was published after it
        (order of publication in the journal; never a comparison of the strings)."""
        seq = self.published.get(version)
        return seq is not None and any(s > seq for s in self.published.values())

    def busy(self, base_urls: set[str]) -> str | None:
        """The open saga already working on one of these engines, or None."""
        for saga in self.open.values():
            if any(e.base_url in base_urls for e in saga.engines.values()):
                return saga.refit_id
        return None

    def apply(self, seq: int, event: object, ts: float | None = None) -> None:
        """Fold one journal record (any type: the events of TYPES change the sagas)."""
        if not isinstance(event, _EVENTS):
            return
        if isinstance(event, WorkerQuarantined):
            self.quarantined[event.base_url] = Quarantine(event.worker_id, event.reason, event.refit_id, seq)
            return
        if isinstance(event, WorkerReleased):
            self.quarantined.pop(event.base_url, None)
            return
        if isinstance(event, WorkerIdentitySeen):
            self.identities[event.base_url] = (event.worker_id, event.identity)
            return
        if isinstance(event, EngineVersionSet):
            self.published[event.weight_version] = seq
            # An explicit version write confirms the engine: a recovered-engine hold ends.
            for t in event.targets:
                base = t.get("base_url")
                q = self.quarantined.get(base) if base is not None else None
                if q is not None and q.reason.startswith(RECOVERED):
                    del self.quarantined[t["base_url"]]
            return
        if isinstance(event, RefitStarted):
            self.open[event.refit_id] = _saga(seq, ts, event)
            return
        saga = self.open.get(event.refit_id)
        if saga is None:
            return
        saga.last_seq = seq
        if isinstance(event, RefitStep):
            saga.open_step = (event.phase, tuple(event.worker_ids), tuple(event.op_ids), event.rollback)
            for wid in event.worker_ids:
                run = saga.engines.get(wid)
                if run is not None:
                    run.phase, run.status = event.phase, "running"
        elif isinstance(event, RefitStepDone):
            saga.open_step = None
            for r in event.results:
                worker_id = r.get("worker_id")
                run = saga.engines.get(worker_id) if worker_id is not None else None
                if run is not None:
                    _step_result(run, event.phase, r, event.rollback)
        elif isinstance(event, RefitState):
            saga.state = event.state
            if event.gateway:
                saga.driver = event.gateway
            if event.state == "awaiting_transfer" and saga.awaiting_since is None:
                saga.awaiting_since = ts
            elif event.state in ("committing", "transfer_failed"):
                saga.transfer_verdict = "commit" if event.state == "committing" else "fail"
            if event.detail is not None:
                saga.detail = event.detail
        elif isinstance(event, RefitFinished):
            saga.result, saga.detail, saga.quarantined = event.result, event.detail, tuple(event.quarantined)
            saga.state = event.result
            if event.result in PUBLISHED:
                self.published[event.weight_version] = seq
            del self.open[event.refit_id]
            self.recent[event.refit_id] = saga
            while len(self.recent) > self._cap:
                self.recent.popitem(last=False)


def _saga(seq: int, ts: float | None, ev: RefitStarted) -> Saga:
    engines = {}
    for e in ev.engines:
        plan = e.get("plan") or {}
        engines[e["worker_id"]] = EngineRun(
            worker_id=e["worker_id"],
            url=e["url"],
            base_url=e["base_url"],
            kind=e["engine"],
            pause_mode=e["pause_mode"],
            phases=tuple(s["phase"] for s in plan.get("steps", [])),
            plan=plan,
            rank_offset=e.get("rank_offset"),
            previous_version=e.get("previous_version"),
            previous_model_path=e.get("previous_model_path"),
            checksums="pending" if plan.get("checksums") == "checked" else plan.get("checksums"),
        )
    # The event's fields copied into the saga (shaped like other folds' copies; each its own fields).
    return Saga(
        refit_id=ev.refit_id,
        started_seq=seq,
        started_ts=ts,
        source=ev.source,
        weight_version=ev.weight_version,
        on_failure=ev.on_failure,
        selector=ev.selector,
        model_path=ev.model_path,
        distributed=dict(ev.distributed) if ev.distributed else None,
        world_size=ev.world_size,
        pause_mode=ev.pause_mode,
        flush=ev.flush,
        force=ev.force,
        transfer_timeout_secs=ev.transfer_timeout_secs,
        engines=engines,
        principal=ev.principal,
        last_seq=seq,
        driver=ev.gateway,
    )


def _step_result(run: EngineRun, phase: str, r: dict[str, Any], rollback: bool) -> None:
    result = r.get("result")
    run.detail = r.get("detail")
    if r.get("version") is not None:
        run.readback = r["version"]
    if r.get("verification") is not None:
        run.verified = r["verification"]
    if r.get("checksums") is not None:
        run.checksums = r["checksums"]
    if result in ("failed", "unknown", "refused") and run.failure is None:
        what = f"rollback {phase}" if rollback else phase
        run.failure = f"{what}: {run.detail}" if run.detail else what
    if result == "ok":
        if rollback:
            run.status = "rolled_back" if phase == "resume" else "running"
            return
        if phase not in run.done:
            run.done.append(phase)
        if run.kept is not None:
            run.status = "refused"  # resumed (or still paused) on the version it kept
        else:
            run.status = "resumed" if phase == "resume" else "ok"
    elif result == "quarantined":
        run.status = "quarantined"
    elif result == "refused":
        run.status, run.kept = "refused", r.get("version")
    elif result == "retry":
        # Cut short by a restart: run it again.
        run.status = "refused" if run.kept is not None else "ok" if run.done else "pending"
    else:
        run.status = "unknown" if result == "unknown" else "failed"

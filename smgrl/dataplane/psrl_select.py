"""PSRL's selection stages that ask outside the gateway: PSManager and the engines' reports.

Following PSRL's fork (``Somoku/smg`` psrl-dev 7169017b, ``worker_selector/psrl.rs`` and
``routing_loop/runtime.rs``), for a request carrying PSRL routing metadata:

- **before each selection pass** (the fork: each time its queue hands the request out, first
  dispatch and loopback continuations alike): ``CheckAbortedRequests([id], remove=true)``; a
  request PSManager reports aborted is answered 400 ``request_aborted`` and not dispatched. A
  failed call dispatches (the fork: "continuing dispatch").
- **the KV gate** (``enable_kv_admission_control`` / ``kv_capacity_threshold``): instances whose
  last ``update_stats`` report shows waiting requests or KV usage at the threshold are held out.
- **stage 4**, unversioned requests only (no version pinned yet): ``CanReserveRequest`` over the
  candidates' versions keeps the reservable ones. None left, or the call failed: the request
  waits and asks again every ``recheck_secs`` (the fork re-queues it).
- **stage 5** with ``psrl_candidate_sort_key=reserve_capability``: ``GetReserveIndicator``
  orders the candidates (lowest first); a failed call makes the request wait, as stage 4.
- **commit**: ``ReserveRolloutInstanceRequests`` for a request without an instance hint,
  ``UpdateRequestInstanceId`` for one with a hint (a loopback, a sticky turn); a refusal or a
  failure answers 503 (the fork answers 500) and the request is not dispatched.

Every call is bounded by ``ps_manager_timeout_secs`` and runs in the request's own task: a slow
or absent PSManager delays that request by at most the bound per call and never the loop.
``UpdateRequestVersionTag``, ``UpdateRequestStatus``, ``CheckAbortedModelVersions`` and
``GetRolloutInstanceModelVersion`` are in the client but, as in the fork, never called.

A request whose id is not an int64 is not PSManager's (PSRL's ids are): it is not asked about.
"""

from __future__ import annotations

import logging
from collections import Counter

from smgrl.core.config import PsrlConfig
from smgrl.core.errors import DataPlaneError
from smgrl.dataplane.affinity import Routed
from smgrl.dataplane.instance_stats import InstanceStatsTable
from smgrl.dataplane.table import Entry
from smgrl.routing import (
    by_indicator,
    kv_gate_on,
    kv_refusal,
    psm_request_id,
    psm_version,
    reservable,
    staged,
    unique_versions,
)
from smgrl.upstream import PSManager, PSManagerError

log = logging.getLogger("smgrl.dataplane")

# Why a request waits that no fleet event announces the end of (asked again periodically).
PSRL_QUIET = frozenset({"ps_manager_refused", "ps_manager_unavailable", "engine_waiting", "kv_full"})


class RequestAbortedByPsManager(DataPlaneError):
    """PSManager reported the request aborted before it was dispatched (the fork's answer)."""

    code, status = "request_aborted", 400


class PsrlCommitRejected(DataPlaneError):
    """PSManager refused to record the selection (ReserveRolloutInstanceRequests /
    UpdateRequestInstanceId answered no)."""

    code, status, retryable = "psrl_selection_commit_rejected", 503, True


class PsrlCommitFailed(DataPlaneError):
    """PSManager could not be asked to record the selection (down, slow, an error status)."""

    code, status, retryable = "psrl_selection_commit_failed", 503, True


def _version(entry: Entry) -> int:
    return psm_version(entry.version)


class PsrlSelection:
    def __init__(self, cfg: PsrlConfig, stats: InstanceStatsTable, psm: PSManager | None) -> None:
        self.cfg = cfg
        self.stats = stats
        self.psm = psm
        self.kv_gate = kv_gate_on(cfg)
        # Stages 4-5 and the commit are the psrl selector's; the abort check is the routing
        # loop's and runs under either strategy (as in the fork).
        self.selects = cfg.strategy == "psrl"
        self.failures = Counter()  # PSManager calls that failed, by method (logged once each)

    @classmethod
    def build(cls, cfg: PsrlConfig, stats: InstanceStatsTable) -> PsrlSelection | None:
        """None when there is nothing to ask (no PSManager, the KV gate off): no cost at all."""
        psm = (
            PSManager(cfg.ps_manager_addr, timeout_secs=cfg.ps_manager_timeout_secs)
            if cfg.ps_manager_addr
            else None
        )
        if psm is None and not kv_gate_on(cfg):
            return None
        return cls(cfg, stats, psm)

    @property
    def recheck_secs(self) -> float:
        return self.cfg.recheck_secs

    def _failed(self, exc: PSManagerError) -> None:
        self.failures[exc.method] += 1
        if self.failures[exc.method] in (1, 100, 10_000):
            log.warning(
                "%s (%d so far); selection falls back as PSRL's fork does", exc, self.failures[exc.method]
            )

    def _rid(self, routed: Routed) -> int | None:
        return psm_request_id(routed.meta.request_id) if self.psm is not None else None

    async def check_aborted(self, routed: Routed) -> None:
        """Raise RequestAbortedByPsManager when PSManager reports the request aborted."""
        rid = self._rid(routed)
        if rid is None:
            return
        assert self.psm is not None
        try:
            (aborted, *_) = await self.psm.check_aborted([rid], remove=True) or [False]
        except PSManagerError as exc:
            self._failed(exc)
            return
        if aborted:
            raise RequestAbortedByPsManager("Request aborted by PS Manager")

    async def admit(self, routed: Routed, narrowed: staged.Narrowed) -> staged.Narrowed:
        """The KV gate, then stages 4 and 5's PSManager answers, over ``narrowed``'s candidates."""
        kept, held = list(narrowed.kept), Counter(narrowed.held)
        if self.kv_gate:
            gated = []
            for entry in kept:
                reason = kv_refusal(self.stats.get(*staged.identity(entry.instance)), self.cfg)
                if reason is None:
                    gated.append(entry)
                else:
                    held[reason] += 1
            kept = gated
        rid = self._rid(routed) if self.selects else None
        if not kept or rid is None:
            return staged.Narrowed(kept, narrowed.stage, held)
        assert self.psm is not None
        is_validate = routed.meta.is_validate
        versioned = routed.floor is not None
        if not versioned:
            versions = unique_versions(kept, _version)
            try:
                results = await self.psm.can_reserve([rid], versions, [is_validate])
            except PSManagerError as exc:
                self._failed(exc)
                held["ps_manager_unavailable"] += len(kept)
                return staged.Narrowed([], narrowed.stage, held)
            room = reservable(kept, _version, versions, results)
            held["ps_manager_refused"] += len(kept) - len(room)
            kept = room
            if not kept:
                return staged.Narrowed([], narrowed.stage, held)
        if self.cfg.candidate_sort_key != "reserve_capability" or len(kept) == 1:
            return staged.Narrowed(kept, narrowed.stage, held)
        versions = unique_versions(kept, _version)
        try:
            indicators = await self.psm.reserve_indicator(rid, versions, is_validate)
        except PSManagerError as exc:
            self._failed(exc)
            held["ps_manager_unavailable"] += len(kept)
            return staged.Narrowed([], narrowed.stage, held)
        by_version = dict(zip(versions, indicators, strict=False))
        order = by_indicator(kept, _version, by_version, versioned)

        def key(e: Entry) -> tuple:
            v = _version(e)
            return (by_version.get(v, 0.0), v)

        ties = sum(1 for e in order if key(e) == key(order[0]))
        return staged.Narrowed(kept, narrowed.stage, held, order=order, ties=ties)

    async def commit(self, routed: Routed, entry: Entry) -> None:
        """Tell PSManager where the request goes; raise when it refuses or cannot be asked."""
        rid = self._rid(routed) if self.selects else None
        if rid is None:
            return
        assert self.psm is not None
        instance = staged.identity(entry.instance)
        is_validate = routed.meta.is_validate
        hinted = routed.loop_hint is not None or routed.meta.hint is not None
        try:
            if hinted:
                ok, message = await self.psm.update_instance(rid, instance, is_validate), ""
                message = message or "update_request_instance_id returned false"
            else:
                ok, message = await self.psm.reserve(instance, rid, _version(entry), is_validate)
        except PSManagerError as exc:
            self._failed(exc)
            raise PsrlCommitFailed(str(exc)) from None
        if not ok:
            raise PsrlCommitRejected(f"PSManager refused the selection: {message}")

    async def aclose(self) -> None:
        if self.psm is not None:
            await self.psm.aclose()

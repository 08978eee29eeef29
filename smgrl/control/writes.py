"""Journal-only control writes: no engine is called, one event records the decision.

    set_engine       engine.version_set / engine.state_set   (POST /v1/rl/.../version|state,
                                                              smgrl/http/routes/rl_writes.py)
    set_dispatch     dataplane.dispatch_set                  (POST /routing_loop/pause|resume)
    set_held         engine.state_set                        (POST /workers/pause|resume)
    set_versions     engine.version_set per version          (POST /workers/update_weight_version,
                                                              smgrl/http/routes/routing_loop.py)

Each event is appended and awaited before the method returns, so the caller's answer, discovery
and routing already reflect the write; a journal that cannot take it is 503
``journal_unavailable`` and nothing changed. The routes parse, authorize and render; the checks
that need the fleet (which worker, which targets, which items are refused) are made here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from journal import JournalWriteError
from smgrl.core import Selector, Worker
from smgrl.core.errors import JournalUnavailable, NoWorkersMatch, WorkerNotFound
from smgrl.events import DispatchSet, EngineStateSet, EngineVersionSet

ENGINE_WRITES = {
    "version": (EngineVersionSet, "weight_version"),
    "state": (EngineStateSet, "control"),
}


class ControlWrites:
    def __init__(self, *, fleet, journal, control) -> None:
        self.fleet = fleet
        self.journal = journal
        self.control = control  # ControlService: its ``targets`` resolves a selector

    async def set_worker(
        self, kind: str, value: str, worker_id: str, principal: str | None, request_id: str | None
    ) -> Worker:
        """``kind`` ("version" or "state") of one worker (404 ``worker_not_found``)."""
        worker = self.fleet.registry.get(worker_id)
        if worker is None or not worker.is_visible:
            raise WorkerNotFound(worker_id)
        await self.set_engine(kind, value, [worker], None, principal, request_id)
        return worker

    async def set_fleet(
        self, kind: str, value: str, selector: Selector, principal: str | None, request_id: str | None
    ) -> list[Worker]:
        """``kind`` of every worker the selector matches (400 ``no_workers_match``)."""
        targets = self.control.targets(selector)
        if not targets:
            raise NoWorkersMatch(selector.source)
        await self.set_engine(kind, value, targets, selector.source, principal, request_id)
        return targets

    async def set_engine(
        self,
        kind: str,
        value: str,
        targets: Sequence[Worker],
        selector: str | None,
        principal: str | None,
        request_id: str | None,
    ) -> None:
        event_class, field = ENGINE_WRITES[kind]
        listed = tuple({"worker_id": w.id, "url": w.url, "base_url": w.base_url} for w in targets)
        event = event_class(
            **{field: value},
            targets=listed,
            selector=selector,
            principal=principal,
            request_id=request_id,
        )
        await self._append("engine", event)

    async def set_dispatch(self, paused: bool, principal: str | None, request_id: str | None) -> bool:
        """Pause or resume the rollout routing loop; whether it changed (no event when not)."""
        if self.fleet.routing.paused == paused:
            return False
        event = DispatchSet(paused=paused, principal=principal, request_id=request_id)
        await self._append("dataplane", event)
        return True

    async def set_held(
        self,
        items: Sequence[tuple[str, set[int] | None]],
        paused: bool,
        principal: str | None,
        request_id: str | None,
    ) -> list[dict[str, Any]]:
        """PSRL's per-instance pause/resume (``[(worker id or URL, DP ranks or None)]``, already
        validated): one result per item, ``paused``/``resumed`` or ``rejected`` with a reason; one
        ``engine.state_set`` for the engines held. No engine is called. smgrl holds out whole
        engines: an item set naming some DP ranks of a replica but not all is rejected."""
        registry = self.fleet.registry
        results: list[dict[str, Any]] = []
        for wid, item_ranks in items:
            result: dict[str, Any] = {
                "status": "paused" if paused else "resumed",
                "worker_id": wid,
                "url": None,
            }
            if item_ranks is not None:
                result["dp_rank"] = sorted(item_ranks)
            results.append(result)
        engines, by_engine = self._by_engine([wid for wid, _ in items], results)
        targets = []
        for base, indexes in by_engine.items():
            size = _dp_size(registry, base)
            named_ranks = [items[i][1] for i in indexes]
            named = None if None in named_ranks else set().union(*named_ranks)
            if named is not None and named != set(range(size)):
                for i in indexes:
                    results[i].update(
                        status="rejected",
                        reason=f"smgrl holds out whole engines: name all {size} DP ranks of the replica, or none",
                    )
                continue
            targets.append(engines[base])
        if targets:
            state = "paused" if paused else "active"
            await self.set_engine("state", state, targets, None, principal, request_id)
        return results

    async def set_versions(
        self, items: Sequence[dict[str, Any]], principal: str | None, request_id: str | None
    ) -> list[dict[str, Any]]:
        """PSRL's per-instance version writes (``[{worker_id, dp_rank?, weight_version}]``,
        already validated): one result per item, ``updated`` or ``rejected`` with a reason; one
        ``engine.version_set`` per version for the engines updated. DP ranks share one version
        (smgrl's table is per engine), so an engine's items must agree and cover all its ranks."""
        registry = self.fleet.registry
        results: list[dict[str, Any]] = []
        for item in items:
            result = {"status": "updated", "worker_id": item["worker_id"], "url": None}
            result["weight_version"] = item["weight_version"]
            if item.get("dp_rank") is not None:
                result["dp_rank"] = item["dp_rank"]
            results.append(result)
        engines, by_engine = self._by_engine([item["worker_id"] for item in items], results)
        writes: dict[str, list[Worker]] = defaultdict(list)
        for base, indexes in by_engine.items():
            versions = {results[i]["weight_version"] for i in indexes}
            ranks = {items[i].get("dp_rank") for i in indexes}
            size = _dp_size(registry, base)
            reason = None
            if len(versions) > 1:
                reason = "all DP ranks of a replica must get one version"
            elif None not in ranks and ranks != set(range(size)):
                reason = f"an update must cover all {size} DP ranks of the replica"
            if reason is not None:
                for i in indexes:
                    results[i].update(status="rejected", reason=reason)
                continue
            writes[versions.pop()].append(engines[base])
        for version, workers in writes.items():
            await self.set_engine("version", version, workers, None, principal, request_id)
        return results

    def _by_engine(
        self, worker_ids: Sequence[str], results: list[dict[str, Any]]
    ) -> tuple[dict[str, Worker], dict[str, list[int]]]:
        """Each PSRL item's worker (named by id or URL): an item without a visible one is
        rejected in ``results``; the others get their engine's URL and are grouped by engine
        (engine URL -> a worker of it, and -> the items' indexes)."""
        registry = self.fleet.registry
        engines: dict[str, Worker] = {}
        by_engine: dict[str, list[int]] = defaultdict(list)
        for index, (wid, result) in enumerate(zip(worker_ids, results, strict=True)):
            worker = registry.get(wid) or registry.get(registry.id_for_url(wid) or "")
            if worker is None or not worker.is_visible:
                result.update(status="rejected", reason="worker not found")
                continue
            result["url"] = worker.base_url
            engines[worker.base_url] = worker
            by_engine[worker.base_url].append(index)
        return engines, by_engine

    async def _append(self, stream: str, event) -> None:
        try:
            await self.journal.append(stream, event)
        except JournalWriteError as exc:
            raise JournalUnavailable(f"the journal cannot record this change: {exc}") from exc


def _dp_size(registry, base_url: str) -> int:
    ranks = {w.dp_rank for w in registry if w.base_url == base_url and w.dp_rank is not None}
    return max(len(ranks), 1)

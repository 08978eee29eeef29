"""The worker registry as a projection of ``worker.*`` journal events.

Nothing mutates the registry directly: the registry service appends an event and then applies it
here (the same code path replay uses at startup), so the in-memory registry and the journal can
never disagree. Workers keep registration order; ``revision`` moves on every change so rendered
views can be cached.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import attrs

from smgrl.core import Worker, strip_rank
from smgrl.events import (
    WorkerDiscovered,
    WorkerHealthChanged,
    WorkerLabelsChanged,
    WorkerRegistered,
    WorkerRemoved,
)
from smgrl.state.records import SnapshotError, exact_record

TYPES = frozenset(
    {
        "worker.registered",
        "worker.discovered",
        "worker.labels_changed",
        "worker.health_changed",
        "worker.removed",
    }
)


_WORKER_FIELDS = frozenset(f.name for f in attrs.fields(Worker))


@attrs.frozen
class RegistrySnapshot:
    """A consistent copy of the registry (``RegistryState.to_snapshot``). Workers are frozen
    values, shared with the live registry; only the containers are copied. ``to_json`` may run
    anywhere (the snapshotter runs it in the writer's thread)."""

    revision: int
    last_seq: int
    workers: list[Worker]  # in registration order
    by_url: dict[str, str]

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "last_seq": self.last_seq,
            "workers": [_worker_json(w) for w in self.workers],
            "by_url": self.by_url,
        }


def _worker_json(w: Worker) -> dict[str, Any]:
    data = attrs.asdict(w, recurse=False)
    data["caller_labels"] = dict(w.caller_labels)
    data["discovered_labels"] = dict(w.discovered_labels)
    return data


class RegistryState:
    def __init__(self) -> None:
        self.workers: dict[str, Worker] = {}
        self._by_url: dict[str, str] = {}
        self.revision = 0
        self.last_seq = 0

    # -- reads -------------------------------------------------------------------------------

    def get(self, worker_id: str) -> Worker | None:
        return self.workers.get(worker_id)

    def id_for_url(self, url: str) -> str | None:
        return self._by_url.get(url)

    def conflict_for(self, url: str) -> Worker | None:
        """The worker a new registration of ``url`` would collide with (same URL, or the base URL
        of a DP group, or a rank URL of a registered base)."""
        wid = self._by_url.get(url) or self._by_url.get(strip_rank(url))
        if wid is None:
            for w in self.workers.values():
                if w.dp_aware and w.base_url == url:
                    return w
            return None
        return self.workers.get(wid)

    def group_members(self, group: str) -> list[Worker]:
        return [w for w in self.workers.values() if w.group == group]

    def __iter__(self) -> Iterator[Worker]:
        return iter(self.workers.values())

    def __len__(self) -> int:
        return len(self.workers)

    # -- the snapshot contract (smgrl.state.snapshot) -----------------------------------------

    def to_snapshot(self) -> RegistrySnapshot:
        return RegistrySnapshot(self.revision, self.last_seq, list(self.workers.values()), dict(self._by_url))

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> RegistryState:
        """The registry a ``RegistrySnapshot.to_json`` describes; SnapshotError (or KeyError,
        TypeError, ValueError) when it does not fit."""
        state = cls()
        for raw in data["workers"]:
            w = Worker(**exact_record(raw, _WORKER_FIELDS, "worker"))
            state.workers[w.id] = w
        by_url = data["by_url"]
        if not isinstance(by_url, dict) or any(wid not in state.workers for wid in by_url.values()):
            raise SnapshotError("registry URL index names unknown workers")
        state._by_url = {str(url): str(wid) for url, wid in by_url.items()}
        state.revision, state.last_seq = int(data["revision"]), int(data["last_seq"])
        return state

    # -- the fold ----------------------------------------------------------------------------

    def apply(self, seq: int, event: object) -> None:
        """Fold one journal record (any type: the registry's events change it, others are skipped,
        as is an UnknownEvent from a newer smgrl)."""
        if not isinstance(event, _EVENTS):
            return
        if isinstance(event, WorkerRegistered):
            _registered(self, seq, event)
        elif isinstance(event, WorkerDiscovered):
            _discovered(self, seq, event)
        elif isinstance(event, WorkerLabelsChanged):
            _labels_changed(self, seq, event)
        elif isinstance(event, WorkerHealthChanged):
            _health_changed(self, seq, event)
        else:
            _removed(self, seq, event)
        self.revision += 1
        self.last_seq = seq

    def _put(self, worker: Worker) -> None:
        old = self.workers.get(worker.id)
        if old is not None and old.url != worker.url:
            self._by_url.pop(old.url, None)
        self.workers[worker.id] = worker
        self._by_url[worker.url] = worker.id

    def _drop(self, worker_id: str) -> None:
        w = self.workers.pop(worker_id, None)
        if w is not None and self._by_url.get(w.url) == worker_id:
            del self._by_url[w.url]


def _registered(state: RegistryState, seq: int, ev: WorkerRegistered) -> None:
    state._put(
        # The event's fields copied into the worker (shaped like other folds' copies; each its own fields).
        Worker(
            id=ev.worker_id,
            url=ev.url,
            base_url=ev.base_url,
            worker_type=ev.worker_type,
            connection_mode=ev.connection_mode,
            runtime=ev.runtime or "unspecified",
            model_id=ev.model_id,
            caller_labels=dict(ev.labels),
            status="pending",
            dp_aware=ev.dp_aware,
            group=ev.worker_id,
            has_api_key=ev.has_api_key,
            bootstrap_port=ev.bootstrap_port,
            source=ev.source,
            registered_seq=seq,
        )
    )


def _discovered(state: RegistryState, seq: int, ev: WorkerDiscovered) -> None:
    root = state.workers.get(ev.worker_id)
    if root is None:
        return
    # Re-discovery replaces any ranks a previous discovery created. Ranks exist only once the root
    # was expanded (it is then rank 0): otherwise skip the scan of every worker, which made each
    # discovery O(workers) and a replay quadratic in registrations.
    if root.dp_rank is not None:
        for w in state.group_members(root.id):
            if w.id != root.id:
                state._drop(w.id)
    runtime, model_id = ev.runtime or root.runtime, root.model_id or ev.model_id
    labels = dict(ev.labels)
    rank_ids = list(ev.dp_rank_ids or ())
    if not rank_ids:
        state._put(
            attrs.evolve(root, runtime=runtime, model_id=model_id, discovered_labels=labels, status="ready")
        )
        return
    size = len(rank_ids)
    for rank, rid in enumerate(rank_ids):
        base = root if rank == 0 else attrs.evolve(root, id=rid, registered_seq=seq)
        state._put(
            attrs.evolve(
                base,
                url=f"{root.base_url}@{rank}",
                dp_rank=rank,
                dp_size=size,
                group=root.id,
                runtime=runtime,
                model_id=model_id,
                discovered_labels=labels,
                status="ready",
            )
        )


def _labels_changed(state: RegistryState, seq: int, ev: WorkerLabelsChanged) -> None:
    w = state.workers.get(ev.worker_id)
    if w is None:
        return
    labels = dict(ev.labels) if ev.mode == "replace" else {**w.caller_labels, **ev.labels}
    state._put(attrs.evolve(w, caller_labels=labels))


def _health_changed(state: RegistryState, seq: int, ev: WorkerHealthChanged) -> None:
    w = state.workers.get(ev.worker_id)
    if w is None:
        return
    # One engine, one health: a DP group's ranks share the engine's status (a worker that was
    # never expanded into ranks is its own group: no scan).
    for member in state.group_members(w.group) if w.dp_rank is not None else [w]:
        state._put(attrs.evolve(member, status=ev.health))


def _removed(state: RegistryState, seq: int, ev: WorkerRemoved) -> None:
    w = state.workers.get(ev.worker_id)
    if w is None:
        return
    # Ranks share one engine address: removing any of them removes the engine.
    for member in state.group_members(w.group):
        state._drop(member.id)


# The registry's events; TYPES names the same ones.
_EVENTS = (WorkerRegistered, WorkerDiscovered, WorkerLabelsChanged, WorkerHealthChanged, WorkerRemoved)

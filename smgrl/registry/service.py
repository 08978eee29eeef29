"""Registration jobs: the only writer of ``worker.*`` events.

``register`` appends ``worker.registered`` (the API key goes to the journal's secrets table in the
same transaction, never into the event) and returns at once with the new id, as SMG's 202 does;
a background job then probes the engine until it answers, appending ``worker.probe_failed`` with
a growing backoff, and finally ``worker.discovered``. Pending workers are invisible to ``/v1/rl``.
After a restart, replay brings pending workers back and their jobs start again.

gRPC/ZMQ workers (TokenSpeed) are discovered through their control app, so changing the
``rl.control_url`` a gRPC/ZMQ worker resolves to (``PATCH``/``PUT /workers/{id}``) runs
discovery again against the new endpoint.
"""

from __future__ import annotations

import logging

import attrs
import trio

from journal import Expect, JournalConflict, JournalWriteError
from smgrl.core import (
    Worker,
    connection_mode_for,
    control_url,
    new_worker_id,
    origin_key,
    parse_size,
    redact_url,
    strip_rank,
)
from smgrl.core.config import Config
from smgrl.core.errors import WorkerApiError
from smgrl.events import (
    WorkerDiscovered,
    WorkerHealthChanged,
    WorkerLabelsChanged,
    WorkerProbeFailed,
    WorkerRegistered,
    WorkerRemoved,
)
from smgrl.registry.grpc_probe import TokenizerCache, discover_grpc
from smgrl.registry.keys import KeyRing
from smgrl.registry.probe import ProbeFailed, ReachesSelf, probe_control_app, probe_http
from smgrl.telemetry.logs import event as log_event
from smgrl.upstream import PoolSet

log = logging.getLogger("smgrl.registry")

PROBE_TIMEOUT_SECS = 5.0
# What a registration's URL check depends on (another process's registration or removal).
_REGISTRY_TYPES = ("worker.registered", "worker.removed", "worker.discovered")
_DECIDE_ROUNDS = 8


@attrs.frozen
class Registration:
    url: str
    worker_type: str = "regular"
    labels: dict[str, str] = attrs.field(factory=dict)
    model_id: str | None = None
    runtime: str | None = None
    api_key: str | None = attrs.field(default=None, repr=False)
    bootstrap_port: int | None = None
    # A worker id the caller chose (PSRL: its replica index); None: the gateway makes one.
    worker_id: str | None = None


class RegistryService:
    def __init__(
        self, *, fleet, journal, keys: KeyRing, pools: PoolSet, cfg: Config, instance_id: str | None = None
    ) -> None:
        # Attribute assignments, shaped like the other services' constructors: nothing to share.
        self.fleet = fleet
        self.instance_id = instance_id
        self.journal = journal
        self.keys = keys
        self.pools = pools
        self.cfg = cfg
        # Registry writes are rare (registration, relabel, removal); serialising them makes the
        # duplicate-URL check and the append one atomic step.
        self._lock = trio.Lock()
        self._nursery: trio.Nursery | None = None
        self._jobs: dict[str, trio.CancelScope] = {}
        sessions = getattr(cfg, "sessions", None)
        self.tokenizers = TokenizerCache(fixed_path=getattr(sessions, "tokenizer_path", None))

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        # This nursery owns every discovery job; it lives as long as the gateway's root nursery.
        # Several processes (smgrl/cluster/sharing.py): this runs only while the process holds the
        # discovery lease; once cancelled no job starts here until it runs again.
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                for w in list(self.fleet.registry):
                    if w.status == "pending" and w.group == w.id:
                        self._start_job(w.id)
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self._jobs.clear()

    # -- writes --------------------------------------------------------------------------------

    async def register(self, reg: Registration, source: str) -> Worker:
        async with self._lock:
            # Several processes on one journal: the URL check is decided on the projection's
            # position and appended only if no registry event came since (any process); on a
            # conflict, catch up and decide again (bounded: each round another process won).
            for _ in range(_DECIDE_ROUNDS):
                position = getattr(self.journal, "position", None)
                try:
                    return await self._register(reg, source, position)
                except JournalConflict:
                    await self.journal.catch_up()
            raise WorkerApiError(
                503, "JOURNAL_UNAVAILABLE", "the worker registry kept changing while deciding; retry"
            )

    async def _register(self, reg: Registration, source: str, position: int | None) -> Worker:
        existing = self.fleet.registry.conflict_for(reg.url)
        if existing is not None:
            raise WorkerApiError(
                409,
                "WORKER_ALREADY_EXISTS",
                f"Worker already exists at URL '{reg.url}' with ID {existing.id}. Use PUT "
                f"/workers/{existing.id} to replace or PATCH /workers/{existing.id} to update.",
            )
        if reg.worker_id is not None and self.fleet.registry.get(reg.worker_id) is not None:
            raise WorkerApiError(
                409,
                "WORKER_ALREADY_EXISTS",
                f"Worker ID '{reg.worker_id}' is already registered. Use PUT /workers/{reg.worker_id} to "
                f"replace or PATCH /workers/{reg.worker_id} to update.",
            )
        worker_id = reg.worker_id or new_worker_id()
        event = WorkerRegistered(
            worker_id=worker_id,
            url=reg.url,
            base_url=strip_rank(reg.url),
            source=source,
            worker_type=reg.worker_type,
            connection_mode=connection_mode_for(reg.url),
            labels=dict(reg.labels),
            model_id=reg.model_id,
            runtime=reg.runtime,
            has_api_key=bool(reg.api_key),
            bootstrap_port=reg.bootstrap_port,
            dp_aware=self.cfg.dp_aware,
        )
        secrets = {worker_id: reg.api_key} if reg.api_key else None
        # The key ring and the discovery job follow from the commit itself (``committed``):
        # a caller cancelled while this waits still gets both once the event is written.
        stream = f"worker:{worker_id}"
        if position is None:  # a lone gateway: the lock above decides
            recorded = await self.journal.append(stream, event, secrets=secrets)
        else:
            expect = Expect(after=position, types=_REGISTRY_TYPES)
            (recorded,) = await self.journal.append_if(expect, [(stream, event, secrets)])
        return self.fleet.registry.get(recorded.event.worker_id)

    def committed(self, records) -> None:
        """Called from the journal's commit path (after the projections applied the batch):
        start discovery for new registrations, stop it for removed workers."""
        for rec in records:
            kind = getattr(rec.event, "TYPE", None)
            if kind == "worker.registered":
                self._start_job(rec.event.worker_id)
            elif kind == "worker.removed":
                for worker_id in [w for w in self._jobs if self.fleet.registry.get(w) is None]:
                    self._jobs.pop(worker_id).cancel()

    async def set_labels(self, worker_id: str, labels: dict[str, str], mode: str) -> None:
        async with self._lock:
            before = self.fleet.registry.get(worker_id)
            pending = await self.journal.enqueue(
                f"worker:{worker_id}",
                WorkerLabelsChanged(worker_id=worker_id, labels=labels, mode=mode),
            )
            # Enqueued, so it will be written: shielded, so that what follows from it (a new
            # discovery when the control endpoint moved) runs even if the caller goes away. The
            # wait is bounded by --journal-lock-wait-secs.
            with trio.CancelScope(shield=True):
                await pending.wait()
            after = self.fleet.registry.get(worker_id)
        if (
            before is not None
            and after is not None
            and after.connection_mode != "http"
            and after.group == after.id
            and control_url(after) != control_url(before)
        ):
            # A new control endpoint: what it advertises (rl.* capabilities, tp_size, version)
            # replaces what the old one did.
            self._start_job(after.id)

    async def remove(self, worker_id: str, reason: str) -> None:
        async with self._lock:
            worker = self.fleet.registry.get(worker_id)
            if worker is None:
                return
            group = worker.group
            members = self.fleet.registry.group_members(group)
            bases = {w.base_url for w in members}
            # gRPC/ZMQ workers are reached through their control app's origin, not their URL.
            controls = {control_url(w) for w in members if w.connection_mode != "http"} - {None}
            # The discovery job and the key go with the commit (``committed``, the key ring's
            # on_secrets): if this append fails, the worker and its job stay as they were.
            pending = await self.journal.enqueue(
                f"worker:{group}",
                WorkerRemoved(worker_id=worker_id, reason=reason),
                secrets={group: None},
            )
            # Shielded once enqueued: the pools of a removed engine are closed even if the caller
            # goes away (bounded by --journal-lock-wait-secs and one close per pool).
            with trio.CancelScope(shield=True):
                await pending.wait()
        with trio.CancelScope(shield=True):
            for base in bases:
                if not any(w.base_url == base for w in self.fleet.registry):
                    await self.pools.discard(base)
            for origin in controls:
                if not any(_same_origin(control_url(w), origin) for w in self.fleet.registry):
                    await self.pools.discard(origin)

    async def set_health(self, worker: Worker, health: str, reason: str) -> None:
        await self.journal.append(
            f"worker:{worker.group}",
            WorkerHealthChanged(worker_id=worker.group, health=health, reason=reason),
        )

    # -- discovery jobs ------------------------------------------------------------------------

    def _start_job(self, worker_id: str) -> None:
        if self._nursery is None or worker_id in self._jobs:
            return
        scope = trio.CancelScope()
        self._jobs[worker_id] = scope
        self._nursery.start_soon(self._job, worker_id, scope)

    async def _job(self, worker_id: str, scope: trio.CancelScope) -> None:
        # Cancelled by remove(); otherwise runs until the engine answers (forever if it never
        # does: a pending registration keeps retrying, at most every backoff cap seconds).
        with scope:
            try:
                delay = self.cfg.registration_backoff_initial_secs
                while True:
                    try:
                        await self._discover(worker_id)
                        return
                    except JournalWriteError as exc:
                        # The journal cannot take the probe's record (disk full, read-only file):
                        # retry later rather than let the error tear down the registry's nursery,
                        # and the gateway with it (tests/e2e/test_faults.py).
                        log_event(
                            log,
                            "journal unavailable during discovery; retrying",
                            logging.WARNING,
                            worker_id=worker_id,
                            error=str(exc),
                            next_retry_s=delay,
                        )
                        await trio.sleep(delay)
                        delay = min(delay * 2, self.cfg.registration_backoff_max_secs)
            finally:
                if self._jobs.get(worker_id) is scope:
                    del self._jobs[worker_id]

    async def _discover(self, worker_id: str) -> None:
        delay = self.cfg.registration_backoff_initial_secs
        attempt = 0
        while True:
            worker = self.fleet.registry.get(worker_id)
            if worker is None:
                return
            attempt += 1
            try:
                found = await self._probe(worker)
            except ReachesSelf as exc:
                await self.refuse_self(worker, str(exc))
                return
            except ProbeFailed as exc:
                await self.journal.append(
                    f"worker:{worker_id}",
                    WorkerProbeFailed(
                        worker_id=worker_id,
                        attempt=attempt,
                        error=str(exc),
                        next_retry_s=delay,
                    ),
                )
                if attempt == 1:
                    log_event(
                        log,
                        "engine not reachable yet; retrying in the background",
                        logging.WARNING,
                        worker_id=worker_id,
                        url=worker.url,
                        error=str(exc),
                    )
                await trio.sleep(delay)
                delay = min(delay * 2, self.cfg.registration_backoff_max_secs)
                continue
            rank_ids: list[str] = []
            # The engine's own DP size wins; a registration's ``dp_size`` label (PSRL's replicas
            # carry one) defines the ranks of an engine that reports none (vLLM). A gRPC worker's
            # ranks are its registration's label first (as PSRL sends it), else what it reported.
            dp_size = found.dp_size or parse_size(worker.caller_labels.get("dp_size"))
            if worker.connection_mode == "grpc" and worker.caller_labels.get("dp_size"):
                dp_size = parse_size(worker.caller_labels["dp_size"]) or dp_size
            if worker.dp_aware and dp_size and dp_size > 1 and strip_rank(worker.url) == worker.url:
                rank_ids = [worker_id] + [new_worker_id() for _ in range(dp_size - 1)]
            async with self._lock:
                if self.fleet.registry.get(worker_id) is None:
                    return  # removed while we probed
                await self.journal.append(
                    f"worker:{worker_id}",
                    WorkerDiscovered(
                        worker_id=worker_id,
                        runtime=found.runtime,
                        labels=found.labels,
                        model_id=found.model_id,
                        dp_rank_ids=rank_ids,
                    ),
                )
            log_event(
                log,
                "worker registered",
                worker_id=worker_id,
                url=worker.url,
                engine=found.runtime,
                ranks=max(1, len(rank_ids)),
            )
            return

    async def refuse_self(self, worker: Worker, detail: str) -> None:
        """The URL leads back to this gateway: the registration is removed (from discovery: before
        it was ever discovered, so it never served traffic), with the reason journaled and logged."""
        reason = (
            f"refused: {redact_url(worker.url)} reaches this gateway itself ({detail}); "
            "register the engines' own URLs"
        )
        log_event(
            log,
            "worker URL reaches this gateway; registration refused",
            logging.ERROR,
            worker_id=worker.id,
            url=worker.url,
            detail=detail,
        )
        # From discovery, our own job is the one running: remove() would cancel it mid-append, so
        # drop it first (a ready worker found by the health checker has no job).
        self._jobs.pop(worker.group, None)
        await self.remove(worker.id, reason)

    async def _probe(self, worker: Worker):
        key = self.keys.get(worker.group)
        if worker.connection_mode == "http":
            return await probe_http(
                self.pools, worker.base_url, key, PROBE_TIMEOUT_SECS, worker.runtime, self.instance_id
            )
        if worker.connection_mode == "grpc":
            return await discover_grpc(self.pools, worker, key, PROBE_TIMEOUT_SECS, self.tokenizers)
        return await probe_control_app(
            self.pools,
            worker.url,
            worker.labels,
            worker.runtime,
            key,
            PROBE_TIMEOUT_SECS,
            worker.connection_mode,
        )


def _same_origin(url: str | None, other: str) -> bool:
    return url is not None and origin_key(url) == origin_key(other)

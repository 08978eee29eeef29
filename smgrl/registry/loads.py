"""The load monitor: each engine's last ``/v1/loads`` sample, shown as ``engine_load`` in
``GET /workers[/{id}]`` rows (SMG 1.13.0's ``WorkerMonitor``, docs/deviations.md).

As in SMG, polling is per group of workers (model id, worker type, connection mode): a group's
loop starts when its first worker is discovered, polls at once and then every
``--load-monitor-interval`` seconds (default 10), each tick reading every ``ready`` HTTP worker of
the group concurrently (``GET /v1/loads?include=core,disagg,queues,memory``, 5 s timeout, the
worker's key). A worker that becomes ready in a group already polling is read at once (SMG reads
the workers it starts with at once, a later one at its group's next tick). A tick replaces the
group's samples: a worker whose read failed this tick, that is no longer ready, or that was
removed shows no ``engine_load`` (never a stale one). An engine that answers 404/405/501 (or a 2xx
that is not a load response) is not asked again; it and any engine whose read failed are read from
``/metrics`` (SGLang's or vLLM's gauges) instead. An answer too large to keep (over 1 MiB or 1024
ranks, ``core.engine_load.MAX_*``; SMG keeps any) is a failed read, asked again at the next tick.
DP-aware rank rows never get one (SMG 1.13.0 shows none on them). gRPC workers whose wire has
``GetLoads`` (SGLang, vLLM upstream, TokenSpeed; not PSRL's fork) are read with it
(``grpc_probe.read_loads``, the same parse as the JSON it mirrors); ZMQ workers are not polled.

``--disable-load-monitoring`` turns polling off only when nothing else needs the data, SMG's
gate: the policy is not load-aware (``cache_aware``, ``power_of_two`` and ``least_load`` are)
and worker overload protection is off (``--disable-worker-overload-protection``; smgrl has no
overload protection, the flag only completes this gate).

Samples live in this process's memory and are never journaled (a sample every 10 s per engine
would grow the journal without bound and is stale at once): with ``launch --workers N`` every
process polls for the rows it serves, as N SMG replicas would (docs/scale-out.md).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import trio

from smgrl.core.engine_load import (
    ABSENT_STATUSES,
    LOADS_PATH,
    LoadsTooLarge,
    NotALoadResponse,
    loads_summary,
    metrics_load,
    parse_loads,
    rfc3339_now,
)
from smgrl.registry.grpc_probe import polls_loads, read_loads
from smgrl.registry.probe import ProbeFailed, ReachesSelf, _get

log = logging.getLogger("smgrl.loads")

LOAD_AWARE_POLICIES = frozenset({"cache_aware", "power_of_two", "least_load"})
READ_TIMEOUT_SECS = 5.0  # SMG's REQUEST_TIMEOUT for a load read
# An answer above this is parsed in a worker thread: a 3 MB /metrics took ~290 ms of the event
# loop per tick (every request waited); below it the thread hop costs more than the parse.
THREAD_PARSE_BYTES = 64 * 1024


async def _parse(fn, *args):
    """``fn(*args)`` on the loop for a small answer, in a worker thread for a large one. The
    parsers are pure: a cancelled read abandons the thread's result (abandon_on_cancel=True)."""
    if len(args[-1]) <= THREAD_PARSE_BYTES:
        return fn(*args)
    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


def monitoring_enabled(cfg) -> bool:
    """SMG's gate: on by default; ``--disable-load-monitoring`` switches it off only when neither
    the routing policy nor overload protection needs the samples."""
    if not cfg.disable_load_monitoring:
        return True
    return cfg.policy in LOAD_AWARE_POLICIES or not cfg.disable_worker_overload_protection


def group_key(worker) -> tuple[str, str, str]:
    return (worker.effective_model_id, worker.worker_type, worker.connection_mode)


class LoadMonitor:
    def __init__(self, *, fleet, pools, keys, interval_secs: float, instance_id: str | None = None) -> None:
        self.fleet = fleet
        self.pools = pools
        self.keys = keys
        self.interval_secs = interval_secs
        self.instance_id = instance_id
        self._samples: dict[str, dict] = {}  # worker id -> its engine_load
        self._no_loads_route: set[str] = set()  # base URLs that answered "no /v1/loads"
        self._changed = trio.Event()

    def sample(self, worker_id: str) -> dict | None:
        return self._samples.get(worker_id)

    def summary(self, version: str, now_ns: int) -> dict:
        """``GET /get_loads``: the samples held now, in registry order (SMG answers from its
        monitor's samples too; no engine is called)."""
        samples = [(w.url, w.worker_type, s) for w in self.fleet.registry if (s := self._samples.get(w.id))]
        return loads_summary(samples, rfc3339_now(now_ns), version)

    # -- the duty ----------------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Start a loop per group as groups appear; end a group's loop once it is empty."""
        self.fleet.subscribe(self._wake)
        try:
            # One nursery holds the group loops: cancelling the monitor (shutdown, or the inner
            # nursery of serve()) ends every loop, and a loop's reads with it.
            async with trio.open_nursery() as nursery:
                loops: dict[tuple, trio.CancelScope] = {}
                known: set[str] = set()  # ready workers at the last reconcile
                seen = None
                task_status.started()
                while True:
                    self._changed = trio.Event()
                    # Woken by every commit (audit counts, control outcomes...): only a registry
                    # change (a worker added, removed, discovered, or its health) is work here.
                    if self.fleet.registry.revision == seen:
                        await self._changed.wait()
                        continue
                    seen = self.fleet.registry.revision
                    groups = {group_key(w) for w in self.fleet.registry if w.status != "pending"}
                    # A worker that became ready in a group already polling is read at once,
                    # not at the group's next tick (SMG reads the workers it starts with at
                    # once too; one added later waits for its group's tick there).
                    ready = {w.id: w for w in self.fleet.registry if _polled(w)}
                    for worker_id in ready.keys() - known:
                        if group_key(ready[worker_id]) in loops:
                            nursery.start_soon(self._read_one, ready[worker_id])
                    known = set(ready)
                    for key in groups - loops.keys():
                        loops[key] = await nursery.start(self._group_loop, key)
                    for key in loops.keys() - groups:
                        loops.pop(key).cancel()
                    self._evict()
                    await self._changed.wait()
        finally:
            self.fleet.unsubscribe(self._wake)

    def _wake(self) -> None:
        # Called from the journal's commit path (FleetState.notify): only set an event.
        self._changed.set()

    def _evict(self) -> None:
        """A removed worker, or one no longer ready, has no sample (SMG's StatusChanged rule)."""
        ready = {w.id for w in self.fleet.registry if w.status == "ready"}
        for worker_id in [i for i in self._samples if i not in ready]:
            del self._samples[worker_id]

    async def _group_loop(self, key: tuple, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.CancelScope() as scope:
            task_status.started(scope)
            while True:
                await self.poll_group(key)
                await trio.sleep(self.interval_secs)

    # -- one tick ----------------------------------------------------------------------------

    def members(self, key: tuple) -> list:
        return [w for w in self.fleet.registry if w.status != "pending" and group_key(w) == key]

    async def poll_group(self, key: tuple) -> None:
        """Read every ready member once (concurrently; the tick ends when all are read or timed
        out), then replace the group's samples with what arrived."""
        members = self.members(key)
        fresh: dict[str, dict] = {}
        polled = [w for w in members if _polled(w)]
        # A nursery local to the tick: a slow engine costs at most the read timeout, and a tick
        # never overlaps the group's next one.
        async with trio.open_nursery() as nursery:
            for worker in polled:
                nursery.start_soon(self._read_into, fresh, worker)
        self._replace(members, fresh)

    def _replace(self, members: Iterable, fresh: dict[str, dict]) -> None:
        for w in members:
            self._samples.pop(w.id, None)
        self._samples.update(fresh)
        self._evict()  # a worker that left ready or was removed during the reads

    async def _read_one(self, worker) -> None:
        sample = await self.read(worker)
        if sample is not None:
            self._samples[worker.id] = sample
            self._evict()  # it may have left ready (or been removed) during the read

    async def _read_into(self, out: dict, worker) -> None:
        sample = await self.read(worker)
        if sample is not None:
            out[worker.id] = sample

    async def read(self, worker) -> dict | None:
        """``/v1/loads`` (unless the engine has none), else ``/metrics``; ``None`` if neither.
        A gRPC worker: ``GetLoads``."""
        if worker.connection_mode == "grpc":
            data = await read_loads(worker, READ_TIMEOUT_SECS)
            try:
                return None if data is None else await _parse(parse_loads, data)
            except (NotALoadResponse, LoadsTooLarge):
                return None
        key = self.keys.get(worker.group)
        if worker.base_url not in self._no_loads_route:
            try:
                status, data = await _get(
                    self.pools, worker.base_url, LOADS_PATH, key, READ_TIMEOUT_SECS, self.instance_id
                )
            except (ProbeFailed, ReachesSelf):
                status, data = None, b""
            if status is not None and 200 <= status < 300:
                try:
                    sample = await _parse(parse_loads, data)
                except NotALoadResponse:
                    self._no_loads_route.add(worker.base_url)
                except LoadsTooLarge:
                    pass  # a failed read (this tick: /metrics), asked again at the next one
                else:
                    if sample is not None:
                        return sample
            elif status in ABSENT_STATUSES:
                self._no_loads_route.add(worker.base_url)
        try:
            status, data = await _get(
                self.pools, worker.base_url, "/metrics", key, READ_TIMEOUT_SECS, self.instance_id
            )
        except (ProbeFailed, ReachesSelf):
            return None
        if not 200 <= status < 300:
            return None
        return await _parse(_metrics_load, worker.engine, data)


def _metrics_load(engine: str, data: bytes) -> dict | None:
    return metrics_load(engine, data.decode("utf-8", "replace"))


def _polled(worker) -> bool:
    # Ready HTTP workers (and gRPC ones with GetLoads); DP-aware ranks share one engine address
    # and show no sample in SMG.
    if worker.status != "ready" or worker.dp_aware:
        return False
    return worker.connection_mode == "http" or polls_loads(worker)

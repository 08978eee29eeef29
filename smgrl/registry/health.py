"""The periodic health checker (off with ``--disable-health-check``).

One probe per engine address per interval, SMG's thresholds: ``--health-failure-threshold``
consecutive failures make a ready engine ``not_ready``, ``--health-success-threshold`` successes
bring it back. Only transitions are journaled.

Each round also reads the startup identity of the engines whose kind reports one (SGLang
``startup_time`` in ``/server_info``, TokenSpeed ``start_time`` in its control app's
``/get_server_info``; ``smgrl.core.identity``): a changed one means the engine restarted, and the
recovered-engine rule holds it out of routing (``smgrl.refit.recovered``). gRPC/ZMQ workers are
not health-probed (they have no HTTP data URL) but their identity is read from the control app.

An engine the journal knows to be paused, asleep or in an unknown state is NOT probed: SGLang's
``/health`` runs a one-token generation that blocks while generation is paused and answers 503
after 20 s, and a refit must never get an engine declared dead.
"""

from __future__ import annotations

import logging

import attrs
import trio

from journal import JournalWriteError
from smgrl.core import collapse, control_url
from smgrl.core.config import HealthConfig
from smgrl.core.identity import identity_route
from smgrl.refit import STREAM, hold_recovered, identity_events
from smgrl.registry.probe import ProbeFailed, ReachesSelf, _get, _get_json
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.health")

SKIP_CONTROL_STATES = frozenset({"paused", "asleep", "unknown"})


@attrs.define
class _Streak:
    failures: int = 0
    successes: int = 0


class HealthChecker:
    def __init__(self, *, fleet, registry, pools, keys, cfg: HealthConfig) -> None:
        self.fleet = fleet
        self.registry = registry
        self.pools = pools
        self.keys = keys
        self.cfg = cfg
        self._streaks: dict[str, _Streak] = {}

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.cfg.interval_secs)
            await self.check_once()

    def candidates(self, mode: str = "http"):
        """Engines to check this round: ready or not (``http``: health-probed), or, for
        ``control``, gRPC/ZMQ workers with a control app whose kind reports an identity."""
        facts = self.fleet.facts()
        for group in collapse(self.fleet.registry):
            w = group.representative
            if w.status not in ("ready", "not_ready"):
                continue
            if (w.connection_mode == "http") != (mode == "http"):
                continue
            if mode != "http" and (identity_route(w.engine) is None or control_url(w) is None):
                continue
            state = facts.get(w.base_url)
            if state is not None and state.control in SKIP_CONTROL_STATES:
                continue
            yield w

    async def check_once(self) -> None:
        # Probes run concurrently; the nursery is local to this round, so a round never overlaps
        # the next one and a slow engine costs at most the probe timeout.
        async with trio.open_nursery() as nursery:
            for worker in list(self.candidates()):
                nursery.start_soon(self._check, worker)
            for worker in list(self.candidates("control")):
                nursery.start_soon(self._guard, self._identity, worker, control_url(worker))

    async def _check(self, worker) -> None:
        ok = False
        try:
            status, _ = await _get(
                self.pools,
                worker.base_url,
                self.cfg.endpoint,
                self.keys.get(worker.group),
                self.cfg.timeout_secs,
                self.registry.instance_id,
            )
            ok = 200 <= status < 300
        except ProbeFailed:
            ok = False
        except ReachesSelf as exc:
            # A worker that leads back to this gateway (registered before discovery checked, or
            # its address now answers for this gateway): out of the registry before it loops.
            try:
                await self.registry.refuse_self(worker, str(exc))
            except JournalWriteError:
                pass  # the next round tries again
            return
        streak = self._streaks.setdefault(worker.group, _Streak())
        await self._guard(self._record, worker, ok, streak)
        if ok and identity_route(worker.engine) is not None:
            await self._guard(self._identity, worker, worker.base_url)

    async def _guard(self, step, worker, *args) -> None:
        try:
            await step(worker, *args)
        except JournalWriteError as exc:
            # The journal cannot take the change (disk full, read-only file): the worker keeps its
            # state and the next round tries again; the checker must not take the gateway down.
            log_event(
                log,
                "journal unavailable; health change not recorded",
                logging.WARNING,
                worker_id=worker.id,
                error=str(exc),
            )

    async def _identity(self, worker, base: str) -> None:
        """Read the engine's startup identity; journal it when new, and hold the engine out of
        routing when it changed (it restarted). An engine that does not answer is the health
        probe's business, not this read's."""
        paths, _ = identity_route(worker.engine)  # type: ignore[misc]
        try:
            info = await _get_json(
                self.pools, base, list(paths), self.keys.get(worker.group), self.cfg.timeout_secs
            )
        except ProbeFailed:
            return
        events = identity_events(worker, info, self.fleet.sagas)
        if not events:
            return
        await self.registry.journal.append_many([(STREAM, e) for e in events])
        if len(events) > 1:
            log_event(
                log,
                "engine restarted; held out of routing until refitted, confirmed or released",
                logging.WARNING,
                worker_id=worker.id,
                url=worker.url,
                identity=events[0].identity,
            )

    async def _record(self, worker, ok: bool, streak) -> None:
        if ok:
            streak.successes += 1
            streak.failures = 0
            if worker.status == "not_ready" and streak.successes >= self.cfg.success_threshold:
                await self.registry.set_health(worker, "ready", "health check passed")
                # Unreachable for at least one interval: held out until refitted or confirmed.
                await hold_recovered(self.registry.journal, worker, self.cfg.interval_secs)
                log_event(log, "engine healthy again", worker_id=worker.id, url=worker.url)
        else:
            streak.failures += 1
            streak.successes = 0
            if worker.status == "ready" and streak.failures >= self.cfg.failure_threshold:
                await self.registry.set_health(worker, "not_ready", f"{streak.failures} failed health checks")
                log_event(log, "engine unhealthy", logging.WARNING, worker_id=worker.id, url=worker.url)

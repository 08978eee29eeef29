"""The periodic health checker (off with ``--disable-health-check``).

One probe per engine address per interval, SMG's thresholds: ``--health-failure-threshold``
consecutive failures make a ready engine ``not_ready``, ``--health-success-threshold`` successes
bring it back. Only transitions are journaled.

An engine the journal knows to be paused, asleep or in an unknown state is NOT probed: SGLang's
``/health`` runs a one-token generation that blocks while generation is paused and answers 503
after 20 s, and a refit must never get an engine declared dead.
"""

from __future__ import annotations

import logging

import attrs
import trio

from journal import JournalWriteError
from smgrl.config import HealthConfig
from smgrl.core.view import collapse
from smgrl.logs import event as log_event
from smgrl.refit.recovered import hold_recovered
from smgrl.registry.probe import ProbeFailed, ReachesSelf, _get

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

    def candidates(self):
        facts = self.fleet.facts()
        for group in collapse(self.fleet.registry):
            w = group.representative
            if w.connection_mode != "http" or w.status not in ("ready", "not_ready"):
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
        try:
            await self._record(worker, ok, streak)
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

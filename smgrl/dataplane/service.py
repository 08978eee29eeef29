"""The data plane's I/O shell: pick an eligible instance, forward, account.

``DataPlane`` owns what rollout routing remembers at run time: the routing table (rebuilt when
the fleet's revision moves), the policy's state (round-robin counter, cache-aware trees), the
in-flight load per instance, the per-engine circuit breakers and the admission limiter. It
never writes the journal and never touches the control plane's state: control calls go through
``smgrl.control`` and never move a load counter or a breaker (``tests/api/test_dataplane_resilience.py``).

Waiting for an eligible engine is event-driven: the fleet calls ``_fleet_changed`` from the
journal writer's commit hook (``FleetState.subscribe``), which sets the current ``trio.Event``
and replaces it, so every waiting request re-checks the table once per change, never on a timer.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import attrs
import trio

from smgrl.config import Config
from smgrl.core.version import Version
from smgrl.dataplane.errors import (
    ModelNotFound,
    ModelRequired,
    NoAvailableWorkers,
    NoEligibleWorkers,
    RequestTimeout,
    UpstreamUnreachable,
)
from smgrl.dataplane.request import RolloutRequest
from smgrl.dataplane.table import Entry, ModelEntries, Table, build
from smgrl.registry.keys import KeyRing
from smgrl.routing.policy import CacheAwareConfig, make_policy, sticky
from smgrl.routing.version_policy import ANY, VersionPolicy, floor_reason
from smgrl.state.fleet import FleetState
from smgrl.upstream import PoolSet, Response, UpstreamError

# Request headers forwarded to engines (everything else, the caller's authorization included,
# stays at the gateway; the engine gets the worker's own key).
FORWARDED = (b"content-type", b"accept", b"x-request-id", b"traceparent", b"tracestate")
# What an engine's answer may read before the gateway gives up (a buffered body is held whole).
MAX_RESPONSE_BYTES = 256 * 1024 * 1024


@attrs.define(eq=False)
class Dispatch:
    """One request's way to an instance: what was picked and how the engine answered."""

    entry: Entry
    response: Response
    body: bytes | None = None  # buffered answers only

    @property
    def instance(self):
        return self.entry.instance


class DataPlane:
    def __init__(
        self,
        *,
        cfg: Config,
        fleet: FleetState,
        pools: PoolSet,
        keys: KeyRing,
        rng: random.Random | None = None,
    ) -> None:
        self.cfg = cfg
        self.fleet = fleet
        self.pools = pools
        self.keys = keys
        self.rng = rng or random.Random()
        dp = cfg.dataplane
        self.policy = make_policy(
            cfg.policy,
            self.rng,
            CacheAwareConfig(
                cache_threshold=dp.cache_threshold,
                balance_abs_threshold=dp.balance_abs_threshold,
                balance_rel_threshold=dp.balance_rel_threshold,
                max_tree_size=dp.max_tree_size,
            ),
        )
        # --rl-version-policy (with --enable-rl only: without it nothing is version-filtered).
        self.version_policy = VersionPolicy.parse(cfg.rl.version_policy) if cfg.rl.enabled else ANY
        self.loads: dict[str, int] = {}
        self.waiting = 0  # requests waiting in the gateway for an eligible engine
        self._table: Table | None = None
        self._changed = trio.Event()
        fleet.subscribe(self._fleet_changed)

    def close(self) -> None:
        self.fleet.unsubscribe(self._fleet_changed)

    # -- the routing table ---------------------------------------------------------------------

    def _fleet_changed(self) -> None:
        # Runs in the journal writer's task, synchronously: wake every waiter, then start a new
        # generation of the event for the next wait.
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def table(self) -> Table:
        fleet = self.fleet
        revision = fleet.revision
        table = self._table
        if table is not None and table.revision == revision:
            return table
        new = build(revision, fleet.registry, fleet.facts(), self.cfg.dp_aware)
        if table is not None:
            # The cache-aware trees describe what each engine cached: an instance that left, or
            # whose weights changed (its KV cache was flushed with the refit), starts afresh.
            before, after = table.versions(), new.versions()
            for worker_id, version in before.items():
                if worker_id not in after or after[worker_id] != version:
                    self.policy.forget(worker_id)
        self._table = new
        return new

    def served_models(self) -> list[str]:
        return self.table().served

    def resolve_model(self, model: str | None) -> str:
        """The model a request goes to (the rules of the TokenSpeed/slime work)."""
        served = self.table().served
        if model is None:
            if len(served) == 1:
                return served[0]
            if not served:
                raise NoAvailableWorkers("no worker is registered to serve requests")
            raise ModelRequired("several models are served (" + ", ".join(served) + "): name one in `model`")
        if model in served:
            return model
        if served == ["unknown"]:
            # The only engine never told us its model name: let it judge the request.
            return "unknown"
        raise ModelNotFound(f"The model `{model}` does not exist.", param="model")

    # -- picking -------------------------------------------------------------------------------

    def _now(self) -> float:
        return trio.current_time()

    def _choose(
        self, selectable: Sequence[Entry], req: RolloutRequest, routing_key: str | None, exclude: set[str]
    ) -> Entry:
        pool = selectable
        if exclude:
            pool = [e for e in selectable if e.instance.worker_id not in exclude] or selectable
        by_id = {e.instance.worker_id: e for e in pool}
        candidates = [e.instance for e in pool]
        if routing_key:
            chosen = sticky(candidates, routing_key)
        else:
            chosen = self.policy.select(candidates, self.loads, req.prefix, self._now())
        return by_id[chosen.worker_id]

    @staticmethod
    def eligible(
        slot: ModelEntries, policy: VersionPolicy, floor: Version | None
    ) -> tuple[Sequence[Entry], Counter]:
        """The selectable entries under a request's version policy and floor, and why the rest
        are held out."""
        if not policy.filters and floor is None:
            return slot.selectable, slot.held
        kept = []
        held = Counter(slot.held)
        top = slot.fleet_max
        for entry in slot.selectable:
            reason = policy.hold_reason(entry.version, top) or floor_reason(entry.version, floor)
            if reason is None:
                kept.append(entry)
            else:
                held[reason] += 1
        return kept, held

    async def pick(
        self,
        req: RolloutRequest,
        model: str,
        *,
        routing_key: str | None,
        wait_until: float,
        policy: VersionPolicy | None = None,
        floor: Version | None = None,
        exclude: set[str] | None = None,
    ) -> Entry:
        """An eligible instance for ``model``; waits (event-driven) while every one is held out."""
        started = self._now()
        policy = policy or self.version_policy
        while True:
            slot = self.table().models.get(model)
            if slot is None or not slot.entries:
                raise NoAvailableWorkers(f"no worker serves model `{model}`")
            selectable, held = self.eligible(slot, policy, floor)
            if selectable:
                return self._choose(selectable, req, routing_key, exclude or set())
            if self._now() >= wait_until:
                raise NoEligibleWorkers.because(held, self._now() - started)
            changed = self._changed
            # Woken by the next committed change to the fleet (a continue_generation, a version
            # write, a health change), or by the wait budget running out. A client that goes
            # away cancels the wait (the request's disconnect watcher).
            self.waiting += 1
            try:
                with trio.move_on_at(wait_until):
                    await changed.wait()
            finally:
                self.waiting -= 1

    # -- forwarding ----------------------------------------------------------------------------

    def _upstream(self, entry: Entry, req: RolloutRequest, body: bytes, headers) -> tuple[list, bytes]:
        instance = entry.instance
        out = [(k, v) for k, v in headers if k in FORWARDED]
        if not any(k == b"content-type" for k, _ in out):
            out.append((b"content-type", b"application/json"))
        key = self.keys.get(instance.group)
        if key:
            out.append((b"authorization", b"Bearer " + key.encode("latin-1")))
        if instance.dp_rank is not None:
            body = json.dumps({**req.obj, "data_parallel_rank": instance.dp_rank}).encode()
        return out, body

    def deadlines(self) -> tuple[float, float]:
        """(the request's deadline, how long it may wait for an eligible engine)."""
        now = self._now()
        deadline = now + self.cfg.request_timeout_secs
        wait = self.cfg.dataplane.eligible_wait_secs
        return deadline, deadline if wait is None else min(deadline, now + wait)

    @contextlib.asynccontextmanager
    async def dispatch(
        self,
        req: RolloutRequest,
        body: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        *,
        model: str,
        routing_key: str | None = None,
        policy: VersionPolicy | None = None,
        floor: Version | None = None,
        buffered: bool,
    ) -> AsyncIterator[Dispatch]:
        """Pick, send and (``buffered``) read the answer; yields once the head (or body) is in.

        Bounded by ``--request-timeout-secs`` as a whole: the caller's relay runs inside it.
        """
        deadline, wait_until = self.deadlines()
        # The wait for an eligible engine has its own bound (never past the deadline), so running
        # out of it is a 503 naming why, not a 504.
        entry = await self.pick(
            req, model, routing_key=routing_key, wait_until=wait_until, policy=policy, floor=floor
        )
        with trio.move_on_at(deadline) as timeout:
            instance = entry.instance
            target_headers, target_body = self._upstream(entry, req, body, headers)
            pool = self.pools.get(instance.base_url)
            wid = instance.worker_id
            self.loads[wid] = self.loads.get(wid, 0) + 1
            try:
                try:
                    exchange = pool.stream("POST", req.route, headers=target_headers, body=target_body)
                    async with exchange as response:
                        dispatched = Dispatch(entry, response)
                        if buffered:
                            data, truncated = await response.read_bounded(MAX_RESPONSE_BYTES)
                            if truncated:
                                raise UpstreamUnreachable(
                                    f"upstream `{instance.url}` answered more than {MAX_RESPONSE_BYTES} bytes"
                                )
                            dispatched.body = data
                        yield dispatched
                except UpstreamError as exc:
                    raise UpstreamUnreachable(
                        f"upstream `{instance.url}` unreachable: {exc}", worker_id=wid
                    ) from exc
            finally:
                self.loads[wid] -= 1
        if timeout.cancelled_caught:
            raise RequestTimeout(f"the request did not finish within {self.cfg.request_timeout_secs:g}s")

"""The data plane's I/O shell: pick an eligible instance, forward, account.

``DataPlane`` owns what rollout routing remembers at run time: the routing table (rebuilt when
the fleet's revision moves), the policy's state (round-robin counter, cache-aware trees), the
in-flight load per instance, the per-engine circuit breakers and the admission limiter. It
never writes the journal (but for the prompt-group pins of gateways sharing one:
``smgrl.dataplane.pins``) and never touches the control plane's state: control calls go through
``smgrl.control`` and never move a load counter or a breaker (``tests/api/test_dataplane_resilience.py``).

Waiting for an eligible engine is event-driven: the fleet calls ``fleet_changed`` from the
journal writer's commit hook (``FleetState.subscribe``), which sets the current ``trio.Event``
and replaces it, so every waiting request re-checks the table once per change, never on a timer.
"""

from __future__ import annotations

import contextlib
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import attrs
import trio
from prometheus_client import CollectorRegistry

from smgrl.core import Version
from smgrl.core.config import Config, PsrlConfig
from smgrl.core.errors import (
    ModelNotFound,
    ModelRequired,
    NoAvailableWorkers,
    RequestTimeout,
    UpstreamUnreachable,
)
from smgrl.dataplane import decide, holding, vllm_generate, waiting
from smgrl.dataplane import hook as admission_hook
from smgrl.dataplane.admission import Admission
from smgrl.dataplane.affinity import GroupPins, Routed
from smgrl.dataplane.breaker import Breakers
from smgrl.dataplane.budget import ByteBudget, Hold, reserve_answer
from smgrl.dataplane.dispatch_queue import DispatchQueues, Turn
from smgrl.dataplane.grpc.exchange import GrpcEngines
from smgrl.dataplane.holding import Picking
from smgrl.dataplane.instance_stats import InstanceStatsTable
from smgrl.dataplane.metrics import DataPlaneMetrics
from smgrl.dataplane.pins import PinJournal
from smgrl.dataplane.psrl_select import PsrlSelection
from smgrl.dataplane.request import RolloutRequest
from smgrl.dataplane.table import Entry, ModelEntries, Table, build
from smgrl.registry import KeyRing
from smgrl.routing import (
    ANY,
    CacheAwareConfig,
    VersionPolicy,
    floor_reason,
    make_policy,
    staged,
    sticky,
)
from smgrl.state import FleetState
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
    # The journal's head when the request went to the engine: an aborting control call not
    # finished by then may have aborted it (partial-rollout loopback, smgrl/dataplane/loopback/).
    seq: int = 0

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
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.cfg = cfg
        self.fleet = fleet
        self.pools = pools
        self.keys = keys
        self.rng = rng or random.Random()
        dataplane_cfg = cfg.dataplane
        # Engine snapshots a coordinator pushed (POST /workers/update_stats), per instance.
        self.instance_stats = InstanceStatsTable()
        self.policy = make_policy(
            cfg.policy,
            self.rng,
            CacheAwareConfig(
                cache_threshold=dataplane_cfg.cache_threshold,
                balance_abs_threshold=dataplane_cfg.balance_abs_threshold,
                balance_rel_threshold=dataplane_cfg.balance_rel_threshold,
                max_tree_size=dataplane_cfg.max_tree_size,
            ),
            reported=self._reported,
        )
        self.ranked = getattr(self.policy, "ranked", False)
        # --rl-version-policy (with --enable-rl only: without it nothing is version-filtered).
        self.version_policy = VersionPolicy.parse(cfg.rl.version_policy) if cfg.rl.enabled else ANY
        self.loads: dict[str, int] = {}
        self.breakers = Breakers(dataplane_cfg.breaker, enabled=not cfg.disable_circuit_breaker)
        self.waiting = 0  # requests waiting in the gateway for an eligible engine
        self.waiting_by_reason: Counter = Counter()  # the same, by waiting.wait_reason()
        self.wait_passes = 0  # how many times a waiting request went to sleep (a spin shows here)
        self.admission = Admission(
            dataplane_cfg.max_concurrent_requests, dataplane_cfg.queue_size, dataplane_cfg.queue_timeout_secs
        )
        # gRPC engines (instances with a ``wire``): one channel each; the same dispatch path.
        self.grpc = GrpcEngines()
        self.budget = ByteBudget(dataplane_cfg.memory_budget)  # rollout bodies and buffered answers held
        self.max_body = min(cfg.max_payload_size, dataplane_cfg.max_body_size)
        self._table: Table | None = None
        self._changed = trio.Event()
        # PSRL's routing loop (Config.routing_loop): the queues its task hands turns out of
        # (smgrl/runtime/routing_loop.py), and the per-instance cap on requests in flight.
        loop_cfg = cfg.routing_loop
        self.queues = DispatchQueues(loop_cfg) if loop_cfg is not None else None
        self.seq_cap = loop_cfg.max_seqs_per_instance if loop_cfg is not None else None
        self.groups = GroupPins()  # prompt-group pins of staged selection (in memory)
        # --psrl-group-sticky (PSRL's ``psrl_enable_group_sticky``, off by default as in its fork):
        # without it a prompt group's requests are spread by the policy, never pinned.
        self.group_sticky = dataplane_cfg.psrl_group_sticky
        # PSManager and the KV gate (RouterArgs: smgrl.launch_router); None: neither configured.
        self.psrl: PsrlSelection | None = None
        if cfg.psrl is not None:
            self.use_psrl(cfg.psrl)
        # Gateways sharing the journal: pins are decided once across processes (``share_pins``).
        self.pins: PinJournal | None = None
        self.dispatched: Counter = Counter()  # selections per instance (GET /workers/stats)
        self.tokens: Counter = Counter()  # generated tokens per instance, as answers report them
        # Waiting requests whose routing names one instance (a hint: sticky, forced once, a
        # loopback's return; or their prompt group's pin): they wait for that instance, so
        # GET /workers/stats shows them as its queue.
        self.queued: Counter = Counter()
        # Requests waiting in the gateway right now (GET /routing_loop/filter): token -> facts.
        self.waiting_requests: dict[object, dict] = {}
        # Requests at an engine right now, and the event POST /routing_loop/pause?wait=true
        # waits on until there are none (set by the dispatch that ends the last one).
        self.in_flight = 0
        self._idle: trio.Event | None = None
        # --admission-hook: None admits everything without a call.
        self.hook = (
            admission_hook.resolve(dataplane_cfg.admission_hook) if dataplane_cfg.admission_hook else None
        )
        # The gateway's metrics registry (``--prometheus-port``); a private one when none is given.
        self.metrics = DataPlaneMetrics(
            registry if registry is not None else CollectorRegistry(auto_describe=False),
            rl_enabled=cfg.rl.enabled,
            dataplane=self,
        )
        fleet.subscribe(self.fleet_changed)

    def _reported(self, instance) -> int:
        """Running + waiting requests the instance's engine last reported (0: none)."""
        stats = self.instance_stats.get(*staged.identity(instance))
        return 0 if stats is None else stats.requests

    def use_psrl(self, psrl: PsrlConfig) -> None:
        """PSRL's PSManager and KV gate (``smgrl/dataplane/psrl_select.py``; ``self.psrl`` is None
        when neither is configured)."""
        self.psrl = PsrlSelection.build(psrl, self.instance_stats)

    def close(self) -> None:
        self.fleet.unsubscribe(self.fleet_changed)

    def share_pins(self, pins: PinJournal) -> None:
        """Several processes share the journal: decide prompt-group pins through it, read them
        from its projection (``smgrl.dataplane.pins``)."""
        self.pins = pins
        self.groups.shared = self.fleet.group_pins
        pins.share(self.groups)

    # -- the routing table ---------------------------------------------------------------------

    def fleet_changed(self) -> None:
        # Runs in the journal writer's task, synchronously: wake every waiter, then start a new
        # generation of the event for the next wait.
        changed, self._changed = self._changed, trio.Event()
        changed.set()
        if self.queues is not None:
            self.queues.change()

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
                    if worker_id in after and self.loads.get(worker_id):
                        self.metrics.version_changed_with_inflight()
            for worker_id in [w for w, n in self.loads.items() if not n and w not in after]:
                del self.loads[worker_id]  # a removed worker's idle counter
        if self.breakers.by_engine:
            self.breakers.prune({e.instance.base_url for slot in new.models.values() for e in slot.entries})
        self._table = new
        return new

    def served_models(self) -> list[str]:
        return self.table().served

    async def engine_tokenizer(self):
        """The tokenizer a registered gRPC engine serves (GetTokenizer), or None: what sessions
        use without --tokenizer-path (``SessionsConfig.from_engines``)."""
        table = self.table()
        return await self.grpc.served_tokenizer(
            e.instance for name in table.served for e in table.models[name].entries
        )

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
        raise ModelNotFound(f"No worker available for model '{model}'")  # SMG's text, param null

    # -- picking -------------------------------------------------------------------------------

    def _now(self) -> float:
        return trio.current_time()

    def _choose(
        self, selectable: Sequence[Entry], req: RolloutRequest, routing_key: str | None, exclude: set[str]
    ) -> Entry:
        if exclude:
            # A retry: the least-loaded instance not tried yet (any, when all were), without
            # consulting the policy, so a retry neither skews round-robin turns nor pins a
            # prefix to an instance that did not serve it.
            untried = [e for e in selectable if e.instance.worker_id not in exclude] or selectable
            return min(untried, key=lambda e: self.loads.get(e.instance.worker_id, 0))
        if routing_key:
            chosen = sticky([e.instance for e in selectable], routing_key)
        elif len(selectable) == 1:
            return selectable[0]
        else:
            chosen = self.policy.select([e.instance for e in selectable], self.loads, req.prefix, self._now())
        for entry in selectable:
            if entry.instance is chosen:
                return entry
        raise AssertionError("the policy chose an instance it was not offered")

    def eligible(
        self, slot: ModelEntries, policy: VersionPolicy, floor: Version | None
    ) -> tuple[Sequence[Entry], Counter]:
        """The selectable entries under a request's version policy and floor and the engines'
        circuit breakers, and why the rest are held out."""
        breakers, cap = self.breakers, self.seq_cap
        if not policy.filters and floor is None and not breakers.open_count and cap is None:
            return slot.selectable, slot.held  # the common case: nothing to recompute
        kept = []
        held = Counter(slot.held)
        top = slot.fleet_max
        now = self._now()
        loads = self.loads
        for entry in slot.selectable:
            reason = policy.hold_reason(entry.version, top) or floor_reason(entry.version, floor)
            if reason is None and not breakers.allows(entry.instance.base_url, now):
                reason = "circuit_open"
            if reason is None and cap is not None and loads.get(entry.instance.worker_id, 0) >= cap:
                reason = "instance_full"  # max_concurrent_seqs_per_instance in flight already
            if reason is None:
                kept.append(entry)
            else:
                held[reason] += 1
        return kept, held

    # Keyword parameters, shaped like other signatures (registry/probe.py): each function its own.
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
        routed: Routed | None = None,
        turn: Turn | None = None,
    ) -> Entry:
        """An eligible instance for ``model``; waits (event-driven) while every one is held out.

        A request with routing metadata (``routed.staged``) takes the staged selection
        (``smgrl.routing.staged``); the others the plain one: floor, then the policy. A
        session turn's honoured hint holds it while its instance is mid-refit (``held_hint``).
        With the routing loop (``turn``), a request waits in its model's queue for its turn
        instead, and joins it at once while others wait (``smgrl.dataplane.dispatch_queue``)."""
        p = Picking(
            req=req,
            model=model,
            routing_key=routing_key,
            wait_until=wait_until,
            policy=policy or self.version_policy,
            floor=floor,
            exclude=exclude or set(),
            routed=routed,
            turn=turn,
            queues=self.queues if turn is not None else None,
            started=self._now(),
        )
        while True:
            slot = self.table().models.get(model)
            if slot is None or not slot.entries:
                raise NoAvailableWorkers(f"no worker serves model `{model}`")
            held, chosen = await self._select(p, slot)
            if chosen is not None:
                if not await self._accepted(p, chosen):
                    continue  # refused: select again without it
                if held:
                    self.metrics.held_out(held)
                return chosen
            await holding.wait_pass(self, p, slot, held)

    async def _select(self, p: Picking, slot: ModelEntries) -> tuple[Counter, Entry | None]:
        """One selection pass: the instance chosen (None: every one held out) and why the others
        were held out."""
        routed = p.routed
        if routed is not None and routed.after_ops and not self.fleet.aborts.pending(routed.after_ops):
            routed.after_ops = ()  # the syncs that aborted this loopback have finished
        if p.queues is not None and p.queues.must_wait(p.turn, p.model):
            # Others of this model wait for their turns: behind them, not past them.
            return Counter(queued=1), None
        if routed is not None and routed.after_ops:
            # A partial-rollout continuation waits for the sync that aborted it: until then
            # its engine may still look active (refusing it, or running old weights).
            return Counter(syncing=len(slot.entries)), None
        if self.fleet.routing.paused:
            # The coordinator paused dispatch (/routing_loop/pause): wait like a request
            # with no eligible engine; the resume's journal commit wakes it.
            return Counter(dispatch_paused=len(slot.entries)), None
        if routed is not None and routed.staged:
            return await self._select_staged(p, slot, routed)
        return self._select_plain(p, slot)

    async def _select_staged(
        self, p: Picking, slot: ModelEntries, routed: Routed
    ) -> tuple[Counter, Entry | None]:
        """The staged selection (``smgrl.routing.staged``): hint, group pin, floor, PSManager."""
        if self.psrl is not None:
            await self.psrl.check_aborted(routed)  # PSManager may have aborted it
        selectable, held = self.eligible(slot, p.policy, None)
        hint = routed.hint()
        if hint is not None and routed.session:
            hint, selectable = waiting.held_hint(slot.entries, selectable, hint)
        narrowed = staged.narrow(
            selectable,
            floor=routed.floor,
            hint=hint,
            group_pin=self.groups.pin(routed.meta.prompt_id) if self.group_sticky else None,
            refused=routed.refused,
        )
        if self.psrl is not None:
            narrowed = await self.psrl.admit(routed, narrowed)
        decision = staged.finish(
            narrowed,
            floor=routed.floor,
            choose=lambda group: self._choose(group, p.req, p.routing_key, p.exclude),
            ranked=self.ranked,
        )
        if decision.held:
            held = held + decision.held
        return held, decision.chosen

    def _select_plain(self, p: Picking, slot: ModelEntries) -> tuple[Counter, Entry | None]:
        """The plain selection: version policy and floor, then the routing policy."""
        routed = p.routed
        selectable, held = self.eligible(slot, p.policy, p.floor)
        if routed is not None and routed.refused:
            kept = [e for e in selectable if staged.identity(e.instance) not in routed.refused]
            held = held + Counter(refused=len(selectable) - len(kept))
            selectable = kept
        return held, self._choose(selectable, p.req, p.routing_key, p.exclude) if selectable else None

    async def _accepted(self, p: Picking, chosen: Entry) -> bool:
        """The admission hook's answer for ``chosen`` (True without a hook or routing metadata)."""
        if self.hook is None or p.routed is None:
            return True
        return await decide.ask_hook(self, p.routed, p.req, p.model, chosen)

    # -- forwarding ----------------------------------------------------------------------------

    def _upstream(self, entry: Entry, req: RolloutRequest, body: bytes, headers) -> tuple[list, bytes]:
        instance = entry.instance
        out = [(k, v) for k, v in headers if k in FORWARDED]
        if not any(k == b"content-type" for k, _ in out):
            out.append((b"content-type", b"application/json"))
        key = self.keys.get(instance.group)
        if key:
            out.append((b"authorization", b"Bearer " + key.encode("latin-1")))
        if instance.dp_rank is not None and instance.wire is None:
            # gRPC: the rank goes in the GenerateRequest (smgrl/dataplane/grpc). HTTP: parsed again here (--dp-aware only): the request does not keep its parsed body.
            body = json.dumps({**json.loads(body), "data_parallel_rank": instance.dp_rank}).encode()
        return out, body

    def deadlines(self) -> tuple[float, float]:
        """(the request's deadline, how long it may wait for an eligible engine)."""
        now = self._now()
        deadline = now + self.cfg.request_timeout_secs
        wait = self.cfg.dataplane.eligible_wait_secs
        return deadline, deadline if wait is None else min(deadline, now + wait)

    def dispatch(self, req: RolloutRequest, body: bytes, headers: Sequence[tuple[bytes, bytes]], **kw):
        """``async with dataplane.dispatch(...) as dispatched:`` (``_dispatch``); with the routing
        loop, the request's turn goes with it and leaves the loop when the block ends."""
        if self.queues is None:
            return self._dispatch(req, body, headers, **kw)
        return self._in_turn(req, body, headers, **kw)

    @contextlib.asynccontextmanager
    async def _in_turn(self, req, body, headers, **kw) -> AsyncIterator[Dispatch]:
        assert self.queues is not None
        turn = Turn()
        try:
            async with self._dispatch(req, body, headers, turn=turn, **kw) as dispatched:
                yield dispatched
        finally:
            # However it ends (answered, refused, timed out, its client gone: the cancellation
            # arrives in the wait for its turn or later), the request leaves its model's queue
            # and gives back a turn it held, so the loop hands out the next.
            self.queues.leave(turn)

    @contextlib.asynccontextmanager
    async def _dispatch(
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
        hold: Hold | None = None,
        routed: Routed | None = None,
        adapt: Callable[[Entry], tuple[str, bytes]] | None = None,
        turn: Turn | None = None,
    ) -> AsyncIterator[Dispatch]:
        """Pick, send and (``buffered``) read the answer; yields once the head (or body) is in.

        Retries (``--retry-*``) happen here and only here, before anything reaches the client:
        on a connection error or a 5xx answer (for a buffered request also a body cut short),
        with backoff, preferring an instance not tried yet. Once this yields, the caller relays
        and nothing is retried. ``--request-timeout-secs`` bounds the whole, relay included;
        the wait for an eligible engine has its own bound (never past the deadline), so running
        out of it is a 503 naming why, not a 504.

        Session turns (smgrl/sessions): ``adapt`` gives the route and body for the picked
        instance (a token-in request in its engine's dialect).
        """
        deadline, wait_until = self.deadlines()
        retry = self.cfg.dataplane.retry
        attempts = max(1, retry.max_retries) if retry.enabled else 1
        tried: set[str] = set()
        for attempt in range(attempts):
            if attempt:
                # Past the deadline the backoff just ends; the exchange scope below then
                # reports the timeout.
                with trio.move_on_at(deadline):
                    await trio.sleep(self._backoff(attempt))
            entry = await self._select_for(
                req, model, routing_key, min(wait_until, deadline), policy, floor, tried, routed, turn
            )
            wid, base = entry.instance.worker_id, entry.instance.base_url
            route, target_headers, target_body, vllm = self._outbound(entry, req, body, headers, adapt)
            retry_next = attempt + 1 != attempts
            relaying = False
            self._sent(wid, turn)
            mark = hold.held if hold is not None else 0  # what a discarded answer gives back
            # The deadline scope spans the caller's relay too (it runs at ``yield``, in this
            # task: the asynccontextmanager pattern trio allows for a yield inside a scope). A
            # cancellation at any checkpoint closes the engine connection (upstream/pool.py),
            # so the engine aborts the request.
            with trio.move_on_at(deadline) as timeout:
                try:
                    sent_at = self.fleet.last_seq
                    async with self._exchange(entry, route, target_headers, target_body) as response:
                        if response.status >= 500 and retry_next:
                            # Not relayed: leaving the block closes the connection unread.
                            self._record(base, False)
                            self._retrying(wid, tried)
                            continue
                        dispatched = Dispatch(entry, response, seq=sent_at)
                        if buffered:
                            dispatched.body = await self._read_answer(entry, response, hold, vllm)
                        self._record(base, response.status < 500)
                        relaying = True
                        yield dispatched
                        return
                except UpstreamError as exc:
                    discard = hold if buffered and not relaying else None
                    self._failed(exc, entry, discard, mark, retry=retry_next and not relaying, tried=tried)
                    continue
                finally:
                    self._ended(wid)
            if timeout.cancelled_caught:
                raise RequestTimeout(f"the request did not finish within {self.cfg.request_timeout_secs:g}s")

    async def _select_for(
        self,
        req: RolloutRequest,
        model: str,
        routing_key: str | None,
        wait_until: float,
        policy: VersionPolicy | None,
        floor: Version | None,
        tried: set[str],
        routed: Routed | None,
        turn: Turn | None,
    ) -> Entry:
        """One attempt's instance: picked, its prompt group's pin decided once across processes
        (a shared journal: ``smgrl.dataplane.pins``), and the selection committed."""

        def pick() -> Awaitable[Entry]:
            return self.pick(
                req,
                model,
                routing_key=routing_key,
                wait_until=wait_until,
                policy=policy,
                floor=floor,
                exclude=tried,
                routed=routed,
                turn=turn,
            )

        pins = self.pins
        if routed is not None and pins is not None and pins.deciding:
            await pins.decision_in_the_air(routed, self.group_sticky)
        entry = await pick()
        if routed is not None:
            if pins is not None and self.groups.unpinned(routed, self.group_sticky):
                entry = await pins.pin_group(routed, entry, pick, self.group_sticky)
            if self.psrl is not None and routed.staged:
                await self.psrl.commit(routed, entry)  # PSManager records the selection
            decide.commit(self, routed, entry)
        return entry

    def _outbound(
        self,
        entry: Entry,
        req: RolloutRequest,
        body: bytes,
        headers: Sequence[tuple[bytes, bytes]],
        adapt: Callable[[Entry], tuple[str, bytes]] | None,
    ) -> tuple[str, list, bytes, vllm_generate.Outbound | None]:
        """What goes to the picked instance: its route, headers and body (a vLLM engine's
        token-in route for /generate, ``vllm``, whose answer is SGLang's)."""
        route, body_out = adapt(entry) if adapt is not None else (req.route, body)
        vllm = vllm_generate.outbound(
            self.fleet.registry.get(entry.instance.worker_id), route, body_out, req.stream
        )
        if vllm is not None:  # /generate on a vLLM engine: its token-in route, SGLang's answer
            route, body_out = vllm.route, vllm.body
        target_headers, target_body = self._upstream(entry, req, body_out, headers)
        return route, target_headers, target_body, vllm

    def _exchange(self, entry: Entry, route: str, headers: list, body: bytes):
        """The engine call (``async with``: the answer's head, then its body)."""
        instance = entry.instance
        if instance.wire is not None:
            # A gRPC engine: the same answer surface, from Generate RPCs.
            return self.grpc.exchange(instance, entry.version, route, body)
        return self.pools.get(instance.base_url).stream("POST", route, headers=headers, body=body)

    async def _read_answer(
        self, entry: Entry, response: Response, hold: Hold | None, vllm: vllm_generate.Outbound | None
    ) -> bytes:
        """A buffered answer's body, whole (bounded; its bytes taken from the memory budget)."""
        data, truncated = await response.read_bounded(
            MAX_RESPONSE_BYTES, reserve_answer(hold, response, MAX_RESPONSE_BYTES)
        )
        if truncated:
            raise UpstreamUnreachable(
                f"upstream `{entry.instance.url}` answered more than {MAX_RESPONSE_BYTES} bytes"
            )
        return data if vllm is None else vllm.answer(data)

    def _sent(self, wid: str, turn: Turn | None) -> None:
        """A request goes to instance ``wid``: counted in flight."""
        self.loads[wid] = self.loads.get(wid, 0) + 1
        self.in_flight += 1
        if turn is not None:
            self.queues.attempt_done(turn)  # counted in flight: the loop hands the next turn

    def _ended(self, wid: str) -> None:
        """An attempt at instance ``wid`` ended (answered and relayed, failed or cancelled)."""
        self.loads[wid] -= 1
        self.in_flight -= 1
        if self.queues is not None:
            self.queues.change()  # room on an instance: the waiting may go
        if not self.in_flight and self._idle is not None:
            self._idle.set()
            self._idle = None

    def _failed(
        self,
        exc: UpstreamError,
        entry: Entry,
        discard: Hold | None,
        mark: int,
        *,
        retry: bool,
        tried: set[str],
    ) -> None:
        """The engine call failed: retry (return) or raise UpstreamUnreachable. ``discard``: the
        hold of a buffered answer cut short, given back to ``mark``."""
        instance = entry.instance
        self._record(instance.base_url, False)
        if discard is not None:
            discard.back_to(mark)  # the cut-short answer is discarded
        if not retry:
            raise UpstreamUnreachable(
                f"upstream `{instance.url}` unreachable: {exc}", worker_id=instance.worker_id
            ) from exc
        self._retrying(instance.worker_id, tried)

    def _retrying(self, wid: str, tried: set[str]) -> None:
        """The attempt at ``wid`` failed before anything was relayed: the next one prefers another."""
        self.metrics.retries.inc()
        tried.add(wid)

    async def wait_idle(self, deadline: float) -> bool:
        """Until no request is at an engine (True), or ``deadline`` (False). Event-driven: the
        dispatch that ends the last in-flight request wakes the waiters."""
        with trio.move_on_at(deadline):
            while self.in_flight:
                if self._idle is None:
                    self._idle = trio.Event()
                await self._idle.wait()
            return True
        return False

    # -- staged selection's commit and release -------------------------------------------------

    def count_tokens(self, worker_id: str, tokens: int | None) -> None:
        """Generated tokens an answer of this instance reported (GET /workers/stats)."""
        if tokens:
            self.tokens[worker_id] += tokens

    async def finish(self, routed: Routed) -> None:
        """The request ended (answered, failed or cancelled): ``decide.finish``."""
        await decide.finish(self, routed)

    def _backoff(self, attempt: int) -> float:
        r = self.cfg.dataplane.retry
        delay = min(r.max_backoff_ms, r.initial_backoff_ms * r.backoff_multiplier ** (attempt - 1))
        jitter = 1 + r.jitter_factor * (2 * self.rng.random() - 1)
        return max(0.0, delay * jitter) / 1000

    def _record(self, base_url: str, success: bool) -> None:
        breakers = self.breakers
        if success and base_url not in breakers.by_engine:
            return  # what ``Breakers.record`` does for a healthy engine, without reading the clock
        breakers.record(base_url, success, self._now())

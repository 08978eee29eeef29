"""Control operations with their journal records, metrics and logs.

Two journal transactions per operation (stream ``op:<id>``):

1. ``control.started`` - enqueued, then awaited (durable) BEFORE any engine is called: if the
   gateway dies mid-call, the journal still says which engines may have been touched, and restart
   records the operation as interrupted. If the journal cannot take it, no engine is called (503).
2. one ``control.outcome`` per target, ``control.finished`` and the request's audit event
   (``audit.control_plane``, from the guard) - committed together in ONE transaction
   (``append_many``) and awaited before the response is sent, so a client never sees a result
   the journal does not have. The outcomes wait in memory until then: a gateway that dies
   mid-operation loses them, and the interrupted record then marks every target as cut short
   (its engine state ``unknown``), which is what a crash before any outcome would say too.

A client that disconnects cancels the handler and every engine call still in flight; a shielded
step then commits the outcomes that did arrive with ``control.finished`` result ``cancelled``. A
cancellation after the intent was enqueued (even before it was durable) also ends that way, so no
operation is left open until a restart.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import attrs
import trio

from journal import Append, Expect, JournalConflict, JournalWriteError
from smgrl.control.batched import run_batched
from smgrl.control.call import ControlRequest, call_worker
from smgrl.control.outcome import Outcome, fanout_body
from smgrl.core import (
    Selector,
    Worker,
    collapse,
    control_url,
    intent_of,
    metric_op,
    new_operation_id,
    selector_view,
)
from smgrl.core.config import RlConfig
from smgrl.core.errors import JournalUnavailable
from smgrl.events import ControlFinished, ControlOutcome, ControlStarted
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.rl")

# A dead journal must not hold a cancelled request forever: the shielded record gives up after this.
SHIELDED_RECORD_SECS = 10.0
# Selectors whose targets are kept per projection revision (ControlService.targets).
_TARGETS_CACHED = 64


@attrs.frozen
class CallContext:
    principal: str | None = None
    request_id: str | None = None
    # The request's audit event for a given HTTP status (``Check.audit_event`` in
    # smgrl/http/routes/guard.py), committed with the operation's final records.
    audit: Callable[[int], object] | None = None


@attrs.define(eq=False)
class _Op:
    """One operation in flight: its id, its intent's receipt, the records still to commit."""

    op_id: str
    intent: object  # journal.Pending of control.started
    ctx: CallContext
    # control.outcome events, in arrival order, each already an Append (encoded as it arrived)
    records: list[Append] = attrs.Factory(list)
    intent_failed: bool = False
    stream: str = attrs.field(init=False)  # the operation's journal stream

    @stream.default
    def _stream(self) -> str:
        return f"op:{self.op_id}"


@attrs.frozen
class OpResult:
    status: int
    body: dict | None
    op_id: str
    journaled: bool = True


class ControlService:
    # Attribute assignments, shaped like the other services' constructors: nothing to share.
    def __init__(self, *, fleet, journal, pools, keys, rl: RlConfig, metrics) -> None:
        self.fleet = fleet
        self.journal = journal
        self.pools = pools
        self.keys = keys
        self.rl = rl
        self.metrics = metrics
        # Set by the server when the gateway starts stopping: an operation cut short from then on
        # is the gateway's doing, and the server records it interrupted (reason shutdown).
        self.stopping = False
        # Several gateway processes on one journal (smgrl/cluster/sharing.py): this process's identity,
        # recorded in control.started so that another process can record the operation
        # interrupted if this one dies. None for a lone gateway.
        self.identity: str | None = None
        # targets() per selector, valid for one projection revision (see targets()).
        self._targets: tuple[object, dict[Selector, tuple[Worker, ...]]] = (None, {})
        # Each target's control endpoint and pool for the batched calls (run_batched), emptied
        # with the targets whenever the projections change.
        self._routes: dict[str, tuple] = {}
        # Idle engine-call batches, each with its private epoll, reused by later fan-outs.
        self._batches: list = []

    # -- targets -------------------------------------------------------------------------------

    def targets(self, selector: Selector) -> list[Worker]:
        """The DP-collapsed representatives whose merged label view matches, in row order.
        No implicit health or type filter.

        Computed once per selector and projection revision (the registry's, the engine facts'
        and the routing state's: everything a worker's view is made of, as the discovery
        render's cache in rl_routes.py): collapsing and matching 64 workers took about 225 us
        of every 64-engine fan-out (docs/benchmarks.md, "fan-out (control plane)"). The selectors
        come from clients, so at most ``_TARGETS_CACHED`` are kept per revision."""
        revision = self.fleet.revision
        cached_at, cache = self._targets
        if cached_at != revision:
            cache = {}
            self._targets = (revision, cache)
            self._routes = {}
        found = cache.get(selector)
        if found is None:
            facts = self.fleet.facts()
            found = tuple(
                group.representative
                for group in collapse(self.fleet.registry)
                if selector.matches(
                    selector_view(group.representative, facts.get(group.representative.base_url))
                )
            )
            if len(cache) < _TARGETS_CACHED:
                cache[selector] = found
        return list(found)

    # -- operations ----------------------------------------------------------------------------

    async def call(self, worker: Worker, req: ControlRequest, ctx: CallContext) -> OpResult:
        started = trio.current_time()
        # Cancelled while enqueueing: nothing was written and there is nothing to close.
        op = await self._start("call", req, None, [worker], ctx)
        outcome = None
        try:
            await self._intent_durable(op)
            outcome = await self._call_one(worker, req, op, quiet_ok=False)
        finally:
            if outcome is None and not op.intent_failed:
                await self._record_cut_short(op, 1, 0, started)
        if outcome.error is not None:
            status, body = outcome.error.status, outcome.error.body()
        else:
            status, body = outcome.status, outcome.envelope()
        journaled = await self._finish(
            op, "ok" if outcome.ok else "failed", status, 1, int(outcome.ok), started
        )
        return OpResult(status, body, op.op_id, journaled)

    async def fanout(
        self,
        selector: Selector,
        targets: Sequence[Worker],
        req: ControlRequest,
        ctx: CallContext,
        *,
        op_id: str | None = None,
        on_outcome: Callable[[Worker, Outcome], None] | None = None,
    ) -> OpResult:
        """``op_id`` and ``on_outcome`` are for the refit saga (smgrl/refit/saga.py): it names
        the operation in its own intent before calling, and reads each engine's answer."""
        started = trio.current_time()
        op = await self._start("fanout", req, selector.source, targets, ctx, op_id)
        outcomes: list[Outcome] = []
        done = False
        try:
            await self._intent_durable(op)
            await run_batched(
                targets,
                req,
                lambda w: self.keys.get(w.group),
                self.pools,
                self.rl.control_timeout_secs,
                self.rl.fanout_concurrency,
                lambda w: call_worker(
                    w, self.keys.get(w.group), req, self.pools, self.rl.control_timeout_secs
                ),
                lambda w, o: (
                    self._record(w, req, op, o, quiet_ok=True),
                    outcomes.append(o),
                    on_outcome and on_outcome(w, o),
                ),
                self._routes,
                self._batches,
            )
            done = True
        finally:
            if not done and not op.intent_failed:
                await self._record_cut_short(op, len(targets), sum(o.ok for o in outcomes), started)
        modes = {w.id: w.connection_mode for w in targets}
        status, body = fanout_body(outcomes, modes)
        # failed: no target succeeded (a load refused everywhere is not "partial").
        result = "ok" if status == 200 else "partial" if body["succeeded"] else "failed"
        elapsed = trio.current_time() - started
        if self.metrics.rl_enabled:
            self.metrics.fanout(result, elapsed)
        log_event(
            log,
            "rl.fanout",
            op_id=op.op_id,
            path=req.path,
            selector=selector.source,
            total=body["total"],
            succeeded=body["succeeded"],
            failed=len(body["failed"]),
            latency_ms=int(elapsed * 1000),
        )
        journaled = await self._finish(op, result, status, len(targets), body["succeeded"], started)
        return OpResult(status, body, op.op_id, journaled)

    async def no_match(self, selector: Selector, req: ControlRequest, ctx: CallContext) -> OpResult:
        started = trio.current_time()
        op = await self._start("fanout", req, selector.source, [], ctx)
        done = False
        try:
            await self._intent_durable(op)
            done = True
        finally:
            if not done and not op.intent_failed:
                await self._record_cut_short(op, 0, 0, started)
        if self.metrics.rl_enabled:
            self.metrics.fanout("no_match", trio.current_time() - started)
        journaled = await self._finish(op, "no_match", 400, 0, 0, started)
        return OpResult(400, None, op.op_id, journaled)

    # -- steps ---------------------------------------------------------------------------------

    async def _record_cut_short(self, op: _Op, total: int, succeeded: int, started: float) -> None:
        """The request was cancelled (client disconnected, shutdown past its grace period) or
        failed mid-operation. Shielded: the client is gone, but the journal must still say that the
        operation ended cancelled, with the outcomes that arrived. Bounded, so a dead journal
        cannot hold a cancelled request forever.

        While the gateway stops (``stopping``), the operation is not closed here: the outcomes
        that arrived (and the request's audit) are committed without ``control.finished``, and the
        server's shutdown bookkeeping then records it ``control.interrupted`` (reason
        ``shutdown``), naming the targets whose outcome is recorded and those cut short."""
        if self.stopping:
            await self._record_outcomes_only(op)
            return
        with trio.CancelScope(shield=True), trio.move_on_after(SHIELDED_RECORD_SECS):
            await self._finish(op, "cancelled", 499, total, succeeded, started, quiet=True)

    async def _record_outcomes_only(self, op: _Op) -> None:
        items = op.records
        op.records = []
        if op.ctx.audit is not None:
            items.append(Append("audit", op.ctx.audit(499)))
        if not items:
            return
        # Shielded and bounded like the cancelled record: the gateway is going down.
        with trio.CancelScope(shield=True), trio.move_on_after(SHIELDED_RECORD_SECS):
            try:
                await self._append_fenced(op, items)
            except JournalWriteError:
                pass  # the interrupted record then names these targets as cut short

    async def _append_fenced(self, op: _Op, items: list[Append]) -> bool:
        """Append an operation's closing records; False (nothing of the operation written, the
        audit kept) when another process closed it already.

        Several processes: fenced, as a saga's records are. A process whose presence lease
        lapsed (dead, or its event loop stalled) has its open operations recorded
        ``control.interrupted`` by the recovery lease's holder; if it was only stalled, it must
        not then record outcomes and a finish beside that close (the journal would say both).
        Refused when this process's projection has the operation closed, or when a close was
        appended since its position (the conditional append)."""
        position = getattr(self.journal, "position", None)
        if not self.identity or position is None:  # a lone gateway: nobody else closes its operations
            await self.journal.append_many(items)
            return True
        stream = op.stream
        closed = self.fleet.operations.open.get(op.op_id) is None
        if not closed:
            expect = Expect(
                after=position, types=("control.finished", "control.interrupted"), streams=(stream,)
            )
            try:
                await self.journal.append_if(expect, items)
                return True
            except JournalConflict:
                closed = True
        log.warning(
            "operation closed by another gateway process meanwhile; its outcomes here are not recorded",
            extra={"fields": {"op_id": op.op_id}},
        )
        rest = [item for item in items if item.stream != stream]  # the request's audit
        if rest:
            await self.journal.append_many(rest)
        return False

    async def _call_one(self, worker: Worker, req: ControlRequest, op: _Op, *, quiet_ok: bool) -> Outcome:
        """``quiet_ok``: inside a fan-out, an engine's 2xx answer is logged at DEBUG (docs/deviations.md,
        "log lines of a fan-out"): the operation's ``rl.fanout`` line counts them, and every answer is a
        ``control.outcome`` event in the journal. A refusal is still an INFO line of its own."""
        outcome = await call_worker(
            worker, self.keys.get(worker.group), req, self.pools, self.rl.control_timeout_secs
        )
        self._record(worker, req, op, outcome, quiet_ok=quiet_ok)
        return outcome

    def _record(
        self, worker: Worker, req: ControlRequest, op: _Op, outcome: Outcome, *, quiet_ok: bool
    ) -> None:
        """An outcome's metric, log line and journal record (the latter held for the final
        transaction)."""
        result = outcome.metric_result
        if result is not None and self.metrics.rl_enabled:
            self.metrics.control_call(metric_op(req.path), result, outcome.latency_ms / 1000)
        level = logging.DEBUG if quiet_ok and outcome.ok else logging.INFO
        # Checked here, before the fields are gathered: a fan-out's answers are DEBUG lines, off
        # by default, and building their fields was a few us per engine.
        if outcome.answered and log.isEnabledFor(level):
            # The operator's log line; the journal's control.outcome below carries its own fields (op_id,
            # error, excerpt): two readers, two records.
            log_event(
                log,
                "rl.proxy",
                level,
                worker_id=worker.id,
                url=worker.url,
                control_url=outcome.control_url,
                method=req.method,
                path=req.path,
                status=outcome.status,
                latency_ms=outcome.latency_ms,
            )
        err = outcome.error
        # Held for the operation's final transaction (see the module docstring). Built and
        # encoded now, in this task: an outcome that cannot be encoded fails here, not the whole
        # final batch; and in a fan-out, the encoding is done while the gateway waits for the other
        # engines, not after the last answer, where every microsecond adds to the fan-out's time.
        event = ControlOutcome(
            op_id=op.op_id,
            worker_id=worker.id,
            url=worker.url,
            control_url=outcome.control_url,
            status=outcome.status,
            latency_ms=outcome.latency_ms,
            error=err.code if err else None,
            message=err.message if err else None,
            excerpt=outcome.excerpt(),
            body_truncated=outcome.body_truncated,
            stage=outcome.stage,
        )
        op.records.append(Append(op.stream, event))

    async def _start(
        self,
        kind: str,
        req: ControlRequest,
        selector: str | None,
        targets: Sequence[Worker],
        ctx: CallContext,
        op_id: str | None = None,
    ) -> _Op:
        """Enqueue ``control.started``. Once this returns the intent WILL be written (or its batch
        fails): the caller owes the operation a close from then on."""
        op_id = op_id or new_operation_id()
        event = ControlStarted(
            op_id=op_id,
            kind=kind,
            method=req.method,
            path=req.path,
            query=req.query,
            selector=selector,
            targets=[{"worker_id": w.id, "url": w.url, "control_url": control_url(w)} for w in targets],
            **ControlStarted.body_fields(req.body),
            content_type=req.content_type,
            principal=ctx.principal,
            request_id=ctx.request_id,
            intent=intent_of(req.method, req.path, req.body).to_json(),
            gateway=self.identity,
        )
        try:
            # alone: committed here when the writer is idle (the caller awaits it at once).
            pending = await self.journal.enqueue(f"op:{op_id}", event, alone=True)
        except JournalWriteError as exc:
            raise JournalUnavailable(f"the journal cannot record this operation: {exc}") from exc
        return _Op(op_id, pending, ctx)

    async def _intent_durable(self, op: _Op) -> None:
        try:
            if op.intent.done:
                # Committed in this task already (``enqueue(alone=True)`` with the writer idle):
                # its result without a schedule point (a pass of trio's loop, about 10 us), but
                # still a cancellation point, so a request cancelled by now calls no engine.
                await trio.lowlevel.checkpoint_if_cancelled()
                op.intent.result()
            else:
                await op.intent.wait()
        except JournalWriteError as exc:
            # No record, no engine call: an unrecorded refit is exactly what the journal prevents.
            op.intent_failed = True
            raise JournalUnavailable(f"the journal cannot record this operation: {exc}") from exc

    async def _finish(
        self,
        op: _Op,
        result: str,
        http_status: int,
        total: int,
        succeeded: int,
        started: float,
        quiet: bool = False,
    ) -> bool:
        finished = ControlFinished(
            op_id=op.op_id,
            result=result,
            http_status=http_status,
            total=total,
            succeeded=succeeded,
            failed=total - succeeded,
            latency_ms=int((trio.current_time() - started) * 1000),
        )
        items = op.records
        items.append(Append(op.stream, finished))
        op.records = []  # a second _finish (cancelled during the first) must not repeat them
        if op.ctx.audit is not None:
            items.append(Append("audit", op.ctx.audit(http_status)))
        try:
            # Outcomes, finish and audit: one transaction, durable before the answer.
            return await self._append_fenced(op, items)
        except JournalWriteError:
            # The engines were already called: hiding their answers would be worse than
            # answering without a durable record. The response says so (x-smgrl-journal).
            if not quiet:
                log.error(
                    "journal write failed; answering without a durable record",
                    extra={"fields": {"op_id": op.op_id}},
                )
            return False

"""Control operations with their journal records, metrics and logs.

Journal order for every operation (stream ``op:<id>``):

1. ``control.started`` — awaited (durable) BEFORE any engine is called: if the gateway dies
   mid-call, the journal still says which engines may have been touched, and restart records the
   operation as interrupted. If the journal cannot take it, no engine is called (503).
2. ``control.outcome`` per target — queued as each answer arrives (not awaited one by one: the
   writer commits them in order, so step 3 makes them durable too).
3. ``control.finished`` — awaited before the response is sent, so a client never sees a result
   the journal does not have.

A client that disconnects cancels the handler and every engine call still in flight; a shielded
step then records ``control.finished`` with result ``cancelled`` and the outcomes that did arrive.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs
import trio

from journal import JournalWriteError
from journal.events import ControlStarted
from smgrl.config import RlConfig
from smgrl.control.call import ControlRequest, call_worker
from smgrl.control.fanout import run_fanout
from smgrl.control.outcome import Outcome, fanout_body
from smgrl.core.observe import intent_of
from smgrl.core.path import metric_op
from smgrl.core.selector import Selector
from smgrl.core.view import collapse, control_url, selector_view
from smgrl.core.worker import Worker, new_worker_id
from smgrl.errors import JournalUnavailable
from smgrl.journaling import ev
from smgrl.logs import event as log_event

log = logging.getLogger("smgrl.rl")

# A dead journal must not hold a cancelled request forever: the shielded record gives up after this.
SHIELDED_RECORD_SECS = 10.0


@attrs.frozen
class CallContext:
    principal: str | None = None
    request_id: str | None = None


@attrs.frozen
class OpResult:
    status: int
    body: dict | None
    op_id: str
    journaled: bool = True


class ControlService:
    def __init__(self, *, fleet, journal, pools, keys, rl: RlConfig, metrics) -> None:
        self.fleet = fleet
        self.journal = journal
        self.pools = pools
        self.keys = keys
        self.rl = rl
        self.metrics = metrics

    # -- targets -------------------------------------------------------------------------------

    def targets(self, selector: Selector) -> list[Worker]:
        """§7: the DP-collapsed representatives whose merged label view matches, in row order.
        No implicit health or type filter."""
        facts = self.fleet.facts()
        out = []
        for group in collapse(self.fleet.registry):
            w = group.representative
            if selector.matches(selector_view(w, facts.get(w.base_url))):
                out.append(w)
        return out

    # -- operations ----------------------------------------------------------------------------

    async def call(self, worker: Worker, req: ControlRequest, ctx: CallContext) -> OpResult:
        started = trio.current_time()
        op_id = await self._start("call", req, None, [worker], ctx)
        outcome = None
        try:
            outcome = await self._call_one(worker, req, op_id)
        finally:
            if outcome is None:
                await self._record_cut_short(op_id, 1, 0, started)
        if outcome.error is not None:
            status, body = outcome.error.status, outcome.error.body()
        else:
            status, body = outcome.status, outcome.envelope()
        journaled = await self._finish(
            op_id, "ok" if outcome.ok else "failed", status, 1, int(outcome.ok), started
        )
        return OpResult(status, body, op_id, journaled)

    async def fanout(
        self, selector: Selector, targets: Sequence[Worker], req: ControlRequest, ctx: CallContext
    ) -> OpResult:
        started = trio.current_time()
        op_id = await self._start("fanout", req, selector.source, targets, ctx)
        outcomes: list[Outcome] = []
        done = False
        try:
            await run_fanout(
                targets,
                lambda w: self._call_one(w, req, op_id),
                self.rl.fanout_concurrency,
                lambda w, o: outcomes.append(o),
            )
            done = True
        finally:
            if not done:
                await self._record_cut_short(op_id, len(targets), sum(o.ok for o in outcomes), started)
        modes = {w.id: w.connection_mode for w in targets}
        status, body = fanout_body(outcomes, modes)
        result = "ok" if status == 200 else "partial"
        elapsed = trio.current_time() - started
        if self.metrics.rl_enabled:
            self.metrics.fanout(result, elapsed)
        log_event(
            log,
            "rl.fanout",
            path=req.path,
            selector=selector.source,
            total=body["total"],
            succeeded=body["succeeded"],
            failed=len(body["failed"]),
            latency_ms=int(elapsed * 1000),
        )
        journaled = await self._finish(op_id, result, status, len(targets), body["succeeded"], started)
        return OpResult(status, body, op_id, journaled)

    async def no_match(self, selector: Selector, req: ControlRequest, ctx: CallContext) -> OpResult:
        started = trio.current_time()
        op_id = await self._start("fanout", req, selector.source, [], ctx)
        if self.metrics.rl_enabled:
            self.metrics.fanout("no_match", trio.current_time() - started)
        journaled = await self._finish(op_id, "no_match", 400, 0, 0, started)
        return OpResult(400, None, op_id, journaled)

    # -- steps ---------------------------------------------------------------------------------

    async def _record_cut_short(self, op_id: str, total: int, succeeded: int, started: float) -> None:
        """The request was cancelled (client disconnected, shutdown past its grace period) or
        failed mid-operation. Shielded: the client is gone, but the journal must still say that the
        operation ended cancelled; the outcomes that arrived are already queued before this record.
        Bounded, so a dead journal cannot hold a cancelled request forever."""
        with trio.CancelScope(shield=True), trio.move_on_after(SHIELDED_RECORD_SECS):
            await self._finish(op_id, "cancelled", 499, total, succeeded, started, quiet=True)

    async def _call_one(self, worker: Worker, req: ControlRequest, op_id: str) -> Outcome:
        outcome = await call_worker(
            worker, self.keys.get(worker.group), req, self.pools, self.rl.control_timeout_secs
        )
        result = outcome.metric_result
        if result is not None and self.metrics.rl_enabled:
            self.metrics.control_call(metric_op(req.path), result, outcome.latency_ms / 1000)
        if outcome.answered:
            log_event(
                log,
                "rl.proxy",
                worker_id=worker.id,
                url=worker.url,
                control_url=outcome.control_url,
                method=req.method,
                path=req.path,
                status=outcome.status,
                latency_ms=outcome.latency_ms,
            )
        err = outcome.error
        # Queued, not awaited: the awaited control.finished that follows makes it durable.
        self.journal.append_nowait(
            f"op:{op_id}",
            ev(
                "control.outcome",
                op_id=op_id,
                worker_id=worker.id,
                url=worker.url,
                control_url=outcome.control_url,
                status=outcome.status,
                latency_ms=outcome.latency_ms,
                error=err.code if err else None,
                message=err.message if err else None,
                excerpt=outcome.excerpt(),
                body_truncated=outcome.body_truncated,
            ),
        )
        return outcome

    async def _start(
        self,
        kind: str,
        req: ControlRequest,
        selector: str | None,
        targets: Sequence[Worker],
        ctx: CallContext,
    ) -> str:
        op_id = new_worker_id()
        event = ev(
            "control.started",
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
        )
        try:
            await self.journal.append(f"op:{op_id}", event)
        except JournalWriteError as exc:
            # No record, no engine call: an unrecorded refit is exactly what the journal prevents.
            raise JournalUnavailable(f"the journal cannot record this operation: {exc}") from exc
        return op_id

    async def _finish(
        self,
        op_id: str,
        result: str,
        http_status: int,
        total: int,
        succeeded: int,
        started: float,
        quiet: bool = False,
    ) -> bool:
        event = ev(
            "control.finished",
            op_id=op_id,
            result=result,
            http_status=http_status,
            total=total,
            succeeded=succeeded,
            failed=total - succeeded,
            latency_ms=int((trio.current_time() - started) * 1000),
        )
        try:
            await self.journal.append(f"op:{op_id}", event)
            return True
        except JournalWriteError:
            # The engines were already called: hiding their answers would be worse than
            # answering without a durable record. The response says so (x-smgrl-journal).
            if not quiet:
                log.error(
                    "journal write failed; answering without a durable record",
                    extra={"fields": {"op_id": op_id}},
                )
            return False

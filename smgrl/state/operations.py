"""Control operations (per-worker calls and fan-outs) as a projection of ``control.*`` events.

Two uses: the gateway must know which operations are still open (at shutdown and after a crash it
records them as interrupted, naming the targets whose outcomes were recorded), and
``GET /v1/rl/operations/{id}`` serves recent operations from memory. Memory stays bounded: only
open operations and the most recent finished ones (at most ``RECENT`` operations and
``RECENT_TARGETS`` targets) are kept; older ones are read back
from the journal file on demand.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import attrs

from smgrl.events import ControlFinished, ControlInterrupted, ControlOutcome, ControlStarted
from smgrl.state.records import exact_record

RECENT = 4096
# The cache of finished operations is also bounded by their targets: one outcome per target, so a
# count bound alone let 4096 fan-outs of 64 engines hold 262,144 outcomes (hundreds of MiB; found by
# benchmarks/load.py: +66% resident memory over 1,000 fan-outs). The newest operation is always kept.
RECENT_TARGETS = 4096


@attrs.define
class OpRecord:
    op_id: str
    kind: str
    method: str
    path: str
    query: str | None
    selector: str | None
    targets: list[dict[str, Any]]
    started_seq: int
    principal: str | None = None
    request_id: str | None = None
    outcomes: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    result: str | None = None  # None while open
    http_status: int | None = None
    latency_ms: int | None = None
    missing: list[str] = attrs.field(factory=list)

    def to_json(self) -> dict[str, Any]:
        succeeded = sum(
            1
            for o in self.outcomes.values()
            if o.get("error") is None and o.get("status") is not None and 200 <= o["status"] < 300
        )
        return {
            "operation_id": self.op_id,
            "kind": self.kind,
            "method": self.method,
            "path": self.path,
            "query": self.query,
            "selector": self.selector,
            "status": "open" if self.result is None else "finished",
            "result": self.result,
            "http_status": self.http_status,
            "total": len(self.targets),
            "succeeded": succeeded,
            "latency_ms": self.latency_ms,
            "targets": [{**t, "outcome": self.outcomes.get(t["worker_id"])} for t in self.targets],
            "missing_targets": self.missing,
            "started_seq": self.started_seq,
        }


_OP_FIELDS = frozenset(f.name for f in attrs.fields(OpRecord))


def _op_json(op: OpRecord) -> dict[str, Any]:
    data = attrs.asdict(op, recurse=False)
    data["targets"] = [dict(t) for t in op.targets]
    data["outcomes"] = {wid: dict(o) for wid, o in op.outcomes.items()}
    data["missing"] = list(op.missing)
    return data


@attrs.frozen
class OperationsSnapshot:
    """The open operations as plain data (``Operations.to_snapshot``). OpRecords are mutable
    (outcomes arrive), so each is copied when the snapshot is taken. The cache of recently
    finished operations is not part of it (``GET /v1/rl/operations/{id}`` falls back to the
    journal file)."""

    open: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {"open": self.open}


class Operations:
    def __init__(self, recent: int = RECENT, recent_targets: int = RECENT_TARGETS) -> None:
        self.open: dict[str, OpRecord] = {}
        self.recent: OrderedDict[str, OpRecord] = OrderedDict()
        self._cap = recent
        self._target_cap = recent_targets
        self._recent_targets = 0

    def get(self, op_id: str) -> OpRecord | None:
        return self.open.get(op_id) or self.recent.get(op_id)

    # -- the snapshot contract (smgrl.state.snapshot) -------------------------------------------

    def to_snapshot(self) -> OperationsSnapshot:
        return OperationsSnapshot([_op_json(op) for op in self.open.values()])

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> Operations:
        """The open operations an ``OperationsSnapshot.to_json`` describes (SnapshotError, or
        KeyError, TypeError, ValueError when it does not fit); the recent cache starts empty."""
        state = cls()
        for raw in data["open"]:
            op = OpRecord(**exact_record(raw, _OP_FIELDS, "operation"))
            state.open[op.op_id] = op
        return state

    def apply(self, seq: int, ev: object) -> None:
        """Fold one journal record (any type: the control events change the operations)."""
        if isinstance(ev, ControlStarted):
            # The event's fields copied into the record (shaped like other folds' copies; each its own fields).
            self.open[ev.op_id] = OpRecord(
                op_id=ev.op_id,
                kind=ev.kind,
                method=ev.method,
                path=ev.path,
                query=ev.query,
                selector=ev.selector,
                targets=list(ev.targets),
                started_seq=seq,
                principal=ev.principal,
                request_id=ev.request_id,
            )
        elif isinstance(ev, ControlOutcome):
            op = self.open.get(ev.op_id)
            if op is not None:
                op.outcomes[ev.worker_id] = {
                    "status": ev.status,
                    "latency_ms": ev.latency_ms,
                    "error": ev.error,
                    "message": ev.message,
                    "excerpt": ev.excerpt,
                    "body_truncated": ev.body_truncated,
                }
        elif isinstance(ev, ControlFinished):
            op = self.open.pop(ev.op_id, None)
            if op is not None:
                op.result, op.http_status, op.latency_ms = ev.result, ev.http_status, ev.latency_ms
                op.missing = [t["worker_id"] for t in op.targets if t["worker_id"] not in op.outcomes]
                self._remember(op)
        elif isinstance(ev, ControlInterrupted):
            op = self.open.pop(ev.op_id, None)
            if op is not None:
                op.result = "interrupted"
                op.missing = list(ev.missing_targets)
                self._remember(op)

    def _remember(self, op: OpRecord) -> None:
        old = self.recent.pop(op.op_id, None)
        if old is not None:
            self._recent_targets -= len(old.targets)
        self.recent[op.op_id] = op
        self._recent_targets += len(op.targets)
        while len(self.recent) > 1 and (
            len(self.recent) > self._cap or self._recent_targets > self._target_cap
        ):
            _, evicted = self.recent.popitem(last=False)
            self._recent_targets -= len(evicted.targets)
        if len(self.recent) == 1:
            self._recent_targets = len(op.targets)  # exact again (e.g. after recent.clear())

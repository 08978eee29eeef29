"""Refit cycles: control operations grouped into pause -> update(s) -> resume (pure, no I/O).

Two folds. ``OpsFold`` assembles operations from ``control.*`` events given as
``(seq, ts, type, payload dict)``; outcomes may be fed for some operations only (a fully
successful operation needs none: its targets all answered 2xx). ``group_cycles`` then walks the
operations in start order:

* a ``pause``-phase op starts a cycle (or joins the newest open one that has not got past
  pausing yet: per-engine pauses, retries);
* an ``update``-phase op joins the newest open cycle sharing an engine with it, or starts an
  *unpaused* cycle; ``setup``, ``teardown``, ``flush``, ``sleep`` and ``wake`` ops join the newest
  open cycle sharing an engine, and are not refits on their own;
* a ``resume``-phase op joins that cycle and closes it once every engine of the cycle was resumed;
* an unpaused cycle is complete at the update that sets a version, or at any update that is not
  one step of a longer transfer (chunks, session openers); a paused cycle without resume stays
  ``open``, or becomes ``abandoned`` when a later pause takes over one of its engines.

Phases come from the op's recorded intent (``smgrl.core.observe.PHASES``), which covers SGLang
(pause_generation / update_weights_from_disk|tensor|distributed / continue_generation), vLLM
(pause / collective_rpc or the weight-transfer calls / resume) and TokenSpeed
(init_weights_update_group / update_weights_from_distributed chunks / destroy_weights_update_group).
Engines are engine addresses (``strip_rank`` of the target URL): DP ranks share one.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import attrs

from smgrl.core import PHASES, strip_rank

__all__ = ["PHASE_ORDER", "Cycle", "Op", "OpsFold", "Span", "group_cycles", "iter_cycles", "phase_of"]

PHASE_ORDER = ("pause", "setup", "update", "flush", "teardown", "sleep", "wake", "resume")
_ORDER = {p: i for i, p in enumerate(PHASE_ORDER)}
_JOINERS = frozenset({"setup", "teardown", "flush", "sleep", "wake"})
# Update calls that are one step of a longer transfer (chunks, or a session opener): without a
# pause around them, the refit they belong to goes on until a version is set or another call ends it.
_OPEN_ENDED = frozenset(
    {
        "update_weights_from_distributed",
        "update_weights_from_tensor",
        "update_weights",
        "begin_weight_update",
        "start_weight_update",
    }
)


def phase_of(path: str, intent: dict[str, Any] | None, method: str = "POST") -> str | None:
    """The refit phase of a call: its recorded intent's phase, else the path's (older records)."""
    if intent and intent.get("phase"):
        return str(intent["phase"])
    if method == "HEAD":
        return None
    return PHASES.get(path.lstrip("/"))


@attrs.frozen
class Span:
    """One target of one op on the timeline: what happened on ``engine`` from ``start`` to ``end``."""

    engine: str
    worker_id: str
    phase: str
    start: float
    end: float
    state: str  # ok | failed | missing (no outcome: cut short, interrupted, still running)
    op_id: str
    detail: str | None = None


@attrs.define
class Op:
    op_id: str
    seq: int
    start: float
    kind: str
    method: str
    path: str
    selector: str | None
    phase: str | None
    version: str | None
    targets: dict[str, str]  # worker_id -> engine address
    outcomes: dict[str, tuple[float, int | None, str | None, int]] = attrs.Factory(dict)
    end: float | None = None
    result: str | None = None  # None while open; "interrupted" when a restart/shutdown closed it
    total: int = 0
    succeeded: int = 0
    failed: int = 0
    latency_ms: int | None = None

    engines: frozenset[str] = frozenset()  # the distinct engine addresses of the targets

    @property
    def clean(self) -> bool:
        """Finished and every target answered 2xx (so no outcome needs to be read)."""
        return self.result == "ok" and self.failed == 0

    @property
    def last_ts(self) -> float:
        if self.end is not None:
            return self.end
        return max([self.start, *(o[0] for o in self.outcomes.values())])

    def spans(self) -> list[Span]:
        """Per target: an answer (ok/failed, from when it was asked to when it answered), or none."""
        out = []
        clean = self.clean
        for wid, engine in self.targets.items():
            o = self.outcomes.get(wid)
            if o is not None:
                ts, status, error, latency = o
                ok = error is None and status is not None and 200 <= status < 300
                detail = None if ok else (f"{error}" if error else f"HTTP {status}")
                start = max(self.start, ts - latency / 1000)
                out.append(
                    Span(
                        engine, wid, self.phase or "", start, ts, "ok" if ok else "failed", self.op_id, detail
                    )
                )
            elif clean:
                out.append(Span(engine, wid, self.phase or "", self.start, self.last_ts, "ok", self.op_id))
            else:
                why = "no outcome (" + (self.result or "still running") + ")"
                out.append(
                    Span(engine, wid, self.phase or "", self.start, self.last_ts, "missing", self.op_id, why)
                )
        return out


class OpsFold:
    """Operations from ``control.*`` events (payloads as parsed JSON dicts), by op id."""

    def __init__(self) -> None:
        self.ops: dict[str, Op] = {}
        self._engine_of: dict[str, str] = {}  # url -> engine address (a fleet has few URLs)
        # id(targets list) -> (that list, worker -> engine, engines): readers that hand in the
        # same parsed list for identical targets (smgrl.history.opscan) convert it once.
        # Holding the list keeps its id from being reused.
        self._targets_memo: dict[int, tuple[list[Any], dict[str, str], frozenset[str]]] = {}

    def _targets(self, raw: Any) -> tuple[dict[str, str], frozenset[str]]:
        memo = self._targets_memo.get(id(raw))
        if memo is not None and memo[0] is raw:
            return memo[1], memo[2]
        targets = {t["worker_id"]: self._engine(t.get("url") or "") for t in raw or ()}
        engines = frozenset(targets.values())
        if isinstance(raw, list):
            self._targets_memo[id(raw)] = (raw, targets, engines)
        return targets, engines

    def _engine(self, url: str) -> str:
        engine = self._engine_of.get(url)
        if engine is None:
            engine = self._engine_of[url] = strip_rank(url)
        return engine

    def apply(self, seq: int, ts: float, type_: str, p: dict[str, Any]) -> None:
        if type_ == "control.started":
            intent = p.get("intent")
            targets, engines = self._targets(p.get("targets"))
            self.ops[p["op_id"]] = Op(
                op_id=p["op_id"],
                seq=seq,
                start=ts,
                kind=p.get("kind", "call"),
                method=p.get("method", ""),
                path=p.get("path", ""),
                selector=p.get("selector"),
                phase=phase_of(p.get("path", ""), intent, p.get("method", "POST")),
                version=(intent or {}).get("version"),
                targets=targets,
                total=len(targets),
                engines=engines,
            )
            return
        op = self.ops.get(p.get("op_id", ""))
        if op is None:
            return  # its start is outside what was read
        if type_ == "control.outcome":
            op.outcomes[p["worker_id"]] = (ts, p.get("status"), p.get("error"), int(p.get("latency_ms") or 0))
        elif type_ == "control.finished":
            op.end, op.result = ts, p.get("result")
            op.total, op.succeeded, op.failed = p.get("total", 0), p.get("succeeded", 0), p.get("failed", 0)
            op.latency_ms = p.get("latency_ms")
        elif type_ == "control.interrupted" and op.result is None:
            op.end, op.result = ts, "interrupted"

    def needs_outcomes(self, op: Op) -> bool:
        """Whether ``op``'s targets can only be told apart by their control.outcome events."""
        return not op.clean and bool(op.targets)

    def in_order(self) -> list[Op]:
        return sorted(self.ops.values(), key=lambda o: o.seq)


@attrs.define
class Cycle:
    index: int  # the seq of its first operation's control.started: stable, whatever was read
    paused: bool
    ops: list[Op] = attrs.Factory(list)
    engines: dict[str, None] = attrs.Factory(dict)  # insertion-ordered set
    resumed: set[str] = attrs.Factory(set)
    stage: str = "pausing"  # pausing | updating | resuming | done
    # open | ok | failed | abandoned; a refit saga's cycle, once told by it (``settle``): the
    # saga's result (succeeded | quarantined | partial | failed | rolled_back | aborted)
    status: str = "open"
    _phases: dict[str, tuple[float, float, int]] | None = None  # cache, reset by add()
    _clean: bool = False  # finished without failures (iter_cycles): failures() is {}
    _told: dict[str, list[str]] | None = None  # the saga's own failures (``settle``)

    def add(self, op: Op) -> None:
        self._phases, self._clean = None, False
        self.ops.append(op)
        # In C: an engine already in the set keeps its place (as setdefault would). Most ops of
        # a cycle target its engines again: the subset test skips building a dict for them.
        if not (op.engines and self.engines.keys() >= op.engines):
            self.engines.update(dict.fromkeys(op.targets.values()))

    @property
    def start(self) -> float:
        return self.ops[0].start

    @property
    def end(self) -> float:
        return max(op.last_ts for op in self.ops)

    @property
    def version(self) -> str | None:
        """The last version an update of this cycle set on at least one engine (else attempted)."""
        tried = None
        for op in reversed(self.ops):  # the newest first: read once per cycle, 30,000 at --all
            if op.version is not None:
                if _any_ok(op):
                    return op.version
                if tried is None:
                    tried = op.version
        return tried

    def spans(self) -> list[Span]:
        return [span for op in self.ops for span in op.spans()]

    def phases(self) -> dict[str, tuple[float, float, int]]:
        """phase -> (first start, last end, ops), in refit order."""
        if self._phases is None:
            self._phases = self._compute_phases()
        return self._phases

    def _compute_phases(self) -> dict[str, tuple[float, float, int]]:
        ops = self.ops
        if len(ops) == 3:
            # The usual cycle, pause -> update -> resume, one op each (30,000 at --all): each
            # phase is its one op, already in refit order (what the general case below gives).
            a, b, c = ops
            if a.phase == "pause" and b.phase == "update" and c.phase == "resume":
                return {
                    "pause": (a.start, a.end if a.end is not None else a.last_ts, 1),
                    "update": (b.start, b.end if b.end is not None else b.last_ts, 1),
                    "resume": (c.start, c.end if c.end is not None else c.last_ts, 1),
                }
        return _phases_of(ops)

    def settle(self, saga: dict[str, Any]) -> None:
        """Tell a refit saga's cycle in the saga's words (``GET /v1/rl/refits/{id}`` record): its
        result, and per engine the saga's reason for the engines it did not resume on the new
        version. The saga decided from more than these operations: a load cut short by a crash
        that it read back and confirmed is not a failure, and an engine it quarantined is
        ``quarantined`` here too. An open saga's cycle keeps what its operations say."""
        if saga.get("result") is None:
            return
        self.status = saga["result"]
        told: dict[str, list[str]] = {}
        for e in saga.get("engines", ()):
            if e.get("status") == "resumed" or (e.get("status") == "rolled_back" and not e.get("failure")):
                continue
            why = e.get("failure") or e.get("detail") or "-"
            told.setdefault(strip_rank(e.get("url") or ""), []).append(f"{e.get('status')}: {why}")
        self._told = told

    def failures(self) -> dict[str, list[str]]:
        """engine -> what went wrong there (failed or unanswered calls, never resumed)."""
        if self._told is not None:
            return self._told
        if self._clean:
            return {}
        out: dict[str, list[str]] = {}
        for op in self.ops:
            if op.clean:
                continue  # every target answered 2xx: nothing to report, no spans to build
            for span in op.spans():
                if span.state != "ok":
                    out.setdefault(span.engine, []).append(f"{span.phase}: {span.detail}")
        if self.paused and self.stage in ("resuming", "done") and not self.engines.keys() <= self.resumed:
            for engine in self.engines:
                if engine not in self.resumed:
                    out.setdefault(engine, []).append("resume: never resumed")
        return out

    # A to_json of its own fields (shaped like every record's to_json; nothing to share).
    def to_json(self) -> dict[str, Any]:
        return {
            "cycle": self.index,
            "status": self.status,
            "paused": self.paused,
            "version": self.version,
            "start": self.start,
            "end": self.end,
            "duration_ms": round((self.end - self.start) * 1000, 1),
            "engines": list(self.engines),
            "phases": {
                p: {"start": s, "end": e, "duration_ms": round((e - s) * 1000, 1), "ops": n}
                for p, (s, e, n) in self.phases().items()
            },
            "failed": self.failures(),
            "ops": [op.op_id for op in self.ops],
        }


def _phases_of(ops: Iterable[Op]) -> dict[str, tuple[float, float, int]]:
    """phase -> (first start, last end, ops) of these ops, in refit order (Cycle.phases)."""
    acc: dict[str, list[float]] = {}
    for op in ops:
        start, last = op.start, op.end if op.end is not None else op.last_ts
        cur = acc.get(op.phase or "")
        if cur is None:  # most phases have one op
            acc[op.phase or ""] = [start, last, 1]
        else:
            cur[0], cur[1], cur[2] = min(cur[0], start), max(cur[1], last), cur[2] + 1
    ordered = sorted(acc.items(), key=lambda kv: (_ORDER.get(kv[0], 99), kv[1][0]))
    return {p: (v[0], v[1], int(v[2])) for p, v in ordered}


def _any_ok(op: Op) -> bool:
    return op.succeeded > 0 or (not op.clean and any(s.state == "ok" for s in op.spans()))


def group_cycles(ops: Iterable[Op]) -> list[Cycle]:
    """Group operations (in start order) into refit cycles; see the module docstring."""
    return list(iter_cycles(ops))


def iter_cycles(ops: Iterable[Op]) -> Iterator[Cycle]:
    """``group_cycles`` as a stream: each cycle is yielded once it and every cycle started before
    it are done (or the ops ran out), so only the cycles since the oldest open one are held."""
    cycles: deque[Cycle] = deque()  # started, not yet yielded, in start order
    live: list[Cycle] = []  # cycles that may still take ops, oldest first

    def touching(engines: frozenset[str]) -> Cycle | None:
        for c in reversed(live):
            if not engines.isdisjoint(c.engines):
                return c
        return None

    def finish(c: Cycle, status: str | None = None) -> None:
        live.remove(c)
        if status is None:
            if None in [op.result for op in c.ops]:
                status = "open"  # its last call is still running
            elif c.failures():
                status = "failed"
            else:
                # Nothing failed, every target that needed an outcome had one (else it would be
                # "missing"): no outcome read later can change that, so rows need not ask again.
                # (Asked before stage is "done": the same answer, as only a cycle that began
                # resuming, or an unpaused one, ends here with status None.)
                status, c._clean = "ok", True
        c.status, c.stage = status, "done"

    def start(op: Op, paused: bool) -> Cycle:
        # Cycle(...) then add(op), positionally (30,000 cycles at --all): index, paused, ops,
        # engines, resumed, stage.
        c = Cycle(
            op.seq,
            paused,
            [op],
            dict.fromkeys(op.targets.values()),
            set(),
            "pausing" if paused else "updating",
        )
        cycles.append(c)
        live.append(c)
        return c

    c: Cycle | None
    for op in ops:
        if not op.targets or op.phase is None:
            continue
        engines = op.engines
        if op.phase == "pause":
            newest = live[-1] if live else None
            if newest is not None and newest.paused and newest.stage == "pausing":
                newest.add(op)
                continue
            for c in [c for c in live if not engines.isdisjoint(c.engines)]:
                # A new pause takes these engines over: an unpaused cycle is complete, a paused
                # one that began resuming ended there, one that never resumed was abandoned.
                finish(c, None if (not c.paused or c.stage == "resuming") else "abandoned")
            start(op, paused=True)
        elif op.phase == "update":
            c = touching(engines)
            if c is None:
                c = start(op, paused=False)
            else:
                c.add(op)
                c.stage = "updating" if c.stage == "pausing" else c.stage
            if not c.paused and (op.version is not None or op.path.lstrip("/") not in _OPEN_ENDED):
                finish(c)  # an unpaused refit is complete once it set a version (or one call did it all)
        elif op.phase == "resume":
            c = touching(engines)
            if c is None or not c.paused:
                continue  # a resume outside any refit (or after an unpaused update)
            c.add(op)
            c.stage = "resuming"
            c.resumed |= engines
            if c.engines.keys() <= c.resumed:
                finish(c)
        elif op.phase in _JOINERS:
            c = touching(engines)
            if c is not None:
                c.add(op)
        while cycles and cycles[0].stage == "done":
            yield cycles.popleft()
    for c in live:
        c.status = "open"
    yield from cycles

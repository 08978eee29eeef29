"""Every change of an engine's weight version, version status or version source (pure).

``smgrl journal versions`` reads this over a whole journal, so it must cost the events that can
change a version, not the journal: registry events, ``engine.version_set``, and the operations
whose intent sets a version (their start, outcomes and end). Operations that only pause or resume
never touch a version (``EngineStates``: their outcomes and their end change ``control`` only),
so they are not read at all.

The fold keeps, per engine address, the version fields of ``EngineFacts`` with exactly the rules
of ``smgrl.state.engines.EngineStates`` restricted to those fields (a 2xx answer to a call that
sets V confirms V; an exchange that stopped at ``head`` or ``body`` makes the version unknown; a fan-out that moved some targets to V
leaves the others that are not at V ``mixed``; an explicit write sets V from ``api``; discovery
seeds an engine insert-if-absent; the last removal forgets it). Outcomes arrive as light tuples
(``Outcome``) so a million-event journal folds in well under a second.
``tests/journal_cli/test_history.py`` checks it against the full ``FleetState`` fold.

What a row shows is what ``smgrl journal workers`` shows for the engine: the version the journal
knows, else the registration label, with its source (``registration`` when the label is all there
is). Nothing known (no version, no label) is no row.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from smgrl.core import strip_rank
from smgrl.state.registry import TYPES as registry_types
from smgrl.state.registry import RegistryState

__all__ = ["OK", "SETTLED", "UNKNOWN", "Change", "VersionFold", "display"]

# What an outcome did to its target (computed by the reader, the engine projection's rule):
OK, UNKNOWN, SETTLED = 1, 2, 0  # 2xx / no usable answer (timeout, cut-off body) / anything else

_NOTHING = (None, None, True, False)  # version, source, known, mixed: an engine with no facts


class Change(NamedTuple):
    """Engines whose shown version became the same value through one event (or one operation)."""

    seq: int
    engines: tuple[str, ...]
    weight_version: str | None
    version_source: str | None
    version_status: str
    op_id: str | None


class _OpenVersionOp:
    __slots__ = ("settled", "succeeded", "targets", "version")

    def __init__(self, version: str, targets: dict[str, str]) -> None:
        self.version, self.targets = version, targets
        self.succeeded: set[str] = set()
        self.settled: set[str] = set()


# An engine's version facts: (version, source, known, mixed).
Facts = tuple[str | None, str | None, bool, bool]
# What is shown of them: (weight_version, version_source, version_status).
Shown = tuple[str | None, str | None, str]


def display(facts: Facts, label: str | None) -> Shown | None:
    """(weight_version, version_source, version_status) as shown; None when nothing is known."""
    version, source, known, mixed = facts
    status = "unknown" if not known else "mixed" if mixed else "consistent"
    if version is None:
        version = label
        if source is None and label is not None:
            source = "registration"
    if version is None and source is None and status == "consistent":
        return None
    return version, source, status


class VersionFold:
    """Feed it events in seq order (``event`` for decoded registry/engine events, ``started``,
    ``outcome`` and ``closed`` for the operations that set a version); it yields Changes."""

    def __init__(self) -> None:
        self.registry = RegistryState()
        self.facts: dict[str, Facts] = {}
        self._open: dict[str, _OpenVersionOp] = {}
        self._shown: dict[str, Shown | None] = {}
        self._first: dict[str, str] = {}

    # -- what changed ---------------------------------------------------------------------------

    def _label(self, base: str) -> str | None:
        """The registration label of the engine's first worker (registration order)."""
        wid = self._first.get(base)
        w = self.registry.get(wid) if wid is not None else None
        return w.labels.get("weight_version") if w is not None else None

    def _index(self, event: Any, count_before: int) -> None:
        """Keep ``_first`` (engine address -> its first worker in registration order) up to date
        without scanning the registry per event: a registration appends; a removal or a DP
        expansion (rare) rebuilds it."""
        workers = self.registry.workers
        kind = event.TYPE
        added = len(workers) - count_before
        if kind == "worker.registered" and added >= 0:
            for wid in reversed(list(itertools.islice(reversed(workers), added))):
                self._first.setdefault(workers[wid].base_url, wid)
        elif added or kind == "worker.removed" or (kind == "worker.discovered" and event.dp_rank_ids):
            self._first = {}
            for w in workers.values():
                self._first.setdefault(w.base_url, w.id)

    def _check(self, seq: int, base: str, op_id: str | None) -> Iterator[Change]:
        facts = self.facts.get(base)
        shown = None if facts is None else display(facts, self._label(base) if facts[0] is None else None)
        if shown != self._shown.get(base):
            self._shown[base] = shown
            if shown is not None:
                yield Change(seq, (base,), *shown, op_id)

    # -- events -----------------------------------------------------------------------------------

    def event(self, seq: int, event: Any) -> Iterator[Change]:
        """A registry event or ``engine.version_set`` (decoded)."""
        kind = getattr(event, "TYPE", None)
        if kind == "engine.version_set":
            bases = list(dict.fromkeys(t["base_url"] for t in event.targets if t.get("base_url")))
            for base in bases:
                self.facts[base] = (event.weight_version, "api", True, False)
            for base in bases:
                yield from self._check(seq, base, None)
            return
        removed = None
        if kind == "worker.removed":
            w = self.registry.get(event.worker_id)
            removed = w.base_url if w is not None else None
        before = self.registry.get(getattr(event, "worker_id", ""))
        count = len(self.registry.workers)
        self.registry.apply(seq, event)
        if kind in registry_types:
            self._index(event, count)
        after = self.registry.get(getattr(event, "worker_id", ""))
        if kind == "worker.discovered" and after is not None and after.base_url not in self.facts:
            label = (event.labels or {}).get("weight_version")
            versioned = label not in (None, "", "default")
            self.facts[after.base_url] = (None, "registration" if versioned else None, True, False)
        if removed is not None and removed not in self._first:
            # The last worker at that address went: its facts go, and open operations stop
            # tracking it (EngineStates.forget: an engine registered there again is a new one).
            self.facts.pop(removed, None)
            for op in self._open.values():
                for wid in [w for w, base in op.targets.items() if base == removed]:
                    del op.targets[wid]
        changed = {w.base_url for w in (before, after) if w is not None}
        if removed is not None:
            changed.add(removed)
        for base in changed:
            yield from self._check(seq, base, None)

    def started(
        self, op_id: str, version: str, targets: Iterable[dict[str, Any]], bases: dict[str, str] | None = None
    ) -> None:
        """``bases``: ``targets`` as worker id -> engine address already (readers that see the
        same targets many times convert them once); copied, the fold edits it."""
        if bases is None:
            bases = {t["worker_id"]: strip_rank(t["url"]) for t in targets}
        self._open[op_id] = _OpenVersionOp(version, dict(bases))

    def outcome(self, seq: int, op_id: str, worker_id: str, kind: int) -> Iterator[Change]:
        op = self._open.get(op_id)
        if op is None:
            return
        base = op.targets.get(worker_id)
        if base is None:
            return
        op.settled.add(worker_id)
        if kind == OK:
            op.succeeded.add(worker_id)
            self.facts[base] = (op.version, "passthrough", True, False)
        elif kind == UNKNOWN:
            version, source, _known, mixed = self.facts.get(base, _NOTHING)
            self.facts[base] = (version, source, False, mixed)
        else:
            return
        yield from self._check(seq, base, op_id)

    def closed(self, seq: int, op_id: str) -> Iterator[Change]:
        op = self._open.pop(op_id, None)
        if op is None:
            return
        touched = []
        for wid, base in op.targets.items():
            if wid not in op.settled:
                version, source, _known, mixed = self.facts.get(base, _NOTHING)
                self.facts[base] = (version, source, False, mixed)
                touched.append(base)
        if op.succeeded:
            for wid, base in op.targets.items():
                if wid in op.succeeded:
                    continue
                version, source, known, _mixed = self.facts.get(base, _NOTHING)
                if version != op.version:
                    self.facts[base] = (version, source, known, True)
                    touched.append(base)
        for base in dict.fromkeys(touched):
            yield from self._check(seq, base, op_id)

    def operation(
        self,
        op_id: str,
        version: str,
        targets: list[dict[str, Any]],
        outcomes: list[tuple[int, str, int]],
        close: int | None,
        bases: dict[str, str] | None = None,
    ) -> Iterator[Change]:
        """A whole operation at once (``started``, its outcomes in seq order, then ``closed`` at
        ``close`` unless it is still open), when no other event falls between its first and last.

        The common case (every target answered 2xx, once) is a loop over the targets: each is
        confirmed at V, nothing is left unknown or mixed at the end. Anything else goes event by
        event through the same methods as interleaved operations.
        """
        self.started(op_id, version, targets, bases)
        op = self._open[op_id]
        wids = [wid for _seq, wid, _kind in outcomes]
        if (
            close is None
            or len(wids) != len(op.targets)
            or set(wids) != op.targets.keys()
            or any(kind != OK for _seq, _wid, kind in outcomes)
        ):
            for seq, wid, kind in outcomes:
                yield from self.outcome(seq, op_id, wid, kind)
            if close is not None:
                yield from self.closed(close, op_id)
            return
        del self._open[op_id]
        facts, shown, targets_of = self.facts, self._shown, op.targets
        confirmed: Facts = (version, "passthrough", True, False)
        now: Shown = (version, "passthrough", "consistent")  # display(confirmed, ...)
        first, moved = 0, list[str]()
        for seq, wid, _kind in outcomes:
            base = targets_of[wid]
            facts[base] = confirmed
            if shown.get(base) != now:
                shown[base] = now
                if not moved:
                    first = seq
                moved.append(base)
        if moved:
            yield Change(first, tuple(moved), *now, op_id)

"""Engine state (weight version, control state) projected from confirmed control outcomes.

Keyed by engine address (``base_url``: DP ranks share one engine). The rules:

- a 2xx answer confirms the call's intent (``smgrl.core.observe``): version and/or control state;
- any other answer changes nothing (it is still in the journal);
- a call with no outcome (timeout, body cut off, client gone, gateway crash) leaves the engine
  ``unknown`` for what the call would have changed, until a later call confirms it;
- when a fan-out moved some targets to version V and others did not get there, those others are
  ``mixed``: their version differs from the one the rest of the fleet reached in the same refit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import attrs

from smgrl.core import EngineFacts, Intent, strip_rank
from smgrl.events import EngineStateSet, EngineVersionSet, WorkerDiscovered
from smgrl.state.records import exact_record

if TYPE_CHECKING:
    from smgrl.state.registry import RegistryState
    from smgrl.state.sagas import Quarantine


# The control events as this projection reads them: a decoded event, or the record of a reader
# that extracts only these fields from the journal (``smgrl journal workers --at``), with the
# event's ``TYPE``. Such a record is no event class: the fold tells the kinds apart by ``TYPE``.
class ControlRecord(Protocol):
    @property
    def op_id(self) -> str: ...


class StartedRecord(ControlRecord, Protocol):
    @property
    def targets(self) -> Iterable[Mapping[str, Any]]: ...


class OutcomeRecord(ControlRecord, Protocol):
    @property
    def worker_id(self) -> str: ...
    @property
    def status(self) -> int | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def stage(self) -> str | None: ...


TYPES = frozenset(
    {
        "worker.discovered",
        "worker.removed",
        "control.started",
        "control.outcome",
        "control.finished",
        "control.interrupted",
        "engine.version_set",
        "engine.state_set",
    }
)


@attrs.define
class _Open:
    intent: Intent
    targets: dict[str, str]  # worker_id -> engine base_url
    succeeded: set[str] = attrs.field(factory=set)
    settled: set[str] = attrs.field(factory=set)


_FACT_FIELDS = frozenset(f.name for f in attrs.fields(EngineFacts))


@attrs.frozen
class EnginesSnapshot:
    """A consistent copy of the engine projection (``EngineStates.to_snapshot``): facts are frozen
    values, shared; each open operation is copied as (op_id, intent, targets, succeeded, settled)."""

    revision: int
    engines: dict[str, EngineFacts]
    open: list[tuple[str, Intent, dict[str, str], list[str], list[str]]]

    def to_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "facts": {base: attrs.asdict(f) for base, f in self.engines.items()},
            "open": [
                {
                    "op_id": op_id,
                    "intent": {"version": i.version, "control": i.control, "phase": i.phase},
                    "targets": targets,
                    "succeeded": succeeded,
                    "settled": settled,
                }
                for op_id, i, targets, succeeded, settled in self.open
            ],
        }


class EngineStates:
    def __init__(self) -> None:
        self.engines: dict[str, EngineFacts] = {}
        self._open: dict[str, _Open] = {}
        self.revision = 0

    def get(self, base_url: str) -> EngineFacts | None:
        return self.engines.get(base_url)

    def changing(self) -> bool:
        """Whether a control call that sets a version or a control state is still running (a
        sync under way: rollouts held out by it wait for it to end)."""
        return bool(self._open)

    # -- the snapshot contract (smgrl.state.snapshot) -------------------------------------------

    def to_snapshot(self) -> EnginesSnapshot:
        return EnginesSnapshot(
            self.revision,
            dict(self.engines),
            [
                (op_id, o.intent, dict(o.targets), sorted(o.succeeded), sorted(o.settled))
                for op_id, o in self._open.items()
            ],
        )

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> EngineStates:
        """The projection an ``EnginesSnapshot.to_json`` describes; SnapshotError (or KeyError,
        TypeError, ValueError) when it does not fit."""
        state = cls()
        state.engines = {
            str(base): EngineFacts(**exact_record(f, _FACT_FIELDS, "engine"))
            for base, f in data["facts"].items()
        }
        for raw in data["open"]:
            intent = Intent.from_json(raw["intent"])
            state._open[str(raw["op_id"])] = _Open(
                intent, dict(raw["targets"]), set(raw["succeeded"]), set(raw["settled"])
            )
        state.revision = int(data["revision"])
        return state

    def apply(self, seq: int, event: object, registry: RegistryState) -> None:
        """Fold one record (any type). ``registry`` is the registry projection, already updated
        with it."""
        kind = getattr(event, "TYPE", None)
        if kind == "control.outcome":
            self._outcome(cast(OutcomeRecord, event))
        elif kind == "control.started":
            intent = Intent.from_json(getattr(event, "intent", None))
            if intent.version is not None or intent.control is not None:
                started = cast(StartedRecord, event)
                self._open[started.op_id] = _Open(
                    intent, {t["worker_id"]: strip_rank(t["url"]) for t in started.targets}
                )
        elif kind in ("control.finished", "control.interrupted"):
            self._close(cast(ControlRecord, event).op_id)
        elif isinstance(event, EngineVersionSet):
            # An explicit write is a confirmation: it clears mixed and unknown-version marks.
            for base in _bases(event.targets):
                self.engines[base] = attrs.evolve(
                    self._facts(base),
                    weight_version=event.weight_version,
                    version_source="api",
                    version_known=True,
                    mixed=False,
                )
            self.revision += 1
        elif isinstance(event, EngineStateSet):
            for base in _bases(event.targets):
                self.engines[base] = attrs.evolve(self._facts(base), control=event.control)
            self.revision += 1
        elif isinstance(event, WorkerDiscovered):
            worker = registry.get(event.worker_id)
            if worker is not None:
                self._seed(worker.base_url, event.labels)

    def set_quarantine(self, base_url: str, quarantine: Quarantine | None) -> None:
        """Hold an engine out of routing (a ``smgrl.state.sagas.Quarantine``) or release it."""
        facts = self._facts(base_url)
        reason = quarantine.reason if quarantine is not None else None
        refit = quarantine.refit_id if quarantine is not None else None
        self.engines[base_url] = attrs.evolve(facts, quarantined=reason, quarantine_refit=refit)
        self.revision += 1

    def forget(self, base_url: str) -> None:
        """The last worker at this address was removed: its facts go, and open operations stop
        tracking it (an engine registered again at this address is a new engine: an operation
        that ends later must not mark it unknown for a call it never received)."""
        for op in self._open.values():
            for wid in [w for w, base in op.targets.items() if base == base_url]:
                del op.targets[wid]
        if self.engines.pop(base_url, None) is not None:
            self.revision += 1

    # -- rules ---------------------------------------------------------------------------------

    def _seed(self, base: str, labels: Mapping[str, str] | None) -> None:
        if base in self.engines:
            return  # seed is insert-if-absent: the journal's later knowledge wins
        label = (labels or {}).get("weight_version")
        versioned = label not in (None, "", "default")
        self.engines[base] = EngineFacts(
            weight_version=None, version_source="registration" if versioned else None, control="active"
        )
        self.revision += 1

    def _facts(self, base: str) -> EngineFacts:
        return self.engines.get(base) or EngineFacts()

    def _outcome(self, ev: OutcomeRecord) -> None:
        op = self._open.get(ev.op_id)
        if op is None or ev.worker_id not in op.targets:
            return
        base = op.targets[ev.worker_id]
        op.settled.add(ev.worker_id)
        facts = self._facts(base)
        status = ev.status
        if ev.error is None and status is not None and 200 <= status < 300:
            op.succeeded.add(ev.worker_id)
            if op.intent.version is not None:
                facts = attrs.evolve(
                    facts,
                    weight_version=op.intent.version,
                    version_source="passthrough",
                    mixed=False,
                    version_known=True,
                )
            if op.intent.control is not None:
                facts = attrs.evolve(facts, control=op.intent.control)
        elif ev.stage in ("head", "body"):
            # No answer before the deadline, or an answer cut off: the engine may have acted.
            facts = self._unknown(facts, op.intent)
        else:
            return  # refused or never reached: nothing changed on the engine
        self.engines[base] = facts
        self.revision += 1

    def _unknown(self, facts: EngineFacts, intent: Intent) -> EngineFacts:
        if intent.control is not None:
            facts = attrs.evolve(facts, control="unknown")
        if intent.version is not None:
            facts = attrs.evolve(facts, version_known=False)
        return facts

    def _close(self, op_id: str) -> None:
        op = self._open.pop(op_id, None)
        if op is None:
            return
        for wid, base in op.targets.items():
            if wid not in op.settled:
                # Cut short (client gone, shutdown, crash) before this target answered.
                self.engines[base] = self._unknown(self._facts(base), op.intent)
        version = op.intent.version
        if version is not None and op.succeeded:
            for wid, base in op.targets.items():
                if wid in op.succeeded:
                    continue
                facts = self._facts(base)
                if facts.weight_version != version:
                    self.engines[base] = attrs.evolve(facts, mixed=True)
        self.revision += 1


def _bases(targets: Iterable[Mapping[str, Any]]) -> list[str]:
    """Engine addresses of an explicit write's targets, each once (DP ranks share one)."""
    return list(dict.fromkeys(t["base_url"] for t in targets if t.get("base_url")))

"""The routing table: the fleet's routable instances per model, with why each is held out.

Built from the registry and engine projections and cached by the fleet's revision, so the hot
path recomputes nothing until an event changes the fleet. Pure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import attrs

from smgrl.core import EngineFacts, Worker, fleet_max
from smgrl.routing import Instance, effective_version, from_worker, hold_reason, routable


@attrs.frozen(slots=True)
class Entry:
    instance: Instance
    hold: str | None  # why it is held out (eligibility.HOLD_REASONS), None = selectable
    version: str | None  # the table's version for its engine (None = unversioned)
    control: str


@attrs.define
class ModelEntries:
    entries: list[Entry]
    selectable: list[Entry]
    held: Counter  # reason -> how many instances
    fleet_max: str | None = None  # the model's newest version (numeric preferred), any state


@attrs.define
class Table:
    revision: object
    models: dict[str, ModelEntries]

    @property
    def served(self) -> list[str]:
        return sorted(self.models)

    def versions(self) -> dict[str, str | None]:
        """worker_id -> version, for noticing version changes between two tables."""
        return {e.instance.worker_id: e.version for m in self.models.values() for e in m.entries}


def build(
    revision: object, workers: Iterable[Worker], facts: Mapping[str, EngineFacts], dp_aware: bool
) -> Table:
    models: dict[str, ModelEntries] = {}
    for worker in workers:
        if not routable(worker):
            continue
        instance = from_worker(worker, dp_aware)
        engine = facts.get(worker.base_url)
        entry = Entry(
            instance=instance,
            hold=hold_reason(worker.status, engine),
            version=effective_version(engine, instance.label_version),
            control=engine.control if engine is not None else "active",
        )
        slot = models.get(instance.model)
        if slot is None:
            slot = models[instance.model] = ModelEntries([], [], Counter())
        slot.entries.append(entry)
        if entry.hold is None:
            slot.selectable.append(entry)
        else:
            slot.held[entry.hold] += 1
    for slot in models.values():
        slot.fleet_max = fleet_max(e.version for e in slot.entries)
    return Table(revision, models)

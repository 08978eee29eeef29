"""Everything the gateway knows, as one fold over the journal, applied in commit order.

``FleetState.apply`` is the only way state changes: at startup replay feeds it every stored event,
and at run time the journal writer feeds it each committed batch before waking the appenders, so
a handler that awaited its append already sees its own event, and projections see events in
exactly journal order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from smgrl.core import EngineFacts
from smgrl.events import EngineVersionSet, WorkerQuarantined, WorkerReleased, WorkerRemoved
from smgrl.state.aborts import AbortingOps
from smgrl.state.engines import EngineStates
from smgrl.state.group_pins import GroupPinsState
from smgrl.state.operations import Operations
from smgrl.state.registry import RegistryState
from smgrl.state.routing_loop import RoutingLoop
from smgrl.state.sagas import Sagas

if TYPE_CHECKING:
    from journal.codec import Recorded


class FleetState:
    def __init__(self) -> None:
        self.registry = RegistryState()
        self.engines = EngineStates()
        self.operations = Operations()
        self.aborts = AbortingOps()  # recent request-aborting calls per engine (not snapshotted)
        self.routing = RoutingLoop()  # the coordinator's dispatch switch
        self.sagas = Sagas()
        self.group_pins = GroupPinsState()  # prompt-group pins of gateways sharing the journal
        self.last_seq = 0
        # Called (no arguments, in the writer task) after a committed batch changed the registry
        # or the engine projection: the data plane wakes requests waiting for an eligible engine.
        # Not state: snapshots and replay ignore it.
        self._listeners: list[Callable[[], None]] = []

    def subscribe(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def notify(self) -> None:
        """Tell the listeners the fleet changed (``apply_records`` does it after each batch)."""
        for listener in list(self._listeners):
            listener()

    @property
    def revision(self) -> tuple[int, int, int]:
        return (self.registry.revision, self.engines.revision, self.routing.revision)

    def apply(self, seq: int, event: object, ts: float | None = None) -> None:
        removed_bases: list[str] = []
        if isinstance(event, WorkerRemoved):
            w = self.registry.get(event.worker_id)
            if w is not None:
                removed_bases.append(w.base_url)
        self.registry.apply(seq, event)
        self.engines.apply(seq, event, self.registry)
        self.operations.apply(seq, event)
        self.aborts.apply(seq, event)
        self.routing.apply(seq, event)
        self.group_pins.apply(seq, event)
        self.apply_sagas(seq, event, ts)
        for base in removed_bases:
            if not any(w.base_url == base for w in self.registry):
                self.engines.forget(base)
        self.last_seq = seq

    def apply_sagas(self, seq: int, event: object, ts: float | None = None) -> None:
        """Refit sagas and quarantines (smgrl/state/sagas.py); a quarantine change reaches the
        engine facts, so routing and discovery see it. ``ts``: the record's journal time (a
        resumed transfer wait counts its timeout from it)."""
        self.sagas.apply(seq, event, ts)
        if isinstance(event, (WorkerQuarantined, WorkerReleased)):
            self.engines.set_quarantine(event.base_url, self.sagas.quarantined.get(event.base_url))
        elif isinstance(event, EngineVersionSet):
            for t in event.targets:
                base = t.get("base_url")
                if base is None:
                    continue
                facts = self.engines.get(base)
                if facts is not None and facts.quarantined and base not in self.sagas.quarantined:
                    self.engines.set_quarantine(base, None)

    def apply_records(self, records: Iterable[Recorded]) -> None:
        before, ended = self.revision, self.aborts.ended
        for rec in records:
            self.apply(rec.seq, rec.event, getattr(rec, "ts", None))
        # The end of an aborting call wakes too: partial-rollout continuations wait for it.
        if self._listeners and (self.revision != before or self.aborts.ended != ended):
            self.notify()

    def facts(self) -> dict[str, EngineFacts]:
        return self.engines.engines

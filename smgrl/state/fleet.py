"""Everything the gateway knows, as one fold over the journal, applied in commit order.

``FleetState.apply`` is the only way state changes: at startup replay feeds it every stored event,
and at run time the journal writer feeds it each committed batch before waking the appenders, so
a handler that awaited its append already sees its own event, and projections see events in
exactly journal order.
"""

from __future__ import annotations

from collections.abc import Iterable

from smgrl.core.view import EngineFacts
from smgrl.state.engines import EngineStates
from smgrl.state.operations import Operations
from smgrl.state.registry import RegistryState


class FleetState:
    def __init__(self) -> None:
        self.registry = RegistryState()
        self.engines = EngineStates()
        self.operations = Operations()
        self.last_seq = 0

    @property
    def revision(self) -> tuple[int, int]:
        return (self.registry.revision, self.engines.revision)

    def apply(self, seq: int, event) -> None:
        removed_bases: list[str] = []
        if getattr(event, "TYPE", None) == "worker.removed":
            w = self.registry.get(event.worker_id)
            if w is not None:
                removed_bases.append(w.base_url)
        self.registry.apply(seq, event)
        self.engines.apply(seq, event, self.registry)
        self.operations.apply(seq, event)
        for base in removed_bases:
            if not any(w.base_url == base for w in self.registry):
                self.engines.forget(base)
        self.last_seq = seq

    def apply_records(self, records: Iterable) -> None:
        for rec in records:
            self.apply(rec.seq, rec.event)

    def facts(self) -> dict[str, EngineFacts]:
        return self.engines.engines

"""The rollout routing loop's dispatch switch (PSRL's ``/routing_loop/pause|resume``), projected
from ``dataplane.dispatch_set`` events: a paused loop dispatches nothing new (requests wait in
the gateway, in-flight ones finish). Snapshotted with the fleet; a restart keeps it paused."""

from __future__ import annotations

from typing import Any

from smgrl.events import DispatchSet

TYPES = frozenset({"dataplane.dispatch_set"})


class RoutingLoop:
    def __init__(self) -> None:
        self.paused = False
        self.revision = 0  # PSRL's routing_epoch: bumped by every change
        self.changed_seq = 0  # the journal seq of the last change

    def apply(self, seq: int, event: object) -> None:
        if not isinstance(event, DispatchSet):
            return
        self.paused = bool(event.paused)
        self.revision += 1
        self.changed_seq = seq

    # -- the snapshot contract (smgrl.state.snapshot) -------------------------------------------

    def to_snapshot(self) -> dict[str, Any] | None:
        """Plain data; None until the loop was ever switched (older snapshots have no such key)."""
        if not self.revision:
            return None
        return {"paused": self.paused, "revision": self.revision, "changed_seq": self.changed_seq}

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> RoutingLoop:
        state = cls()
        state.paused = bool(data["paused"])
        state.revision = int(data["revision"])
        state.changed_seq = int(data["changed_seq"])
        return state

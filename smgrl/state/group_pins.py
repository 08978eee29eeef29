"""Prompt-group pins decided across processes, projected from ``dataplane.group_pinned`` and
``dataplane.group_released`` (docs/scale-out.md, "Prompt-group pins").

Only gateways sharing a journal write these events (a lone gateway pins in memory:
``smgrl.dataplane.affinity``). Every process folds them, so a group's pin is the same wherever
its requests land. A pin is written once per group (a conditional append,
``smgrl.dataplane.pins``); a release names the pin it ends (``pin_seq``), so a late release
never ends a newer pin of the same group. Snapshotted with the fleet.
"""

from __future__ import annotations

from typing import Any

import attrs

from smgrl.events import GroupPinned, GroupReleased

TYPES = frozenset({"dataplane.group_pinned", "dataplane.group_released"})


@attrs.frozen(slots=True)
class Pin:
    worker: str
    rank: int
    seq: int  # the dataplane.group_pinned event's seq: what a release names
    gateway: str  # the process that decided it (and releases it)


class GroupPinsState:
    def __init__(self) -> None:
        self.pins: dict[str, Pin] = {}

    def apply(self, seq: int, event: object) -> None:
        if isinstance(event, GroupPinned):
            # Written only where no pin was in view; should two ever meet, the later one wins in
            # every process alike (a fold is the same everywhere).
            self.pins[event.prompt_id] = Pin(event.worker_id, event.dp_rank, seq, event.gateway)
        elif isinstance(event, GroupReleased):
            pin = self.pins.get(event.prompt_id)
            if pin is not None and pin.seq == event.pin_seq:
                del self.pins[event.prompt_id]

    def __len__(self) -> int:
        return len(self.pins)

    # -- the snapshot contract (smgrl.state.snapshot) -------------------------------------------

    def to_snapshot(self) -> list[list[Any]] | None:
        """Plain data; None while no pin is held (older snapshots have no such key)."""
        if not self.pins:
            return None
        return [[prompt, p.worker, p.rank, p.seq, p.gateway] for prompt, p in self.pins.items()]

    @classmethod
    def from_snapshot(cls, data: list[list[Any]]) -> GroupPinsState:
        state = cls()
        for prompt, worker, rank, seq, gateway in data:
            state.pins[str(prompt)] = Pin(str(worker), int(rank), int(seq), str(gateway))
        return state

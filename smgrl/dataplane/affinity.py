"""What staged selection remembers at run time: prompt-group pins and each request's routing.

A lone gateway keeps its pins in memory only (a restart forgets every pin: the next request of a
group pins afresh; the journal records none of it, docs/data-plane.md). A group's pin is written
once, by the first request of the group committed without an honoured instance hint, and
released when the group's last running request ends, so a later group reusing the prompt id
starts afresh.

Gateways sharing a journal (docs/scale-out.md) read the pin from the journal's projection
(``shared``: ``FleetState.group_pins``, written once across processes by
``smgrl.dataplane.pins``); what this class then keeps per process is the running count and the
*hold*: the pin this process's running requests of the group joined, which keeps routing them
after the deciding process released the pin in the journal, until this process's own last
request of the group ends. The journal's pin, when there is one, comes first.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs

from smgrl.core import Version
from smgrl.routing import InstanceId, RoutingMeta
from smgrl.state import GroupPinsState, Pin


class GroupPins:
    def __init__(self) -> None:
        self._pins: dict[str, InstanceId] = {}  # lone: the pins; shared: this process's holds
        self._running: Counter = Counter()
        self.shared: GroupPinsState | None = None  # the journal's pins (a shared journal)

    def pin(self, prompt_id: str | None) -> InstanceId | None:
        if prompt_id is None:
            return None
        shared = self.shared
        if shared is not None:
            pin = shared.pins.get(prompt_id)
            if pin is not None:
                return InstanceId(pin.worker, pin.rank)
        return self._pins.get(prompt_id)

    def join(self, prompt_id: str, instance: InstanceId | None) -> None:
        """A request of the group starts; ``instance`` is its first pick (None: hinted)."""
        self._running[prompt_id] += 1
        if instance is not None and prompt_id not in self._pins:
            # Write-once: the first writer wins (shared: the journal's pin, else the pick).
            self._pins[prompt_id] = self.pin(prompt_id) or instance

    def leave(self, prompt_id: str, owner: str | None = None) -> Pin | None:
        """A request of the group ended. Shared: the journal's pin to release, when this was
        the process's last running request of the group and ``owner`` (this process) decided it."""
        left = self._running[prompt_id] - 1
        if left > 0:
            self._running[prompt_id] = left
            return None
        del self._running[prompt_id]
        self._pins.pop(prompt_id, None)
        shared = self.shared
        if shared is None:
            return None
        pin = shared.pins.get(prompt_id)
        return pin if pin is not None and pin.gateway == owner else None

    def __len__(self) -> int:
        if self.shared is None or not self.shared.pins:
            return len(self._pins)
        return len(self._pins.keys() | self.shared.pins.keys())  # groups pinned, held or both

    def running(self, prompt_id: str) -> int:
        return self._running.get(prompt_id, 0)

    def unpinned(self, routed: Routed, sticky: bool) -> bool:
        """Is this the first selection of a request whose group has no pin anywhere in view (so,
        with a shared journal, its pick must be decided once: ``PinJournal.pin_group``)?"""
        prompt = routed.meta.prompt_id
        return (
            sticky
            and prompt is not None
            and routed.joined is None
            and routed.staged
            and routed.hint() is None
            and self.pin(prompt) is None
        )


@attrs.define(eq=False)
class Routed:
    """One request's routing across its selections (retries and loopbacks)."""

    meta: RoutingMeta
    selections: int = 0  # committed selections so far
    loopbacks: int = 0  # partial-rollout loopbacks so far
    kept: int = 0  # tokens of the aborted legs, already counted for their instances
    loop_hint: InstanceId | None = None  # the instance a loopback returns to
    after_ops: tuple[str, ...] = ()  # the aborting calls a loopback's continuation waits out
    pinned: str | None = None  # the pinned version (raw), once committed
    floor: Version | None = None  # the version floor of the next selection
    joined: str | None = None  # the prompt id whose running set this request is in
    refused: set[tuple[str, int]] = attrs.Factory(set)
    reservations: list[Any] = attrs.Factory(list)
    # Session turns (smgrl/sessions): always the staged selection, and an honoured hint HOLDS
    # the turn while its instance is merely held out (mid-refit: paused, asleep...) instead of
    # falling through; only an instance that left the fleet or is quarantined/unhealthy
    # releases it (docs/sessions.md).
    session: bool = False
    # Does the request carry PSRL routing metadata (``smgrl.dataplane.loopback.decide``)? None: read from ``meta``.
    psrl: bool | None = None

    def __attrs_post_init__(self) -> None:
        self.floor = self.meta.floor
        self.pinned = self.meta.version_tag

    @property
    def staged(self) -> bool:
        return self.meta.staged or self.loop_hint is not None or self.session

    def hint(self) -> InstanceId | None:
        """The instance hint this selection honours, if any. Decided (docs/data-plane.md, "When is a hint honoured"):
        a hint pins only when the request opts in (``x-is-sticky``), asks once
        (``x-force-pin-once``: the first selection only), or is a loopback (which sets its
        own hint). A recorded echo re-sent without opting in is ignored, so later turns of a
        non-sticky trajectory are free to re-route (PSRL's documented intent; its code pins on
        any hint)."""
        if self.loop_hint is not None:
            return self.loop_hint
        meta = self.meta
        if meta.hint is None:
            return None
        if meta.is_sticky or (meta.force_pin_once and self.selections == 0):
            return meta.hint
        return None

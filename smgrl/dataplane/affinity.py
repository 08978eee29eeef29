"""What staged selection remembers at run time: prompt-group pins and each request's routing.

In memory only (a restart forgets every pin: the next request of a group pins afresh; the
journal records none of it, docs/data-plane.md). A group's pin is written once, by the first
request of the group committed without an honoured instance hint, and released when the
group's last running request ends, so a later group reusing the prompt id starts afresh.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import attrs

from smgrl.core import Version
from smgrl.routing import InstanceId, RoutingMeta


class GroupPins:
    def __init__(self) -> None:
        self._pins: dict[str, InstanceId] = {}
        self._running: Counter = Counter()

    def pin(self, prompt_id: str | None) -> InstanceId | None:
        return self._pins.get(prompt_id) if prompt_id is not None else None

    def join(self, prompt_id: str, instance: InstanceId | None) -> None:
        """A request of the group starts; ``instance`` is its first pick (None: hinted)."""
        self._running[prompt_id] += 1
        if instance is not None:
            self._pins.setdefault(prompt_id, instance)  # write-once: the first writer wins

    def leave(self, prompt_id: str) -> None:
        left = self._running[prompt_id] - 1
        if left > 0:
            self._running[prompt_id] = left
            return
        del self._running[prompt_id]
        self._pins.pop(prompt_id, None)

    def __len__(self) -> int:
        return len(self._pins)

    def running(self, prompt_id: str) -> int:
        return self._running.get(prompt_id, 0)


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

    def __attrs_post_init__(self) -> None:
        self.floor = self.meta.floor
        self.pinned = self.meta.version_tag

    @property
    def staged(self) -> bool:
        return self.meta.staged or self.loop_hint is not None or self.session

    def hint(self) -> InstanceId | None:
        """The instance hint this selection honours, if any. Spec section 11 item 1, decided:
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

"""The routing loop's queues: requests waiting for an instance, one queue per model.

With the routing loop on (``Config.routing_loop``), a rollout request that finds no admissible
instance, or that arrives while others of its model already wait, joins its model's queue and
waits for a **turn**: the loop (``smgrl/runtime/routing_loop.py``) hands turns out one at a
time in the order ``smgrl.routing.dispatch_order`` gives, and waits for each request's attempt
to end (it took an instance, or found none and waits again) before the next, so requests pass
in order even where capacity is short.

A request is in one of three places: the **ordered** heap (not tried since it joined, or since
the last change), **tried** (its attempt found nothing: it waits for a change: a request
leaving an instance, a fleet event, a hook's release; or, for answers no event announces,
PSManager's and the engines' reports, the check interval), or **holding its turn** (``granted``).
A change puts every tried request back in order. State only, no I/O and no clock.
"""

from __future__ import annotations

import attrs
import trio

from smgrl.core.config import RoutingLoopConfig
from smgrl.routing import OrderedQueue, Place, QueueFacts, partition_key


@attrs.define(eq=False)
class Turn:
    """One request's place in the routing loop, for the whole of its dispatch."""

    model: str | None = None
    facts: QueueFacts = attrs.Factory(QueueFacts)
    place: Place | None = None  # in the ordered heap
    tried: bool = False  # in its model's tried set
    recheck: bool = False  # held out by answers the check interval re-asks (PSManager, reports)
    granted: bool = False  # holds the turn: its attempt is under way
    left: bool = False  # done with the loop (a turn taken out for it is not handed)
    go: trio.Event = attrs.Factory(trio.Event)  # set when it is handed the turn
    attempted: trio.Event = attrs.Factory(trio.Event)  # set when the attempt ends


class ModelQueue:
    """One model's waiting requests: the ordered heap and the tried set."""

    def __init__(self, cfg: RoutingLoopConfig) -> None:
        self.ordered: OrderedQueue[Turn] = OrderedQueue(cfg.sort_key, cfg.multi_priority)
        self.tried: dict[Turn, None] = {}  # insertion-ordered; removal in O(1)

    def __len__(self) -> int:
        return len(self.ordered) + len(self.tried)


class DispatchQueues:
    def __init__(self, cfg: RoutingLoopConfig) -> None:
        self.cfg = cfg
        self.models: dict[str | None, ModelQueue] = {}
        self.changed = False  # something changed since the tried requests were tried
        self._wake = trio.Event()
        self.turns = 0  # turns handed out (a test and GET /routing_loop/status read it)

    # -- the request's side --------------------------------------------------------------------

    def waiting(self, model: str | None) -> int:
        queue = self.models.get(model)
        return len(queue) if queue is not None else 0

    def must_wait(self, turn: Turn, model: str | None) -> bool:
        """A request not holding a turn waits behind the requests already waiting for its model
        (it would otherwise take the capacity they wait for)."""
        return not turn.granted and self.waiting(model) > 0

    def wait_again(
        self, turn: Turn, model: str | None, facts: QueueFacts, *, tried: bool, recheck: bool
    ) -> None:
        """Join (or rejoin) the model's queue. ``tried``: the request just looked for an instance
        and found none (it waits for a change); else it has not tried yet (in order at once)."""
        self._unplace(turn)
        queue = self.models.get(model)
        if queue is None:
            queue = self.models[model] = ModelQueue(self.cfg)
        turn.model, turn.facts, turn.recheck = model, facts, recheck
        if tried:
            turn.tried = True
            queue.tried[turn] = None
            if recheck:
                self._wake.set()  # the loop sleeping without a timer arms its check interval
        else:
            turn.place = queue.ordered.push(turn, facts)
            self._wake.set()  # the loop has a request to hand a turn to
        if turn.granted:
            self.attempt_done(turn)
        turn.go = trio.Event()

    def attempt_done(self, turn: Turn) -> None:
        """The turn's attempt ended (an instance taken, or the request waits again): the loop
        hands the next turn."""
        if turn.granted:
            turn.granted = False
            turn.attempted.set()

    def leave(self, turn: Turn) -> None:
        """The request is done with the loop (dispatched, failed, or its client left)."""
        turn.left = True
        self._unplace(turn)
        self.attempt_done(turn)

    def _unplace(self, turn: Turn) -> None:
        queue = self.models.get(turn.model)
        if queue is None:
            return
        if turn.place is not None:
            queue.ordered.remove(turn.place)
            turn.place = None
        if turn.tried:
            del queue.tried[turn]
            turn.tried = False
        if not len(queue):
            del self.models[turn.model]

    # -- what wakes the loop -------------------------------------------------------------------

    def change(self) -> None:
        """Capacity or the fleet changed (a request left an instance, a fleet event, a hook
        released a reservation): the tried requests may find an instance now."""
        if self.models:
            self.changed = True
            self._wake.set()

    # -- the loop's side -----------------------------------------------------------------------

    def ready(self) -> bool:
        """Is there a turn to hand out now (an untried request, or a change for tried ones)?"""
        return any(len(q.ordered) or (self.changed and q.tried) for q in self.models.values())

    def rechecks(self) -> bool:
        """Does a tried request wait for answers only the check interval re-asks?"""
        return any(t.recheck for q in self.models.values() for t in q.tried)

    def armed(self) -> trio.Event:
        """A fresh wake event (after the loop found nothing to do)."""
        self._wake = trio.Event()
        return self._wake

    def retry_tried(self, only_rechecks: bool = False) -> None:
        """Put the tried requests back in order (all after a change; on the check interval only
        those held out by answers that change without an event)."""
        if not only_rechecks:
            self.changed = False
        for queue in self.models.values():
            for turn in list(queue.tried):
                if only_rechecks and not turn.recheck:
                    continue
                del queue.tried[turn]
                turn.tried = False
                turn.place = queue.ordered.push(turn, turn.facts)

    def next_turns(self, model: str | None, n: int) -> list[Turn]:
        """Up to ``n`` requests of ``model`` in order, taken out of the heap."""
        queue = self.models.get(model)
        out: list[Turn] = []
        while queue is not None and len(out) < n:
            turn = queue.ordered.pop()
            if turn is None:
                break
            turn.place = None
            out.append(turn)
        return out

    def grant(self, turn: Turn) -> bool:
        """Hand ``turn`` its attempt; False when its request left meanwhile."""
        if turn.left:
            return False
        turn.granted = True
        turn.attempted = trio.Event()
        self.turns += 1
        turn.go.set()
        return True

    def partitions(self) -> dict[int | str, int]:
        """Waiting requests per partition (``/routing_loop/status``), over every model."""
        out: dict[int | str, int] = {}
        for queue in self.models.values():
            for key, n in queue.ordered.partitions().items():
                out[key] = out.get(key, 0) + n
            for turn in queue.tried:
                key = partition_key(turn.facts, self.cfg.multi_priority)
                out[key] = out.get(key, 0) + 1
        return out

    def __len__(self) -> int:
        return sum(len(q) for q in self.models.values())

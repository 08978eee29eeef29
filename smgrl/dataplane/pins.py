"""Prompt-group pins decided once across the gateway processes sharing a journal.

A lone gateway pins a group in memory (``smgrl.dataplane.affinity``). When several processes
append to one journal (``smgrl launch --workers N``, or PostgreSQL), the requests of one group
may land on several of them, so the pin is a decision made once, the way a URL registration is
(docs/scale-out.md):

* **decide**: the first request of a group with no pin in this process's view appends
  ``dataplane.group_pinned`` only if no pin event of the group was appended since the view's
  position (``writer.append_if``); a process that loses the race catches up and selects again
  under the winner's pin. One journal commit per group, never one per request; the requests of
  one process that arrive while its decision is in the air wait for it (``DataPlane``) instead
  of each trying its own;
* **release**: the deciding process releases the pin (``dataplane.group_released``) once its
  own last running request of the group ended. Not a commit of its own: the release waits
  (``pending``) and rides in the transaction of this process's next pin decision, or in the
  flush ``FLUSH_SECS`` after it (``run``) when no decision comes, so a group costs one journal
  commit in steady state. A request of the group arriving meanwhile takes its pending release
  back (``rejoined``). The other processes keep the pin they joined while their own requests
  of the group run (the hold, ``GroupPins``), so a release never moves requests already routed
  by it;
* **a gone process's pins** are released by the ``recovery`` holder (``gone_releases``), with
  its operations (``smgrl.cluster.sharing.recover_dead``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from journal import Expect, JournalClosedError, JournalConflict, JournalError
from smgrl.core.ids import new_tag
from smgrl.events import GroupPinned, GroupReleased
from smgrl.routing import InstanceId, staged
from smgrl.state import TYPES, Pin

if TYPE_CHECKING:
    from smgrl.dataplane.affinity import GroupPins, Routed
    from smgrl.dataplane.table import Entry

log = logging.getLogger("smgrl.dataplane")

DECIDE_ROUNDS = 8  # each lost round means another process pinned (or released) the group meanwhile
FLUSH_SECS = 0.05  # how long a release waits for a pin decision to ride with, at most (``run``)


def stream(prompt_id: str) -> str:
    return f"group:{prompt_id}"


class PinJournal:
    """The journal side of shared pins: ``journal`` is the process's JournalWriter (its
    ``position`` is set: several writers); ``identity`` names this process (``--workers``:
    the sharing identity; a private one when none is set, as in tests)."""

    def __init__(self, journal, identity: Callable[[], str | None]) -> None:
        self.journal = journal
        self._identity = identity
        self._fallback = f"local:{new_tag(12)}"
        self.decided = 0  # pins this process wrote
        self.conflicts = 0  # decisions refused because another process pinned first
        # Releases not journaled yet, by stream (they ride with the next decision or flush).
        self.pending: dict[str, GroupReleased] = {}
        # Releases riding in a decision in the air, and those of them whose group started here
        # again meanwhile (``rejoined``): if the decision is refused they are not put back.
        self._riding: set[str] = set()
        self._retracted: set[str] = set()
        # Set when a release becomes pending: ``run`` sleeps on it, not on a timer, while none is.
        self._released = trio.Event()
        # The data plane's pins (``share``): whose groups this process decides.
        self.groups: GroupPins | None = None
        self.deciding: dict[str, trio.Event] = {}  # prompt id -> this process's decision in the air

    def share(self, groups: GroupPins) -> None:
        """Decide the pins of ``groups`` (the data plane's)."""
        self.groups = groups

    @property
    def identity(self) -> str:
        return self._identity() or self._fallback

    async def decide(self, prompt_id: str, instance: InstanceId) -> bool:
        """Append the group's pin to ``instance`` if no pin event of the group came since this
        view's position. False: another process won (caught up: its pin is in view now). A
        journal failure is logged and answered True: the request goes on unpinned in the journal
        (held in this process only) rather than failing."""
        journal = self.journal
        key = stream(prompt_id)
        event = GroupPinned(
            prompt_id=prompt_id, worker_id=instance.worker, dp_rank=instance.rank, gateway=self.identity
        )
        # The pending releases ride along: the condition is the new pin's group alone.
        riders, self.pending = self.pending, {}
        self._riding.update(riders)
        try:
            await journal.append_if(
                Expect(after=journal.position, types=TYPES, streams=key), [(key, event), *riders.items()]
            )
        except JournalConflict:
            self.conflicts += 1
            self._put_back(riders)
            await journal.catch_up()
            return False
        except JournalError as exc:
            log.warning("could not journal the pin of a prompt group: %r", exc)
            self._put_back(riders)
            return True
        finally:
            self._riding.difference_update(riders)
            self._retracted.difference_update(riders)
        self.decided += 1
        return True

    async def decision_in_the_air(self, routed: Routed, sticky: bool) -> None:
        """Another request of this process is deciding this request's group (``pin_group``):
        wait for its pin before picking, so this one picks once, under it. ``sticky``:
        --psrl-group-sticky."""
        assert self.groups is not None
        prompt = routed.meta.prompt_id
        deciding = self.deciding.get(prompt) if prompt is not None else None
        if deciding is not None and self.groups.unpinned(routed, sticky):
            await deciding.wait()

    async def pin_group(
        self, routed: Routed, entry: Entry, pick: Callable[[], Awaitable[Entry]], sticky: bool
    ) -> Entry:
        """Make ``entry`` the group's pin across processes, or select again under the pin
        another process (or another request of this one) decided first."""
        assert self.groups is not None
        prompt = routed.meta.prompt_id
        assert prompt is not None
        for _ in range(DECIDE_ROUNDS):
            deciding = self.deciding.get(prompt)
            if deciding is not None:
                # Another request of this process is deciding this group: wait for its pin
                # rather than race it with a second conditional append that must lose.
                await deciding.wait()
            else:
                done = self.deciding[prompt] = trio.Event()
                try:
                    # Shielded: once enqueued the pin is written whatever happens to this
                    # request, and the request must then join it (``decide.commit``, next, with
                    # no checkpoint between) so that its end releases it. Bounded by the
                    # writer's --journal-lock-wait-secs.
                    with trio.CancelScope(shield=True):
                        won = await self.decide(prompt, InstanceId(*staged.identity(entry.instance)))
                finally:
                    del self.deciding[prompt]
                    done.set()
                if won:
                    return entry
            entry = await pick()  # under the winner's pin, now in view
            if not self.groups.unpinned(routed, sticky):
                return entry
        log.warning("prompt group %r kept changing while pinning it; routed unpinned", prompt)
        return entry

    def release(self, prompt_id: str, pin: Pin) -> None:
        """The pin ended here: its release waits for the next decision or flush (``pending``)."""
        self.pending[stream(prompt_id)] = GroupReleased(prompt_id=prompt_id, pin_seq=pin.seq)
        self._released.set()

    def rejoined(self, prompt_id: str) -> None:
        """A request of the group started here again before its release was journaled: the pin
        goes on (its release is dropped; the group's next end releases it again). A release
        already riding in a decision's transaction is written if that decision is: this process
        then keeps the instance through its hold, as when the deciding process's share ended."""
        if self.pending:
            self.pending.pop(stream(prompt_id), None)
        if self._riding and stream(prompt_id) in self._riding:
            self._retracted.add(stream(prompt_id))

    def flush(self) -> None:
        """Enqueue the pending releases (one transaction, not awaited). A closed or full journal
        loses them: logged; the recovery holder releases them once this process is gone."""
        riders, self.pending = self.pending, {}
        try:
            for key, event in riders.items():
                self.journal.append_nowait(key, event)  # one open batch: one transaction
        except JournalClosedError:
            log.debug("the journal closed before %d prompt-group pin releases", len(riders))
        except JournalError as exc:
            log.warning("could not journal the release of %d prompt-group pins: %r", len(riders), exc)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Flush the pending releases ``FLUSH_SECS`` after one became pending (those no decision
        took along meanwhile). Idle while none is: no wake-up per ``FLUSH_SECS``."""
        task_status.started()
        try:
            while True:
                await self._released.wait()
                self._released = trio.Event()
                await trio.sleep(FLUSH_SECS)  # a pin decision meanwhile takes them along
                if self.pending:
                    self.flush()
        finally:
            # Stopping (the writer may be closed already: then logged, and recovery releases them).
            self.flush()

    def _put_back(self, riders: dict[str, GroupReleased]) -> None:
        for key, event in riders.items():
            if key not in self._retracted:
                self.pending.setdefault(key, event)  # a newer release of the same stream wins
        if self.pending:
            self._released.set()


def gone_releases(pins: dict[str, Pin], gone: Callable[[str], bool]) -> list[tuple[str, GroupReleased]]:
    """The releases of the pins whose process ``gone`` says is gone (the recovery holder's round)."""
    return [
        (stream(prompt), GroupReleased(prompt_id=prompt, pin_seq=pin.seq, reason="gateway_gone"))
        for prompt, pin in pins.items()
        if gone(pin.gateway)
    ]

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
* **release**: the deciding process appends ``dataplane.group_released`` when its own last
  running request of the group ends (enqueued, not awaited: it rides the writer's next batch).
  The other processes keep the pin they joined while their own requests of the group run (the
  hold, ``GroupPins``), so a release never moves requests already routed by it;
* **a gone process's pins** are released by the ``recovery`` holder (``release_gone``), with
  its operations (``smgrl.sharing.recover_dead``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from journal import Expect, JournalConflict, JournalError
from journal.events import GroupPinned, GroupReleased
from smgrl.routing import InstanceId
from smgrl.state.group_pins import TYPES, Pin

log = logging.getLogger("smgrl.dataplane")

DECIDE_ROUNDS = 8  # each lost round means another process pinned (or released) the group meanwhile


def stream(prompt_id: str) -> str:
    return f"group:{prompt_id}"


class PinJournal:
    """The journal side of shared pins: ``journal`` is the process's JournalWriter (its
    ``position`` is set: several writers); ``identity`` names this process (``--workers``:
    the sharing identity; a private one when none is set, as in tests)."""

    def __init__(self, journal, identity: Callable[[], str | None]) -> None:
        self.journal = journal
        self._identity = identity
        self._fallback = f"local:{uuid.uuid4().hex[:12]}"
        self.decided = 0  # pins this process wrote
        self.conflicts = 0  # decisions refused because another process pinned first

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
        try:
            await journal.append_if(Expect(after=journal.position, types=TYPES, streams=key), [(key, event)])
        except JournalConflict:
            self.conflicts += 1
            await journal.catch_up()
            return False
        except JournalError as exc:
            log.warning("could not journal the pin of a prompt group: %r", exc)
            return True
        self.decided += 1
        return True

    def release(self, prompt_id: str, pin: Pin, reason: str = "ended") -> None:
        """Enqueue the pin's release (not awaited: nothing waits on it). A closed or full journal
        loses it: logged; the recovery holder releases it once this process is gone."""
        try:
            self.journal.append_nowait(
                stream(prompt_id), GroupReleased(prompt_id=prompt_id, pin_seq=pin.seq, reason=reason)
            )
        except JournalError as exc:
            log.warning("could not journal the release of a prompt group's pin: %r", exc)


def gone_releases(pins: dict[str, Pin], gone: Callable[[str], bool]) -> list[tuple[str, GroupReleased]]:
    """The releases of the pins whose process ``gone`` says is gone (the recovery holder's round)."""
    return [
        (stream(prompt), GroupReleased(prompt_id=prompt, pin_seq=pin.seq, reason="gateway_gone"))
        for prompt, pin in pins.items()
        if gone(pin.gateway)
    ]

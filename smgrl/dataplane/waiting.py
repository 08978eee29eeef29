"""How long a rollout waits for an eligible engine, and what its 503 says (docs/data-plane.md).

A request waits in the gateway while every instance of its model is held out. How long depends
on whether something in progress will end the wait:

- a **sync is in progress** (``sync_in_progress``): the coordinator paused dispatch, an engine is
  paused or asleep (a refit or PSRL's weight sync between its pause and its continue), a
  partial-rollout continuation waits for the sync that aborted it, a refit saga is open, or a
  control call that sets a version or a control state has not finished (an open circuit
  breaker counts too: it half-opens by itself). The request waits as
  long as its ``--request-timeout-secs`` allows: PSRL's syncs take minutes, and a 503 there
  loses the rollout;
- **nothing is in progress** (every engine quarantined, unhealthy, left ``mixed`` or
  ``unconfirmed``, stale for the version policy): nothing the gateway knows of will make one
  eligible, so the request waits at most ``QUIET_WAIT_SECS`` from when the fleet was last seen
  in a sync, then 503 ``no_eligible_workers`` naming why each engine was held out;
- a **version floor above every engine's version** (``x-version-tag``) with nothing in progress
  answers at once: 503 ``version_floor_unmet``.

An explicit ``--eligible-wait-secs`` bounds every wait, in a sync or not (as before it had a
default); the floor rule holds either way. Pure but for reading the fleet's projections.

Also here: what a waiting request shows (its reason, its version tag, the fleet's versions) and
a session turn's held hint.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from smgrl.core.errors import NoEligibleWorkers, VersionFloorUnmet
from smgrl.routing import InstanceId, floor_reason, matches

if TYPE_CHECKING:
    from smgrl.core import Version
    from smgrl.dataplane.affinity import Routed
    from smgrl.dataplane.table import Entry, ModelEntries

# Why long, in seconds: see docs/data-plane.md ("How long a request waits").
QUIET_WAIT_SECS = 30.0
# Hold reasons that end by themselves or with the sync under way: a continue, a resume, a
# version; an open circuit breaker half-opens after its timeout (--cb-timeout-duration-secs).
# With the routing loop, a full instance (max_concurrent_seqs_per_instance) and a turn in the
# queue end as the requests ahead finish.
SYNC_REASONS = frozenset(
    {"paused", "asleep", "syncing", "dispatch_paused", "circuit_open", "instance_full", "queued"}
)
ENGINES_NAMED = 64  # engines listed in a 503 (each with its reason); the counts cover them all


def sync_in_progress(held: Counter, fleet) -> bool:
    """Whether something in progress may make an engine eligible (see the module docstring)."""
    if any(held.get(reason) for reason in SYNC_REASONS):
        return True
    return fleet.routing.paused or bool(fleet.sagas.open) or fleet.engines.changing()


def request_floor(routed, floor):
    """The request's version floor: the plain one, or its routing metadata's (staged selection)."""
    if floor is not None:
        return floor
    return routed.floor if routed is not None and routed.staged else None


def floor_out_of_reach(slot, floor) -> bool:
    """A version floor that no instance of the model meets, whatever its state."""
    return floor is not None and all(floor_reason(e.version, floor) is not None for e in slot.entries)


def held_engines(slot, reason_of) -> list[dict[str, Any]]:
    """Each instance of the model with why it was held out (``reason_of(entry)``), the first
    ``ENGINES_NAMED``: what a 503 names, engine by engine."""
    out = []
    for entry in slot.entries[:ENGINES_NAMED]:
        inst = entry.instance
        out.append(
            {
                "worker_id": inst.worker_id,
                "url": inst.url,
                "reason": reason_of(entry) or "refused",
                "version": entry.version,
            }
        )
    return out


def bound(
    held: Counter, fleet, explicit: bool, wait_until: float, quiet_since: float | None, now: float
) -> tuple[float, float | None]:
    """Until when a request held out by ``held`` may wait (``wait_until``: its deadline, or an
    explicit ``--eligible-wait-secs``), and since when no sync was in progress (None while one
    is): through a sync as long as ``wait_until`` allows, ``QUIET_WAIT_SECS`` past the last one."""
    if sync_in_progress(held, fleet):
        return wait_until, None
    if quiet_since is None:
        quiet_since = now
    if explicit:
        return wait_until, quiet_since
    return min(wait_until, quiet_since + QUIET_WAIT_SECS), quiet_since


def unroutable(slot, held: Counter, waited: float, policy, floor, breakers, unmet: bool) -> NoEligibleWorkers:
    """The 503 of a request nothing could take, naming why each engine was held out:
    ``version_floor_unmet`` (``unmet``: the floor is above every engine, no sync in progress),
    else ``no_eligible_workers``."""
    top, now = slot.fleet_max, trio.current_time()

    def reason_of(entry) -> str | None:
        if entry.hold is not None:
            return entry.hold
        why = policy.hold_reason(entry.version, top) or floor_reason(entry.version, floor)
        if why is None and not breakers.allows(entry.instance.base_url, now):
            why = "circuit_open"
        return why

    engines = held_engines(slot, reason_of)
    versions = sorted({e.version if e.version is not None else "unversioned" for e in slot.entries})
    if unmet:
        return VersionFloorUnmet.at(floor, versions, engines)
    return NoEligibleWorkers.because(held, waited, floor, versions, engines)


# Hold reasons that release a session's pin: the instance is not coming back by itself (an
# operator or a refit must act). The others (paused, asleep, unknown, a version still being
# confirmed...) are a refit in progress: the pinned turn waits for it.
RELEASING = frozenset({"quarantined", "unhealthy", "mixed"})


def held_hint(
    entries: Sequence[Entry], selectable: Sequence[Entry], hint: InstanceId
) -> tuple[InstanceId | None, Sequence[Entry]]:
    """A session turn's honoured hint: while its instance is in the fleet and not released
    (``RELEASING``), only that instance is selectable (none while it is mid-refit: the turn
    waits); once it is gone or released, no hint (the staged selection chooses afresh)."""
    pinned = [e for e in entries if matches(e.instance, hint)]
    if not pinned or all(e.hold in RELEASING for e in pinned):
        return None, selectable
    return hint, [e for e in selectable if matches(e.instance, hint)]


def tag_of(routed: Routed | None, floor: Version | None) -> str | None:
    """A waiting request's version tag (GET /routing_loop/filter): a staged request's pinned
    version, else its floor; None: unversioned (PSRL's -1)."""
    if routed is not None and routed.staged:
        return routed.pinned
    return floor.raw if floor is not None else None


def wait_reason(held: Counter) -> str:
    """Why a request waits: the reason holding out the most instances (ties: by name)."""
    return min(held.items(), key=lambda item: (-item[1], item[0]))[0] if held else "none"


def fleet_versions(slot: ModelEntries) -> list[str]:
    """The weight versions the model's instances have (any state), for a waiting request's log
    line and 503: what the fleet could offer."""
    return sorted({e.version if e.version is not None else "unversioned" for e in slot.entries})

"""Staged selection (PSRL's worker selector, docs/data-plane.md, "PSRL routing"). Pure.

One function over the routing table's candidates of a model (already narrowed by state, the
version policy and the circuit breakers), in this order:

1. **version floor**: keep instances at the request's ``x-version-tag`` or newer (held out:
   ``stale`` / ``unversioned``);
2. **admission**: drop instances the admission hook refused for this request (``refused``);
3. **instance hint**: when honoured (``x-is-sticky``, ``x-force-pin-once`` on the first
   selection, or a loopback's own hint), restrict to the hinted ``(worker, DP rank)`` if it is
   a candidate, else fall through (a sticky miss is not an error);
4. **prompt-group pin**: restrict to the group's pinned instance if it is a candidate, else
   fall through;
5. **version sort**: newest first for an unversioned request, lowest acceptable first for a
   versioned one; the candidates sharing the first key go to the configured policy (a
   ``ranked`` policy, ``request_num_balance``, gets them all in that order instead: PSRL's
   fork ranks every candidate by load and uses the order only to break ties).

Version order for the sort, a total order consistent with ``fleet_max``: unversioned < text
versions (lexically, bytewise) < numeric versions (by value). (The floor of stage 1 keeps the
data plane's comparison, ``smgrl.core.version.Version``.)

Nothing here remembers anything: the pins and refusals are arguments; the service keeps them.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

import attrs

from smgrl.core import Version
from smgrl.routing.instance import Instance
from smgrl.routing.metadata import InstanceId
from smgrl.routing.version_policy import floor_reason, parse_version


class Candidate(Protocol):
    @property
    def instance(self) -> Instance: ...

    @property
    def version(self) -> str | None: ...


@attrs.frozen(slots=True)
class Decision:
    chosen: Candidate | None  # None: nothing is selectable now (the request waits)
    stage: str  # "hint", "group" or "version": what narrowed the choice last
    held: Counter[str]  # reason -> instances held out by stages 1-2


def identity(instance: Instance) -> tuple[str, int]:
    """PSRL's ``(base_worker_id, dp_rank)`` of an instance."""
    return (instance.group, instance.dp_rank or 0)


def matches(instance: Instance, hint: InstanceId) -> bool:
    """Does ``hint`` name ``instance``? The worker part is the engine's registry id (what the
    gateway echoes) or its URL."""
    return hint.rank == (instance.dp_rank or 0) and hint.worker in (
        instance.group,
        instance.base_url,
        instance.worker_id,
    )


@functools.lru_cache(maxsize=4096)
def sort_key(version: str | None) -> tuple[int, int, str]:
    """The stage-5 total order: unversioned < text (bytewise) < numeric (by value). Cached: a
    fleet has a handful of versions and this runs per candidate per request."""
    if version is None:
        return (0, 0, "")
    parsed = parse_version(version)
    if parsed.numeric is None:
        return (1, 0, parsed.raw)
    return (2, parsed.numeric, "")


@attrs.frozen(slots=True)
class Narrowed:
    """Stages 1-4's result: the candidates left, the stage that narrowed them last, what was
    held out. ``order``: a complete stage-5 order decided elsewhere (PSManager's reserve
    indicators), best first, with ``ties``: how many at its head share the best key."""

    kept: Sequence[Candidate]
    stage: str
    held: Counter[str]
    order: Sequence[Candidate] | None = None
    ties: int = 1


def select(
    candidates: Sequence[Candidate],
    *,
    floor: Version | None,
    hint: InstanceId | None,
    group_pin: InstanceId | None,
    refused: Collection[tuple[str, int]],
    choose: Callable[[Sequence[Candidate]], Candidate],
    ranked: bool = False,
) -> Decision:
    """Stages 1-5 over ``candidates``; ``hint`` is only passed when it is to be honoured."""
    narrowed = narrow(candidates, floor=floor, hint=hint, group_pin=group_pin, refused=refused)
    return finish(narrowed, floor=floor, choose=choose, ranked=ranked)


def narrow(
    candidates: Sequence[Candidate],
    *,
    floor: Version | None,
    hint: InstanceId | None,
    group_pin: InstanceId | None,
    refused: Collection[tuple[str, int]],
) -> Narrowed:
    """Stages 1-4: floor, refusals, then the instance hint or the group pin when they name a
    candidate."""
    held: Counter[str] = Counter()
    if floor is None and not refused:
        kept = list(candidates)  # the common case: nothing to filter
    else:
        kept = []
        for c in candidates:
            reason = floor_reason(c.version, floor)
            if reason is None and refused and identity(c.instance) in refused:
                reason = "refused"
            if reason is None:
                kept.append(c)
            else:
                held[reason] += 1
    if kept:
        for pin, stage in ((hint, "hint"), (group_pin, "group")):
            if pin is not None:
                pinned = [c for c in kept if matches(c.instance, pin)]
                if pinned:
                    return Narrowed(pinned, stage, held)
    return Narrowed(kept, "version", held)


def finish(
    narrowed: Narrowed,
    *,
    floor: Version | None,
    choose: Callable[[Sequence[Candidate]], Candidate],
    ranked: bool = False,
) -> Decision:
    """Stage 5: sort, then the policy (``choose``) over the first sort group (all of them, in
    order, for a ``ranked`` policy)."""
    kept, stage, held = narrowed.kept, narrowed.stage, narrowed.held
    if not kept:
        return Decision(None, stage, held)
    if len(kept) == 1:
        return Decision(kept[0], stage, held)
    if narrowed.order is not None:
        order = narrowed.order
        group = order if ranked else order[: narrowed.ties]
        return Decision(group[0] if len(group) == 1 else choose(group), stage, held)
    if stage != "version":
        return Decision(choose(kept), stage, held)
    if ranked:
        # A stable sort: candidates of one version keep the table's order.
        order = sorted(kept, key=lambda c: sort_key(c.version), reverse=floor is None)
        return Decision(choose(order), "version", held)
    keys = [sort_key(c.version) for c in kept]
    best = min(keys) if floor is not None else max(keys)
    group = [c for c, k in zip(kept, keys, strict=True) if k == best]
    return Decision(group[0] if len(group) == 1 else choose(group), "version", held)

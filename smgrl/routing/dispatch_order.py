"""The routing loop's order: which waiting request gets the next dispatch attempt. Pure.

With the routing loop on (PSRL's ``enable_routing_loop``), a rollout request that finds no
admissible instance joins its model's queue; the loop hands out dispatch attempts in the order
this module gives, PSRL's fork's order:

1. **validation requests first** (``x-is-validate``), then
2. **by version tag, lowest first**: a request's tag is its pinned version (a continuation, a
   loopback's return, a request whose first selection pinned one) or its floor
   (``x-version-tag``); unversioned requests come last. Numeric versions compare by value and
   come before text ones (a total order, so the heap stays one);
3. **by the sort key** (``routing_loop_request_sort_key``): ``short_length`` (shortest prompt
   first), ``long_length`` (longest first) or ``small_id`` (smallest numeric ``x-request-id``
   first; ids that are not numbers last);
4. ties in arrival order (first in, first out).

With ``routing_loop_multi_priority_queue`` the queue is partitioned by version tag and the
partitions drain strictly lowest first, so the version outranks validation: a validation
request tagged 5 waits behind an ordinary one tagged 1 (the fork's rule). Without it, one
partition (key ``0``).

A request whose attempt finds nothing goes back behind the requests of equal priority (a new
arrival number, as the fork re-pushes it), so one request that no instance can take never
blocks the others of its class.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from typing import Generic, TypeVar

import attrs

from smgrl.core.version import parse_u64
from smgrl.routing.psrl import int64

SORT_KEYS = ("short_length", "long_length", "small_id")
# The fork's partition key of unversioned requests (i32::MAX), reported by /routing_loop/status.
UNVERSIONED_PARTITION = 2**31 - 1
_NO_ID = 2**63 - 1  # the fork's i64::MAX for a request without a numeric id

T = TypeVar("T")

# A version tag's rank (version_rank) and a request's place in the order (order_key).
VersionRank = tuple[int] | tuple[int, int] | tuple[int, str]
OrderKey = tuple[VersionRank, int, int] | tuple[int, VersionRank, int]


@attrs.frozen(slots=True)
class QueueFacts:
    """What the order reads of one waiting request."""

    is_validate: bool = False
    version: str | None = None  # the request's version tag (raw); None: unversioned
    input_len: int = 0  # prompt length (token ids, else characters)
    request_id: str | None = None


def version_rank(version: str | None) -> VersionRank:
    """A total order over version tags: numeric by value, then text, then unversioned."""
    if version is None:
        return (2,)
    number = parse_u64(version)
    if number is not None:
        return (0, number)
    return (1, version)


def _final(facts: QueueFacts, sort_key: str) -> int:
    if sort_key == "short_length":
        return facts.input_len
    if sort_key == "long_length":
        return -facts.input_len
    if sort_key == "small_id":
        value = int64(facts.request_id)
        return _NO_ID if value is None else value
    raise ValueError(f"unknown routing-loop sort key {sort_key!r}: expected one of {', '.join(SORT_KEYS)}")


def order_key(facts: QueueFacts, sort_key: str, multi: bool) -> OrderKey:
    """The request's place: smaller goes first (before the arrival number breaks ties)."""
    version = version_rank(facts.version)
    validation = 0 if facts.is_validate else 1
    final = _final(facts, sort_key)
    if multi:
        return (version, validation, final)
    return (validation, version, final)


def partition_key(facts: QueueFacts, multi: bool) -> int | str:
    """The partition /routing_loop/status reports the request under: ``0`` in single-queue
    mode; else its version tag (a number when it is one), ``UNVERSIONED_PARTITION`` if none."""
    if not multi:
        return 0
    if facts.version is None:
        return UNVERSIONED_PARTITION
    number = parse_u64(facts.version)
    return number if number is not None else facts.version


@attrs.define(eq=False, slots=True)
class Place(Generic[T]):
    """One request's entry in the queue (``OrderedQueue.push``); ``live`` until popped or removed."""

    key: OrderKey
    seq: int
    item: T
    partition: int | str
    live: bool = True

    def __lt__(self, other: Place[T]) -> bool:
        return (self.key, self.seq) < (other.key, other.seq)


class OrderedQueue(Generic[T]):
    """Waiting requests in dispatch order: a heap with removal in O(1) (a removed entry is
    skipped when it reaches the top; the heap is rebuilt once most of it is dead)."""

    def __init__(self, sort_key: str, multi: bool) -> None:
        if sort_key not in SORT_KEYS:
            raise ValueError(f"unknown routing-loop sort key {sort_key!r}")
        self.sort_key = sort_key
        self.multi = multi
        self._heap: list[Place[T]] = []
        self._arrivals = itertools.count()
        self._live = 0
        self._partitions: dict[int | str, int] = {}

    def __len__(self) -> int:
        return self._live

    def push(self, item: T, facts: QueueFacts) -> Place[T]:
        place = Place(
            order_key(facts, self.sort_key, self.multi),
            next(self._arrivals),
            item,
            partition_key(facts, self.multi),
        )
        heapq.heappush(self._heap, place)
        self._live += 1
        self._partitions[place.partition] = self._partitions.get(place.partition, 0) + 1
        return place

    def remove(self, place: Place[T]) -> None:
        """Take a request out (it left, or was handed its attempt); twice is harmless."""
        if not place.live:
            return
        place.live = False
        self._live -= 1
        left = self._partitions[place.partition] - 1
        if left:
            self._partitions[place.partition] = left
        else:
            del self._partitions[place.partition]
        if len(self._heap) > 64 and self._live * 2 < len(self._heap):
            self._heap = [p for p in self._heap if p.live]
            heapq.heapify(self._heap)

    def pop(self) -> T | None:
        """The first request in order, taken out; None when none waits."""
        heap = self._heap
        while heap:
            place = heapq.heappop(heap)
            if place.live:
                self.remove(place)
                return place.item
        return None

    def partitions(self) -> dict[int | str, int]:
        """Waiting requests per partition (only partitions with some)."""
        return dict(self._partitions)

    def ordered(self) -> Iterator[T]:
        """Every waiting request in dispatch order (a sorted copy: for reads, not the hot path)."""
        return (p.item for p in sorted(p for p in self._heap if p.live))

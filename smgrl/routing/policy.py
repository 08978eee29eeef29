"""Load-balancing policies: pick one instance among eligible candidates. Pure (no I/O, no clock,
no global randomness: ``rng`` and ``now`` are arguments), so every rule is table-tested.

- ``round_robin``: the next candidate in turn.
- ``random``: uniform.
- ``power_of_two``: two distinct random candidates, the one with fewer requests in flight.
- ``request_num_balance`` (PSRL's default): the candidate with the fewest requests in flight
  through this gateway; a tie goes to the one its engine last reported fewer requests for
  (``POST /workers/update_stats``: running + waiting), then to the first in the order given (the
  staged selection's sort, as PSRL's fork breaks ties by candidate order).
- ``cache_aware``: prefix affinity (SGLang router's algorithm): while the fleet is balanced, a
  request whose prompt shares more than ``cache_threshold`` of its length with what an instance
  was recently sent goes there; otherwise to the instance holding the least cached text; when
  the in-flight load is unbalanced (max - min > ``balance_abs_threshold`` AND
  max > ``balance_rel_threshold`` x min) the least-loaded instance wins, so one hot prefix cannot
  overload one engine.
- ``x-smg-routing-key`` (any policy): rendezvous hashing of the key over the candidates, so the
  same key keeps landing on the same instance while it stays eligible, and only the keys of an
  instance that leaves move.

SMG's other policy names are accepted and mapped to the nearest of these (docs/data-plane.md).
"""

from __future__ import annotations

import hashlib
import random as _random
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import attrs

from smgrl.routing.instance import Instance
from smgrl.routing.radix import Key, RadixTree

POLICIES = (
    "round_robin",
    "random",
    "power_of_two",
    "cache_aware",
    "least_load",
    "request_num_balance",
    "consistent_hashing",
    "prefix_hash",
    "manual",
    "passthrough",
)
# SMG names smgrl maps onto an implemented policy (the routing key is honoured by all of them).
ALIASES = {
    "least_load": "least_load",
    "consistent_hashing": "random",
    "manual": "random",
    "prefix_hash": "cache_aware",
    "passthrough": "round_robin",
}


@attrs.frozen
class CacheAwareConfig:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    max_tree_size: int = 1 << 26


class Policy(Protocol):
    name: str

    def select(
        self,
        candidates: Sequence[Instance],
        loads: Mapping[str, int],
        prefix: Key | None,
        now: float,
    ) -> Instance: ...

    def forget(self, worker_id: str) -> None: ...


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def select(
        self, candidates: Sequence[Instance], loads: Mapping[str, int], prefix: Key | None, now: float
    ) -> Instance:
        chosen = candidates[self._next % len(candidates)]
        self._next += 1
        return chosen

    def forget(self, worker_id: str) -> None:
        pass


class Random:
    name = "random"

    def __init__(self, rng: _random.Random) -> None:
        self._rng = rng

    def select(
        self, candidates: Sequence[Instance], loads: Mapping[str, int], prefix: Key | None, now: float
    ) -> Instance:
        return candidates[self._rng.randrange(len(candidates))]

    def forget(self, worker_id: str) -> None:
        pass


# Policies share an interface (select, forget), so their skeletons look alike; each selects its own way.
class PowerOfTwo:
    name = "power_of_two"

    def __init__(self, rng: _random.Random) -> None:
        self._rng = rng

    def select(
        self, candidates: Sequence[Instance], loads: Mapping[str, int], prefix: Key | None, now: float
    ) -> Instance:
        if len(candidates) == 1:
            return candidates[0]
        i, j = self._rng.sample(range(len(candidates)), 2)
        a, b = candidates[i], candidates[j]
        return b if loads.get(b.worker_id, 0) < loads.get(a.worker_id, 0) else a

    def forget(self, worker_id: str) -> None:
        pass


class LeastLoad:
    name = "least_load"

    def select(
        self, candidates: Sequence[Instance], loads: Mapping[str, int], prefix: Key | None, now: float
    ) -> Instance:
        return min(candidates, key=lambda c: loads.get(c.worker_id, 0))

    def forget(self, worker_id: str) -> None:
        pass


class RequestNumBalance:
    """``reported(instance)``: the engine's last reported running + waiting requests for the
    instance (0 when it reported none). The gateway's own count leads: it is exact at every
    moment (up on dispatch, down when the request leaves), where a report lags by its push
    interval; the report only separates instances the gateway counts alike (requests another
    gateway or a direct client sent)."""

    name = "request_num_balance"
    # The staged selection hands this policy every kept candidate in sort order, not only the
    # first sort group: the fork's policy ranks all of them by load and uses the order for ties.
    ranked = True

    def __init__(self, reported: Callable[[Instance], int] | None = None) -> None:
        self._reported = reported or (lambda instance: 0)

    def select(
        self, candidates: Sequence[Instance], loads: Mapping[str, int], prefix: Key | None, now: float
    ) -> Instance:
        reported = self._reported
        return min(candidates, key=lambda c: (loads.get(c.worker_id, 0), reported(c)))

    def forget(self, worker_id: str) -> None:
        pass


class CacheAware:
    name = "cache_aware"

    def __init__(self, config: CacheAwareConfig | None = None) -> None:
        self.config = config or CacheAwareConfig()
        self.trees: dict[str, RadixTree] = {}  # one per model

    def _tree(self, model: str) -> RadixTree:
        tree = self.trees.get(model)
        if tree is None:
            tree = self.trees[model] = RadixTree(self.config.max_tree_size)
        return tree

    def select(
        self, candidates: Sequence[Instance], loads: Mapping[str, int], prefix: Key | None, now: float
    ) -> Instance:
        cfg = self.config
        tree = self._tree(candidates[0].model)

        def load(c: Instance) -> int:
            return loads.get(c.worker_id, 0)

        counts = [load(c) for c in candidates]
        high, low = max(counts), min(counts)
        imbalanced = high - low > cfg.balance_abs_threshold and high > low * cfg.balance_rel_threshold
        if imbalanced or not prefix:
            chosen = min(candidates, key=load)
        else:
            by_id = {c.worker_id: c for c in candidates}
            matched, tenants = tree.match(prefix, by_id)
            if tenants and matched / len(prefix) > cfg.cache_threshold:
                chosen = min((by_id[t] for t in tenants), key=load)
            else:
                sizes = tree.sizes()
                chosen = min(candidates, key=lambda c: (sizes.get(c.worker_id, 0), load(c)))
        if prefix:
            tree.insert(prefix, chosen.worker_id, now)
        return chosen

    def forget(self, worker_id: str) -> None:
        for tree in self.trees.values():
            tree.remove_tenant(worker_id)


def make_policy(
    name: str,
    rng: _random.Random | None = None,
    cache: CacheAwareConfig | None = None,
    reported: Callable[[Instance], int] | None = None,
) -> Policy:
    """``reported``: the engines' own request counts per instance (``request_num_balance``)."""
    rng = rng or _random.Random()
    name = ALIASES.get(name, name)
    if name == "round_robin":
        return RoundRobin()
    if name == "random":
        return Random(rng)
    if name == "power_of_two":
        return PowerOfTwo(rng)
    if name == "least_load":
        return LeastLoad()
    if name == "request_num_balance":
        return RequestNumBalance(reported)
    if name == "cache_aware":
        return CacheAware(cache)
    raise ValueError(f"unknown policy {name!r}")


def _weight(key: bytes, worker_id: str) -> bytes:
    return hashlib.blake2b(key + b"\0" + worker_id.encode(), digest_size=8).digest()


def sticky(candidates: Sequence[Instance], routing_key: str) -> Instance:
    """Rendezvous (highest-random-weight) hashing of ``routing_key`` over the candidates."""
    key = routing_key.encode("utf-8", "surrogateescape")
    return max(candidates, key=lambda c: _weight(key, c.worker_id))

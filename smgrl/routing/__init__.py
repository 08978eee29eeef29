"""Data-plane routing as pure code: which engine instance serves a rollout request.

- ``instance``: the routable instances of the fleet, built from the registry projection.
- ``policy``: ``round_robin``, ``random``, ``power_of_two``, ``cache_aware`` (+ ``radix``, its
  approximate prefix tree), and ``x-smg-routing-key`` stickiness.
- ``eligibility``: the version- and state-aware filter over the engine projection.
- ``version_policy``: ``any | latest-only | min-version:V | max-staleness:K`` and PSRL's
  ``x-version-tag`` floor.
- ``metadata``: PSRL's routing headers (and the body fields they override), parsed.
- ``psrl``: how PSManager's answers and the engines' reports narrow and order PSRL's candidates.
- ``dispatch_order``: the routing loop's order of waiting requests (PSRL's priority classes and
  sort keys), and the queue that keeps it.
- ``staged``: PSRL's staged selection (floor, admission refusals, instance hint, prompt-group
  pin, version sort, then the policy), one pure function.

No I/O and no clock here: randomness and time come in as arguments, so every rule is
table-tested (``tests/unit/test_routing*.py``). ``smgrl.dataplane`` is the I/O shell.
"""

from smgrl.routing.dispatch_order import SORT_KEYS as LOOP_SORT_KEYS
from smgrl.routing.dispatch_order import OrderedQueue, Place, QueueFacts, partition_key
from smgrl.routing.eligibility import effective_version, hold_reason
from smgrl.routing.instance import Instance, from_worker, routable
from smgrl.routing.metadata import FALSE, TRUE, InstanceId, RoutingMeta
from smgrl.routing.policy import POLICIES, CacheAwareConfig, make_policy, sticky
from smgrl.routing.psrl import (
    by_indicator,
    kv_gate_on,
    kv_refusal,
    psm_request_id,
    psm_version,
    reservable,
    unique_versions,
)
from smgrl.routing.staged import identity, matches
from smgrl.routing.version_policy import (
    ANY,
    InvalidVersionPolicy,
    VersionPolicy,
    floor_reason,
    parse_floor,
    parse_version,
)

__all__ = [
    "ANY",
    "FALSE",
    "LOOP_SORT_KEYS",
    "POLICIES",
    "TRUE",
    "CacheAwareConfig",
    "Instance",
    "InstanceId",
    "InvalidVersionPolicy",
    "OrderedQueue",
    "Place",
    "QueueFacts",
    "RoutingMeta",
    "VersionPolicy",
    "by_indicator",
    "effective_version",
    "floor_reason",
    "from_worker",
    "hold_reason",
    "identity",
    "kv_gate_on",
    "kv_refusal",
    "make_policy",
    "matches",
    "parse_floor",
    "parse_version",
    "partition_key",
    "psm_request_id",
    "psm_version",
    "reservable",
    "routable",
    "sticky",
    "unique_versions",
]

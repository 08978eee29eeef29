"""FleetState snapshots: the projections as JSON, so startup folds only the events after them.

A snapshot holds everything ``FleetState.apply`` needs to continue the fold exactly where it
stopped: the registry (workers in registration order, the URL index, counters), the engine facts
and the engine projection's open operations, the operations still open (a restart records
them as interrupted), the routing loop's switch once it was ever changed, and the prompt-group
pins of gateways sharing the journal. It does NOT hold the cache of recently finished
operations: that cache is a convenience for ``GET /v1/rl/operations/{id}``, which falls back to
the journal file.

Each projection owns its part (``to_snapshot`` / ``from_snapshot``, see ``smgrl.state.records``);
this module composes them into one document. Taking a snapshot is two steps so the event loop is
held only briefly:

* :func:`capture` (on the event loop, between journal batches): each projection's
  ``to_snapshot``. Worker records and engine facts are frozen attrs values, so the copy is
  shallow dict copies plus the few open operations; it is consistent because no batch is
  applied while it runs.
* :func:`dumps` (anywhere, e.g. a worker thread): turns the capture into canonical JSON.

``from_json`` refuses anything it does not fully understand (other format, missing keys, wrong
shapes) with :class:`SnapshotError`: a snapshot is a cache, and replaying from an older one or
from scratch is always correct.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from smgrl.state.engines import EnginesSnapshot, EngineStates
from smgrl.state.fleet import FleetState
from smgrl.state.group_pins import GroupPinsState
from smgrl.state.operations import Operations, OperationsSnapshot
from smgrl.state.records import SnapshotError
from smgrl.state.registry import RegistrySnapshot, RegistryState
from smgrl.state.routing_loop import RoutingLoop

__all__ = ["FORMAT", "KIND", "SnapshotError", "capture", "dumps", "from_json", "to_dict", "to_json"]

KIND = "fleet"  # the snapshots-table kind of a FleetState snapshot
# Bump when a projection's state changes shape or meaning: older snapshots are then ignored
# (replayed from scratch) instead of being loaded into a state they no longer describe.
FORMAT = 1


@attrs.frozen
class Captured:
    """A consistent copy of a FleetState, safe to encode while the live state moves on."""

    last_seq: int
    registry: RegistrySnapshot
    engines: EnginesSnapshot
    operations: OperationsSnapshot
    routing: dict[str, Any] | None = None
    group_pins: list[list[Any]] | None = None


def capture(fleet: FleetState) -> Captured:
    """Copy what a snapshot needs. Cheap: frozen values are shared, only mutable parts copied."""
    return Captured(
        last_seq=fleet.last_seq,
        registry=fleet.registry.to_snapshot(),
        engines=fleet.engines.to_snapshot(),
        operations=fleet.operations.to_snapshot(),
        routing=fleet.routing.to_snapshot(),
        group_pins=fleet.group_pins.to_snapshot(),
    )


def to_dict(cap: Captured) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "kind": KIND,
        "last_seq": cap.last_seq,
        "registry": cap.registry.to_json(),
        "engines": cap.engines.to_json(),
        "operations": cap.operations.to_json(),
        **({"routing": cap.routing} if cap.routing is not None else {}),
        **({"group_pins": cap.group_pins} if cap.group_pins is not None else {}),
    }


def dumps(cap: Captured) -> str:
    """Canonical JSON (sorted keys, compact): equal states give equal text."""
    return json.dumps(to_dict(cap), separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def to_json(fleet: FleetState) -> str:
    return dumps(capture(fleet))


def from_json(text: str) -> FleetState:
    """Rebuild a FleetState from :func:`to_json` output; SnapshotError if it does not fit."""
    try:
        data = json.loads(text)
    except (ValueError, TypeError) as exc:
        raise SnapshotError(f"snapshot is not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise SnapshotError("not a fleet snapshot")
    if data.get("format") != FORMAT:
        raise SnapshotError(f"snapshot format {data.get('format')!r} is not {FORMAT}")
    try:
        return _load(data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise SnapshotError(f"snapshot does not fit this smgrl: {exc!r}") from None


def _load(data: dict[str, Any]) -> FleetState:
    fleet = FleetState()
    reg_data, eng_data, ops_data = data["registry"], data["engines"], data["operations"]
    fleet.registry = RegistryState.from_snapshot(reg_data)
    fleet.engines = EngineStates.from_snapshot(eng_data)
    fleet.operations = Operations.from_snapshot(ops_data)
    routing = data.get("routing")
    if routing is not None:
        fleet.routing = RoutingLoop.from_snapshot(routing)
    pins = data.get("group_pins")
    if pins is not None:
        fleet.group_pins = GroupPinsState.from_snapshot(pins)
    fleet.last_seq = int(data["last_seq"])
    return fleet

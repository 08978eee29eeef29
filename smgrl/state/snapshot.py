"""FleetState snapshots: the projections as JSON, so startup folds only the events after them.

A snapshot holds everything ``FleetState.apply`` needs to continue the fold exactly where it
stopped: the registry (workers in registration order, the URL index, counters), the engine facts
and the engine projection's open operations, and the operations still open (a restart records
them as interrupted). It does NOT hold the cache of recently finished operations: that cache is
a convenience for ``GET /v1/rl/operations/{id}``, which falls back to the journal file.

Taking a snapshot is two steps so the event loop is held only briefly:

* :func:`capture` (on the event loop, between journal batches): copies the mutable parts. Worker
  records and engine facts are frozen attrs values, so the copy is shallow dict copies plus the
  few open operations; it is consistent because no batch is applied while it runs.
* :func:`dumps` (anywhere, e.g. a worker thread): turns the capture into canonical JSON.

``from_json`` refuses anything it does not fully understand (other format, missing keys, wrong
shapes) with :class:`SnapshotError`: a snapshot is a cache, and replaying from an older one or
from scratch is always correct.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from smgrl.core.observe import Intent
from smgrl.core.view import EngineFacts
from smgrl.core.worker import Worker
from smgrl.state.engines import _Open
from smgrl.state.fleet import FleetState
from smgrl.state.operations import OpRecord

__all__ = ["FORMAT", "KIND", "SnapshotError", "capture", "dumps", "from_json", "to_dict", "to_json"]

KIND = "fleet"  # the snapshots-table kind of a FleetState snapshot
# Bump when a projection's state changes shape or meaning: older snapshots are then ignored
# (replayed from scratch) instead of being loaded into a state they no longer describe.
FORMAT = 1

_WORKER_FIELDS = frozenset(f.name for f in attrs.fields(Worker))
_FACT_FIELDS = frozenset(f.name for f in attrs.fields(EngineFacts))
_OP_FIELDS = frozenset(f.name for f in attrs.fields(OpRecord))


class SnapshotError(ValueError):
    """The snapshot cannot be loaded (unknown format, or a shape this code does not know)."""


@attrs.frozen
class Captured:
    """A consistent copy of a FleetState, safe to encode while the live state moves on."""

    last_seq: int
    registry_revision: int
    registry_last_seq: int
    workers: list[Worker]
    by_url: dict[str, str]
    engines_revision: int
    engines: dict[str, EngineFacts]
    engine_open: list[tuple[str, Intent, dict[str, str], list[str], list[str]]]
    ops_open: list[dict[str, Any]]
    routing: dict[str, Any] | None = None


def capture(fleet: FleetState) -> Captured:
    """Copy what a snapshot needs. Cheap: frozen values are shared, only mutable parts copied."""
    reg, eng = fleet.registry, fleet.engines
    return Captured(
        last_seq=fleet.last_seq,
        registry_revision=reg.revision,
        registry_last_seq=reg.last_seq,
        workers=list(reg.workers.values()),
        by_url=dict(reg._by_url),
        engines_revision=eng.revision,
        engines=dict(eng.engines),
        engine_open=[
            (op_id, o.intent, dict(o.targets), sorted(o.succeeded), sorted(o.settled))
            for op_id, o in eng._open.items()
        ],
        # OpRecords are mutable (outcomes arrive): copy each one as plain data now.
        ops_open=[_op_dict(op) for op in fleet.operations.open.values()],
        # Only once the routing loop was ever switched (older snapshots have no such key).
        routing=(
            {
                "paused": fleet.routing.paused,
                "revision": fleet.routing.revision,
                "changed_seq": fleet.routing.changed_seq,
            }
            if fleet.routing.revision
            else None
        ),
    )


def _op_dict(op: OpRecord) -> dict[str, Any]:
    data = attrs.asdict(op, recurse=False)
    data["targets"] = [dict(t) for t in op.targets]
    data["outcomes"] = {wid: dict(o) for wid, o in op.outcomes.items()}
    data["missing"] = list(op.missing)
    return data


def _worker_dict(w: Worker) -> dict[str, Any]:
    data = attrs.asdict(w, recurse=False)
    data["caller_labels"] = dict(w.caller_labels)
    data["discovered_labels"] = dict(w.discovered_labels)
    return data


def to_dict(cap: Captured) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "kind": KIND,
        "last_seq": cap.last_seq,
        "registry": {
            "revision": cap.registry_revision,
            "last_seq": cap.registry_last_seq,
            "workers": [_worker_dict(w) for w in cap.workers],
            "by_url": cap.by_url,
        },
        "engines": {
            "revision": cap.engines_revision,
            "facts": {base: attrs.asdict(f) for base, f in cap.engines.items()},
            "open": [
                {
                    "op_id": op_id,
                    "intent": {"version": i.version, "control": i.control, "phase": i.phase},
                    "targets": targets,
                    "succeeded": succeeded,
                    "settled": settled,
                }
                for op_id, i, targets, succeeded, settled in cap.engine_open
            ],
        },
        "operations": {"open": cap.ops_open},
        **({"routing": cap.routing} if cap.routing is not None else {}),
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


def _exact(record: dict[str, Any], fields: frozenset[str], what: str) -> dict[str, Any]:
    # A key this code does not know means the snapshot describes a state it cannot hold.
    if not isinstance(record, dict) or set(record) - fields:
        raise SnapshotError(f"unexpected {what} record in snapshot")
    return record


def _load(data: dict[str, Any]) -> FleetState:
    fleet = FleetState()
    reg_data, eng_data, ops_data = data["registry"], data["engines"], data["operations"]
    reg = fleet.registry
    for raw in reg_data["workers"]:
        w = Worker(**_exact(raw, _WORKER_FIELDS, "worker"))
        reg.workers[w.id] = w
    by_url = reg_data["by_url"]
    if not isinstance(by_url, dict) or any(wid not in reg.workers for wid in by_url.values()):
        raise SnapshotError("registry URL index names unknown workers")
    reg._by_url = {str(url): str(wid) for url, wid in by_url.items()}
    reg.revision, reg.last_seq = int(reg_data["revision"]), int(reg_data["last_seq"])

    eng = fleet.engines
    eng.engines = {
        str(base): EngineFacts(**_exact(f, _FACT_FIELDS, "engine")) for base, f in eng_data["facts"].items()
    }
    for raw in eng_data["open"]:
        intent = Intent.from_json(raw["intent"])
        eng._open[str(raw["op_id"])] = _Open(
            intent, dict(raw["targets"]), set(raw["succeeded"]), set(raw["settled"])
        )
    eng.revision = int(eng_data["revision"])

    for raw in ops_data["open"]:
        op = OpRecord(**_exact(raw, _OP_FIELDS, "operation"))
        fleet.operations.open[op.op_id] = op
    routing = data.get("routing")
    if routing is not None:
        fleet.routing.paused = bool(routing["paused"])
        fleet.routing.revision = int(routing["revision"])
        fleet.routing.changed_seq = int(routing["changed_seq"])
    fleet.last_seq = int(data["last_seq"])
    return fleet

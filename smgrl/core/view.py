"""Discovery rows and the label view selectors match against (docs/rl-control-plane.md, "Discovery").

Pure functions over registry records: DP collapsing, row order, the merged label view with its
synthetic keys, and the ``RlWorkerEntry`` JSON row. ``EngineFacts`` carries what the journal's
engine-state projection knows (weight version, control state); rows show it in added fields only,
so SMG clients keep working.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from smgrl.core.capability import capabilities_for
from smgrl.core.control_url import control_url_for
from smgrl.core.worker import Worker, dp_rank_of, parse_size

PROTOCOL_VERSION = 1


@attrs.frozen
class EngineFacts:
    """The journal's view of one engine address (DP ranks share it). None = not known."""

    weight_version: str | None = None
    version_source: str | None = None  # registration | passthrough | api
    control: str = "active"  # active | paused | asleep | unknown
    # False when a call that would have set the version got no answer (timeout, crash).
    version_known: bool = True
    # True when the rest of a fan-out reached a version this engine did not.
    mixed: bool = False
    # Why the engine is quarantined (held out of routing until released), and by which refit.
    quarantined: str | None = None
    quarantine_refit: str | None = None


@attrs.frozen
class Group:
    """One discovery row: the representative record and how many registry entries it stands for."""

    representative: Worker
    ranks: int


def control_url(worker: Worker) -> str | None:
    """HTTP workers control themselves (a ``rl.control_url`` label is ignored); gRPC/ZMQ
    workers use the ``rl.control_url`` label resolved against their own host, or have none."""
    return control_url_for(worker.connection_mode, worker.base_url, worker.url, worker.labels)


def collapse(workers: Iterable[Worker]) -> list[Group]:
    """Group DP ranks by ``(True, base_url)`` and others by ``(False, url)``; keep the lowest rank
    (strictly lower replaces, ties keep the first seen); sort rows by base_url, then url."""
    groups: dict[tuple[bool, str], list[Any]] = {}
    for w in workers:
        if not w.is_visible:
            continue
        key = (True, w.base_url) if w.dp_aware and w.dp_rank is not None else (False, w.url)
        slot = groups.get(key)
        if slot is None:
            groups[key] = [w, 1]
            continue
        slot[1] += 1
        if dp_rank_of(w.url) < dp_rank_of(slot[0].url):
            slot[0] = w
    rows = [Group(rep, n) for rep, n in groups.values()]
    rows.sort(key=lambda g: (g.representative.base_url, g.representative.url))
    return rows


def dp_ranks_for(worker: Worker, workers: Iterable[Worker]) -> int:
    """For ``GET /v1/rl/workers/{id}``: DP-aware workers sharing the base URL (at least 1)."""
    if not (worker.dp_aware and worker.dp_rank is not None):
        return 1
    count = sum(
        1
        for w in workers
        if w.is_visible and w.dp_aware and w.dp_rank is not None and w.base_url == worker.base_url
    )
    return max(count, 1)


def selector_view(worker: Worker, facts: EngineFacts | None = None) -> dict[str, str]:
    """The merged label view: labels, then synthetic keys that shadow spoofed labels."""
    view = worker.labels
    view["id"] = worker.id
    view["url"] = worker.url
    view["base_url"] = worker.base_url
    view["engine"] = worker.engine
    view["model"] = worker.effective_model_id
    view["worker_type"] = worker.worker_type
    view["connection_mode"] = worker.connection_mode
    view["health"] = worker.status
    if facts is not None:
        view["control"] = facts.control
        if facts.weight_version is not None:
            view["weight_version"] = facts.weight_version
    return view


# The fields of SMG 1.13.0's ``RlWorkerEntry``, in its serialisation order (``row`` writes them in
# this order; the OpenAPI document requires them), and smgrl's additions after them.
RL_WORKER_ENTRY_FIELDS = (
    "id",
    "url",
    "base_url",
    "engine",
    "engine_version",
    "model_id",
    "worker_type",
    "connection_mode",
    "control_url",
    "tp_size",
    "dp_size",
    "pp_size",
    "dp_ranks",
    "role",
    "health",
    "weight_version",
    "labels",
    "capabilities",
)
RL_WORKER_ENTRY_ADDITIONS = ("version_source", "control", "version_status")


def row(worker: Worker, dp_ranks: int, facts: EngineFacts | None = None) -> dict[str, Any]:
    """One ``RlWorkerEntry``, field order as SMG 1.13.0 serialises it; absent optionals are null."""
    labels = worker.labels
    weight_version = labels.get("weight_version")
    entry = {
        "id": worker.id,
        "url": worker.url,
        "base_url": worker.base_url,
        "engine": worker.engine,
        "engine_version": labels.get("version"),
        "model_id": worker.effective_model_id,
        "worker_type": worker.worker_type,
        "connection_mode": worker.connection_mode,
        "control_url": control_url(worker),
        "tp_size": parse_size(labels.get("tp_size")),
        "dp_size": parse_size(labels.get("dp_size")),
        "pp_size": parse_size(labels.get("pp_size")),
        "dp_ranks": dp_ranks,
        "role": labels.get("role"),
        "health": worker.status,
        "weight_version": weight_version,
        "labels": labels,
        "capabilities": capabilities_for(worker.engine, labels).to_json(),
    }
    if facts is not None:
        # smgrl additions (deviations.md): the journal's version wins over the registration label
        # once a refit confirmed one; ``control`` is the projected pause state.
        if facts.weight_version is not None:
            entry["weight_version"] = facts.weight_version
        entry["version_source"] = facts.version_source
        entry["control"] = facts.control
        entry["version_status"] = (
            "unknown" if not facts.version_known else "mixed" if facts.mixed else "consistent"
        )
        if facts.quarantined is not None:
            # Only on quarantined rows (docs/refits.md), so other rows keep their exact shape.
            entry["quarantined"] = True
            entry["quarantine"] = {"reason": facts.quarantined, "refit_id": facts.quarantine_refit}
    return entry


def workers_response(rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {"protocol_version": PROTOCOL_VERSION, "workers": rows, "total": len(rows)}


def facts_for(worker: Worker, engines: Mapping[str, EngineFacts] | None) -> EngineFacts | None:
    if engines is None:
        return None
    return engines.get(worker.base_url)

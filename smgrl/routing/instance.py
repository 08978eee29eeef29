"""Routable instances: one per registry entry that can take rollout traffic. Pure.

An instance is what a request is dispatched to. Without ``--dp-aware`` it is an engine; with it,
one ``(engine, DP rank)`` pair (registry entries ``<base_url>@<rank>``), and the request carries
``data_parallel_rank``. PSRL names an instance ``(base_worker_id, dp_rank)``: ``group`` is that
base worker id (the registered rank-0 record), kept here so sessions can pin instances later.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from smgrl.core import Worker, label_version

# HTTP and gRPC engines carry rollout traffic (gRPC: the wire its discovery chose, below).
ROUTABLE_MODES = ("http", "grpc")
WIRE_LABEL = "grpc_wire"  # set by gRPC discovery: sglang | vllm | vllm-psrl | tokenspeed
ROUTABLE_TYPES = ("regular",)


@attrs.frozen(slots=True)
class Instance:
    worker_id: str  # the registry id: named in x-smg-routed-worker-id
    url: str  # the registry URL (``@rank`` for DP ranks)
    base_url: str  # the engine origin requests go to
    group: str  # PSRL's base_worker_id
    dp_rank: int | None  # set only when routing DP-aware
    model: str
    label_version: str | None  # the registration label's version (None: unversioned)
    # A gRPC engine's wire (None: HTTP). The data plane sends it Generate RPCs; its DP rank
    # (``dp_rank``) goes in each request's ``data_parallel_rank``.
    wire: str | None = None

    @property
    def identity(self) -> tuple[str, int]:
        """PSRL's instance identity ``(base_worker_id, dp_rank)``."""
        return (self.group, self.dp_rank or 0)


def from_worker(worker: Worker, dp_aware: bool) -> Instance:
    return Instance(
        worker_id=worker.id,
        url=worker.url,
        base_url=worker.base_url,
        group=worker.group or worker.id,
        dp_rank=worker.dp_rank if dp_aware else None,
        model=worker.effective_model_id,
        label_version=label_version(worker.labels.get("weight_version")),
        wire=worker.labels.get(WIRE_LABEL) if worker.connection_mode == "grpc" else None,
    )


def routable(worker: Worker) -> bool:
    """Could this registry entry ever take rollout traffic (health aside)? A gRPC worker only
    once its discovery named its wire (a worker discovered through its control app only has no
    Generate to call)."""
    return (
        worker.is_visible
        and worker.connection_mode in ROUTABLE_MODES
        and (worker.connection_mode != "grpc" or worker.labels.get(WIRE_LABEL) is not None)
        and worker.worker_type in ROUTABLE_TYPES
    )


def served_models(workers: Iterable[Worker]) -> list[str]:
    """The models the fleet serves (routable, discovered workers), sorted, each once."""
    return sorted({w.effective_model_id for w in workers if routable(w)})

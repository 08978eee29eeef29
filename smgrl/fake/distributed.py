"""Receive real broadcast tensors over a torch.distributed gloo group (optional).

Only imported when an engine runs with ``real_distributed=True``; ``torch`` is imported inside
the functions, never at module import. The group is built the way SGLang's
``init_custom_process_group`` builds it (TCP rendezvous at ``master_address:master_port``, a
``PrefixStore`` named after the group, ``_new_process_group_helper``), so a trainer that uses
SGLang's or slime's helper on its side (rank 0, ``backend="gloo"``) meets this receiver.

Limits: torch registers process groups by name per process, so one process can hold only one
member of a given group: run one engine per process (``fake-engine --ports P``) or a fleet of
one when testing real transfers. Checksums are SHA-256 of the tensor's raw bytes, read without
numpy (the CPU torch wheel does not pull it in).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
from datetime import timedelta
from typing import Any

import trio


def available() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available())


class GlooReceiver:
    def __init__(self, pg: Any, rank: int, name: str):
        self._pg = pg
        self.rank = rank
        self.name = name

    @classmethod
    async def join(cls, name: str, info: dict[str, Any]) -> GlooReceiver:
        # The rendezvous blocks until every rank arrived. abandon_on_cancel: if our caller is
        # cancelled we stop waiting (the thread finishes or times out on its own).
        pg, rank = await trio.to_thread.run_sync(_join_blocking, name, info, abandon_on_cancel=True)
        return cls(pg, rank, name)

    async def receive(self, names: list[str], dtypes: list[str], shapes: list[list[int]]) -> dict[str, str]:
        return await trio.to_thread.run_sync(_receive_blocking, self._pg, names, dtypes, shapes)

    async def close(self) -> None:
        await trio.to_thread.run_sync(_destroy_blocking, self._pg)


def _join_blocking(name: str, info: dict[str, Any]) -> tuple[Any, int]:
    import inspect

    import torch.distributed as dist
    from torch.distributed.distributed_c10d import Backend, _new_process_group_helper, _world, rendezvous

    rank = int(info["rank_offset"])
    world_size = int(info["world_size"])
    timeout = timedelta(seconds=float(info.get("timeout_s", 300)))
    init_method = f"tcp://{info['master_address']}:{int(info['master_port'])}"
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    store = dist.PrefixStore(name, store)
    # torch renamed pg_options to backend_options (2.6); pass whichever this torch has.
    params = inspect.signature(_new_process_group_helper).parameters
    options = "backend_options" if "backend_options" in params else "pg_options"
    pg, _ = _new_process_group_helper(
        world_size, rank, [], Backend("gloo"), store, group_name=name, timeout=timeout, **{options: None}
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg, rank


def _receive_blocking(
    pg: Any, names: list[str], dtypes: list[str], shapes: list[list[int]]
) -> dict[str, str]:
    import torch
    import torch.distributed as dist

    sums: dict[str, str] = {}
    for name, dtype, shape in zip(names, dtypes, shapes, strict=True):
        tensor = torch.empty(shape, dtype=getattr(torch, dtype.removeprefix("torch.")))
        dist.broadcast(tensor, src=0, group=pg)
        sums[name] = tensor_checksum(tensor)
    return sums


def _destroy_blocking(pg: Any) -> None:
    import torch.distributed as dist

    # A half-built group has nothing more to release.
    with contextlib.suppress(Exception):
        dist.destroy_process_group(pg)


def tensor_checksum(tensor: Any) -> str:
    """The checksum the receiver keeps, for a trainer-side test to compare against."""
    flat = tensor.detach().cpu().contiguous()
    raw = ctypes.string_at(flat.data_ptr(), flat.numel() * flat.element_size())
    return hashlib.sha256(raw).hexdigest()

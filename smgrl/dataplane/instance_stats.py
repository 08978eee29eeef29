"""What engines last reported per instance (PSRL's ``POST /workers/update_stats``), in memory.

Keyed ``(worker_id, dp_rank)``: PSRL's instance identity (the engine's base worker id and DP
rank). Per process and not journaled: a report is a sample that the next push replaces, so a
restarted gateway starts empty and fills in at the coordinator's next push.

Read by the routing policies (``request_num_balance`` breaks ties with ``requests``) and the
admission filters (waiting requests, KV usage).
"""

from __future__ import annotations

import attrs


@attrs.frozen(slots=True)
class InstanceStats:
    running: int = 0
    waiting: int = 0
    kv_usage: float | None = None  # 0.0-1.0: the share of the KV cache in use (None: not said)

    @property
    def requests(self) -> int:
        return self.running + self.waiting


class InstanceStatsTable:
    def __init__(self) -> None:
        self._stats: dict[tuple[str, int], InstanceStats] = {}

    def get(self, worker_id: str, dp_rank: int) -> InstanceStats | None:
        return self._stats.get((worker_id, dp_rank))

    def put(self, worker_id: str, dp_rank: int, stats: InstanceStats) -> bool:
        self._stats[(worker_id, dp_rank)] = stats
        return True

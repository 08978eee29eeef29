"""Per-instance engine stats pushed by a coordinator (PSRL's ``POST /workers/update_stats``).

PSRL's coordinator collects each engine's scheduler snapshot itself and pushes the newest one
per instance ``(worker, DP rank)`` every sync interval: running and waiting requests, each
running request's prompt and generated token counts, KV-cache usage. smgrl keeps the newest
snapshot per instance in this process's memory, never journaled (a push per instance every
interval would grow the journal without bound, and a snapshot is stale at once): a restart
forgets them until the next push. A snapshot older than the one kept (by its ``timestamp``) is
ignored, as PSRL's fork ignores it. Readers: ``GET /workers/stats`` (``engine_stats``), the
admission hook (``HookRequest`` siblings read ``DataPlane.instance_stats``) and the
``request_num_balance`` policy (with the gateway's own in-flight counts).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any

import attrs

MAX_REQUESTS = 65536  # per-request token maps kept per instance (a bigger one is cut)


class StatsRejected(ValueError):
    """An item that is not a stats snapshot (named in the message)."""


@attrs.frozen(slots=True)
class InstanceStats:
    running: int = 0
    waiting: int = 0
    kv_usage: float | None = None  # 0..1, None when the push did not say
    prompt_tokens: Mapping[str, int] = attrs.field(factory=dict)  # request id -> prompt tokens
    response_tokens: Mapping[str, int] = attrs.field(factory=dict)  # request id -> generated
    timestamp: dt.datetime | None = None  # the snapshot's own time (UTC)

    @property
    def requests(self) -> int:
        return self.running + self.waiting

    def total_tokens(self) -> int:
        return sum(self.prompt_tokens.values()) + sum(self.response_tokens.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "running": self.running,
            "waiting": self.waiting,
            "kv_usage": self.kv_usage,
            "prompt_tokens": sum(self.prompt_tokens.values()),
            "response_tokens": sum(self.response_tokens.values()),
            "requests_tracked": len(self.prompt_tokens),
            "timestamp": self.timestamp.isoformat().replace("+00:00", "Z") if self.timestamp else None,
        }


def _count(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StatsRejected(f"`{name}` must be a non-negative integer")
    return value


def _token_map(name: str, value: Any) -> dict[str, int]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise StatsRejected(f"`{name}` must be an object of request id -> token count")
    out = {}
    for key, count in list(value.items())[:MAX_REQUESTS]:
        out[str(key)] = _count(f"{name}.{key}", count)
    return out


def _timestamp(value: Any) -> dt.datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise StatsRejected("`timestamp` must be an RFC 3339 string")
    try:
        t = dt.datetime.fromisoformat(value)  # Python 3.11+ reads a trailing "Z"
    except ValueError:
        raise StatsRejected("`timestamp` must be an RFC 3339 string") from None
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def parse_snapshot(item: Mapping[str, Any]) -> InstanceStats:
    """One item of PSRL's push (``smg_adapter.build_worker_stats_update``): ``timestamp`` and
    ``scheduler_stats`` {``num_running_reqs``, ``num_waiting_reqs``, ``kv_cache_usage``,
    ``req_id_to_prompt_token_num``, ``req_id_to_response_token_num``}, each optional."""
    sched = item.get("scheduler_stats") or {}
    if not isinstance(sched, dict):
        raise StatsRejected("`scheduler_stats` must be an object")
    kv = sched.get("kv_cache_usage")
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, (int, float)) or math.isnan(kv)):
        raise StatsRejected("`kv_cache_usage` must be a number")
    return InstanceStats(
        running=_count("num_running_reqs", sched.get("num_running_reqs", 0)),
        waiting=_count("num_waiting_reqs", sched.get("num_waiting_reqs", 0)),
        kv_usage=None if kv is None else float(kv),
        prompt_tokens=_token_map("req_id_to_prompt_token_num", sched.get("req_id_to_prompt_token_num")),
        response_tokens=_token_map("req_id_to_response_token_num", sched.get("req_id_to_response_token_num")),
        timestamp=_timestamp(item.get("timestamp")),
    )


class InstanceStatsTable:
    """The newest pushed snapshot per instance ``(worker_id, dp_rank)`` (``worker_id``: the
    registry id of the engine's rank-0 record, as in ``x-base-worker-id``)."""

    def __init__(self) -> None:
        self._by_instance: dict[tuple[str, int], InstanceStats] = {}

    def get(self, worker_id: str, dp_rank: int) -> InstanceStats | None:
        return self._by_instance.get((worker_id, dp_rank))

    def put(self, worker_id: str, dp_rank: int, stats: InstanceStats) -> bool:
        """Keep ``stats`` unless the kept snapshot is newer; True when kept."""
        kept = self._by_instance.get((worker_id, dp_rank))
        if kept is not None and kept.timestamp and stats.timestamp and stats.timestamp < kept.timestamp:
            return False
        self._by_instance[(worker_id, dp_rank)] = stats
        return True

    def forget(self, keep) -> None:
        """Drop the instances not in ``keep`` (a set of (worker_id, dp_rank)): engines removed."""
        for key in [k for k in self._by_instance if k not in keep]:
            del self._by_instance[key]

    def __len__(self) -> int:
        return len(self._by_instance)

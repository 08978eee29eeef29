"""PSRL's selection settings and the pure rules PSRL's fork applies with them.

- ``PsrlConfig`` (``smgrl.core.config``): what ``RouterArgs`` (``smgrl.launch_router``) sets.
- ``kv_refusal``: PSRL's engine-state admission gate (``enable_kv_admission_control``: admit only
  to an instance whose engine reports no waiting request; ``kv_capacity_threshold``: only below
  that KV usage), over what ``POST /workers/update_stats`` last reported. An instance with no
  report is admitted: the gate only acts on what an engine said.
- ``reservable`` / ``by_indicator``: how PSManager's ``CanReserveRequest`` and
  ``GetReserveIndicator`` answers narrow and order the candidates (``Somoku/smg`` psrl-dev
  7169017b, ``worker_selector/psrl.rs`` stages 4 and 5).
- ``psm_version`` / ``psm_request_id``: PSManager speaks int64 versions and request ids
  (``int64``, which the routing loop's ``small_id`` order reads too).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol, TypeVar

from smgrl.core.config import PsrlConfig
from smgrl.core.selector import rust_trim


class Stats(Protocol):
    @property
    def waiting(self) -> int: ...

    @property
    def kv_usage(self) -> float | None: ...


def kv_refusal(stats: Stats | None, cfg: PsrlConfig) -> str | None:
    """Why the KV gate holds an instance out (``engine_waiting``, ``kv_full``), or None."""
    if stats is None:
        return None
    if cfg.reject_on_waiting and stats.waiting > 0:
        return "engine_waiting"
    usage = stats.kv_usage
    if cfg.kv_capacity_threshold < 1.0 and usage is not None and usage >= cfg.kv_capacity_threshold:
        return "kv_full"
    return None


def kv_gate_on(cfg: PsrlConfig) -> bool:
    return cfg.reject_on_waiting or cfg.kv_capacity_threshold < 1.0


_INT64_TEXT = re.compile(r"[+-]?[0-9]+")


def int64(raw: str | None) -> int | None:
    """``raw`` as an int64, or None: the one reading of PSRL's numeric ids and versions
    (PSManager's fields, the routing loop's ``small_id`` order). It reads as the fork's
    ``str::trim().parse::<i64>()`` does: whitespace around is trimmed, then an optional sign and
    ASCII digits only (``int()`` alone would also take ``1_000`` and non-ASCII digits)."""
    if raw is None:
        return None
    text = rust_trim(raw)
    if not _INT64_TEXT.fullmatch(text):
        return None
    value = int(text)
    return value if -(2**63) <= value < 2**63 else None


def psm_version(version: str | None) -> int:
    """A version as PSManager's int64: a whole number as itself, anything else 0 (the fork reads
    an unknown engine version as 0, PSRL's initial rollout-instance version)."""
    value = int64(version)
    return 0 if value is None else value


def psm_request_id(request_id: str | None) -> int | None:
    """PSRL's request id as PSManager's int64; None when it is not one (PSManager is then not
    asked about the request: it cannot know it)."""
    return int64(request_id)


T = TypeVar("T")


def unique_versions(candidates: Sequence[T], version: Callable[[T], int]) -> list[int]:
    """The candidates' PSManager versions, ascending, each once (what the fork asks about)."""
    return sorted({version(c) for c in candidates})


def reservable(
    candidates: Sequence[T], version: Callable[[T], int], versions: Sequence[int], results: Sequence[bool]
) -> list[T]:
    """Stage 4: keep the candidates whose version ``CanReserveRequest`` said yes to (``results``
    row-major over one request; a missing answer is a no)."""
    ok = {v for v, yes in zip(versions, results, strict=False) if yes}
    return [c for c in candidates if version(c) in ok]


def by_indicator(
    candidates: Sequence[T],
    version: Callable[[T], int],
    indicators: Mapping[int, float],
    versioned: bool,
) -> list[T]:
    """Stage 5 with ``reserve_capability``: ascending indicator (lower is better; a version with no
    indicator counts 0.0; NaN sorts last), ties by version (newest first for an unversioned
    request, lowest first for a versioned one). Stable."""

    def key(c: T) -> tuple[int, float, int]:
        v = version(c)
        ind = indicators.get(v, 0.0)
        nan = math.isnan(ind)
        return (1 if nan else 0, 0.0 if nan else ind, v if versioned else -v)

    return sorted(candidates, key=key)

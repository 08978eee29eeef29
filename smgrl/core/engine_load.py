"""An engine's load sample as SMG 1.13.0 shows it: the ``engine_load`` of a ``GET /workers`` row.

SMG's load monitor reads ``GET /v1/loads?include=core,disagg,queues,memory`` and keeps the answer
as its ``WorkerLoadResponse`` (serde, every field defaulted): known fields are kept, in SMG's
order, unknown ones dropped, missing ones filled with 0 / ``""``; a wrongly typed field makes the
whole answer "not a load response". Without ``/v1/loads`` it reads the engine's Prometheus
``/metrics`` (SGLang's or vLLM's gauges) into one synthesized rank. Checked against the 1.13.0
wheel (the fakes' answers, and a hand-written answer with every field, unknown keys and
optional sections) and SMG's ``worker/monitor.rs`` (docs/deviations.md, "engine_load").

Pure: bytes in, a dict (or ``None``) out.
"""

from __future__ import annotations

import datetime
import json
import math
from typing import Any, NoReturn

# /v1/loads: the query SMG sends, and the statuses that mean "this engine has no such route"
# (remembered per engine: the monitor stops asking and reads /metrics instead).
LOADS_PATH = "/v1/loads?include=core,disagg,queues,memory"
ABSENT_STATUSES = frozenset({404, 405, 501})
# What one engine's sample may hold. A rank costs 3 bytes on the wire (``{}``) and about 1 KB in
# memory and in every ``GET /workers``; SMG keeps whatever arrives (its probe reads up to 4 MiB),
# which one engine could turn into gigabytes here. A real answer is under 1 KB per rank.
MAX_RANKS = 1024
MAX_LOADS_BYTES = 1024 * 1024

_I32 = "i32"
_F64 = "f64"
_STR = "str"


class NotALoadResponse(ValueError):
    """A 2xx answer that is not SMG's load response (as definitive as a 404 for SMG)."""


class LoadsTooLarge(Exception):
    """A load answer over ``MAX_LOADS_BYTES`` or ``MAX_RANKS``: no sample this time (a failed
    read), but not a fact about the engine's route: it is asked again at the next tick."""


# Field tables in SMG's serialisation order: (name, type, optional). An optional field is left
# out when absent or null (serde's Option + skip_serializing_if), a required one defaults.
_MEMORY = (("weight_gb", _F64), ("kv_cache_gb", _F64), ("graph_gb", _F64), ("token_capacity", _I32))
_QUEUES = (("waiting", _I32), ("grammar", _I32), ("paused", _I32), ("retracted", _I32))
_AGGREGATE = (
    ("total_running_reqs", _I32),
    ("total_waiting_reqs", _I32),
    ("total_reqs", _I32),
    ("avg_token_usage", _F64),
    ("avg_throughput", _F64),
    ("avg_utilization", _F64),
)
_RANK: tuple[tuple[str, Any, bool], ...] = (
    ("dp_rank", _I32, False),
    ("num_running_reqs", _I32, False),
    ("num_waiting_reqs", _I32, False),
    ("num_waiting_uncached_tokens", _I32, False),
    ("num_total_reqs", _I32, False),
    ("num_used_tokens", _I32, False),
    ("max_total_num_tokens", _I32, False),
    ("token_usage", _F64, False),
    ("active_token_usage", _F64, True),
    ("gen_throughput", _F64, False),
    ("cache_hit_rate", _F64, False),
    ("utilization", _F64, False),
    ("max_running_requests", _I32, False),
    ("memory", _MEMORY, True),
    ("queues", _QUEUES, True),
    ("kv_transfer_latency_ms", _F64, True),
    ("kv_transfer_speed_gb_s", _F64, True),
    ("prefill_queue_reqs", _I32, True),
    ("decode_queue_reqs", _I32, True),
    ("disagg_mode", _STR, True),
)
_DEFAULTS = {_I32: 0, _F64: 0.0, _STR: ""}


def _value(kind: Any, value: Any, where: str) -> Any:
    if isinstance(kind, tuple):  # a nested struct, every field defaulted
        if not isinstance(value, dict):
            raise NotALoadResponse(f"{where}: not an object")
        return {
            name: _value(k, value[name], f"{where}.{name}") if name in value else _DEFAULTS[k]
            for name, k in kind
        }
    if kind == _I32:
        # serde: an integer in range; a float (even 4.0), a bool or null is refused.
        if type(value) is not int or not -(2**31) <= value < 2**31:
            raise NotALoadResponse(f"{where}: not an i32")
        return value
    if kind == _F64:
        if type(value) not in (int, float) or not math.isfinite(value):
            # serde_json refuses NaN/Infinity and numbers out of f64's range (1e400).
            raise NotALoadResponse(f"{where}: not a number")
        return float(value)
    if not isinstance(value, str):
        raise NotALoadResponse(f"{where}: not a string")
    return value


def _rank(row: Any, i: int) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise NotALoadResponse(f"loads[{i}]: not an object")
    out: dict[str, Any] = {}
    for name, kind, optional in _RANK:
        value = row.get(name)
        if name not in row or (optional and value is None):
            if not optional:
                out[name] = _DEFAULTS[kind]
            continue
        out[name] = _value(kind, value, f"loads[{i}].{name}")
    return out


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def parse_loads(data: bytes) -> dict[str, Any] | None:
    """A 2xx ``/v1/loads`` body as SMG's ``engine_load``; ``None`` when it reports no rank yet
    (SMG keeps asking). Raises :class:`NotALoadResponse` for anything that is not one, and
    :class:`LoadsTooLarge` for one too large to keep (decided before parsing it, where it can)."""
    if len(data) > MAX_LOADS_BYTES:
        raise LoadsTooLarge(f"{len(data)} bytes (at most {MAX_LOADS_BYTES})")
    try:
        doc = json.loads(data, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError, RecursionError, OverflowError):
        raise NotALoadResponse("not JSON") from None
    if not isinstance(doc, dict):
        raise NotALoadResponse("not an object")
    out: dict[str, Any] = {}
    for name, kind in (("timestamp", _STR), ("version", _STR), ("dp_rank_count", _I32)):
        out[name] = _value(kind, doc[name], name) if name in doc else _DEFAULTS[kind]
    loads = doc.get("loads", [])
    if not isinstance(loads, list):
        raise NotALoadResponse("loads: not a list")
    if len(loads) > MAX_RANKS:
        raise LoadsTooLarge(f"{len(loads)} ranks (at most {MAX_RANKS})")
    out["loads"] = [_rank(row, i) for i, row in enumerate(loads)]
    if doc.get("aggregate") is not None:
        out["aggregate"] = _value(_AGGREGATE, doc["aggregate"], "aggregate")
    return out if out["loads"] else None


# -- /metrics (an engine without /v1/loads) ------------------------------------------------------


def scrape(text: str) -> dict[str, list[float]]:
    """Prometheus text as SMG's ``PromScrape``: metric name -> its samples' values (comments and
    unparsable values skipped; labels ignored)."""
    samples: dict[str, list[float]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        close = line.rfind("}")
        if close >= 0:
            head, tail = line[: close + 1], line[close + 1 :]
        else:
            parts = line.split(None, 1)
            if len(parts) < 2:
                continue
            head, tail = parts
        tokens = tail.split()
        if not tokens:
            continue
        try:
            value = float(tokens[0])
        except ValueError:
            continue
        samples.setdefault(head.split("{", 1)[0].strip(), []).append(value)
    return samples


def _sum(m: dict[str, list[float]], name: str) -> float:
    return sum(m.get(name, ()))


def _mean(m: dict[str, list[float]], name: str) -> float:
    values = m.get(name)
    return sum(values) / len(values) if values else 0.0


def _as_i32(x: float) -> int:
    """Rust's saturating ``as i32``: NaN is 0, out-of-range values clamp."""
    if math.isnan(x):
        return 0
    return int(max(-(2**31), min(2**31 - 1, x)))


def metrics_load(runtime: str | None, text: str) -> dict[str, Any] | None:
    """One synthesized rank from an engine's ``/metrics``, as SMG builds it for SGLang and vLLM
    (``None`` without the KV-usage gauge, and for any other engine)."""
    m = scrape(text)
    rank: dict[str, Any]
    if runtime == "vllm":
        usage = next((n for n in ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc") if m.get(n)), None)
        if usage is None:
            return None
        rank = {
            "num_running_reqs": _as_i32(_sum(m, "vllm:num_requests_running")),
            "num_waiting_reqs": _as_i32(_sum(m, "vllm:num_requests_waiting")),
            "token_usage": _mean(m, usage),
            "cache_hit_rate": _mean(m, "vllm:gpu_prefix_cache_hit_rate"),
        }
    elif runtime == "sglang":
        prefix = next((p for p in ("sglang:", "sglang_") if m.get(p + "token_usage")), None)
        if prefix is None:
            return None
        rank = {
            "num_running_reqs": _as_i32(_sum(m, prefix + "num_running_reqs")),
            "num_waiting_reqs": _as_i32(_sum(m, prefix + "num_queue_reqs")),
            "token_usage": _mean(m, prefix + "token_usage"),
            "gen_throughput": _mean(m, prefix + "gen_throughput"),
            "cache_hit_rate": _mean(m, prefix + "cache_hit_rate"),
            "utilization": _mean(m, prefix + "utilization"),
        }
    else:
        return None
    row = {name: rank.get(name, _DEFAULTS[kind]) for name, kind, optional in _RANK if not optional}
    summary: dict[str, Any] = _finite({"timestamp": "", "version": "", "dp_rank_count": 1, "loads": [row]})
    return summary


def _finite(value: Any) -> Any:
    """serde_json writes a non-finite float as ``null`` (Python's json would write ``NaN``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


# -- GET /get_loads -------------------------------------------------------------------------------


def rfc3339_now(ns: int) -> str:
    """chrono's ``to_rfc3339()`` of a UTC instant given in nanoseconds (as many fractional digits
    as needed: none, 3, 6 or 9)."""
    secs, nanos = divmod(ns, 1_000_000_000)
    head = datetime.datetime.fromtimestamp(secs, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if nanos == 0:
        frac = ""
    elif nanos % 1_000_000 == 0:
        frac = f".{nanos // 1_000_000:03d}"
    elif nanos % 1000 == 0:
        frac = f".{nanos // 1000:06d}"
    else:
        frac = f".{nanos:09d}"
    return f"{head}{frac}+00:00"


def loads_summary(
    samples: list[tuple[str, str, dict[str, Any]]], timestamp: str, version: str
) -> dict[str, Any]:
    """SMG's ``GET /get_loads``: every rank of every sample (``(url, worker_type, engine_load)``,
    in order) flattened behind its worker's URL and type, and their totals and means."""
    rows = [
        {"worker": url, "worker_type": kind, **rank}
        for url, kind, sample in samples
        for rank in sample["loads"]
    ]
    out: dict[str, Any] = {
        "timestamp": timestamp,
        "version": version,
        "dp_rank_count": len(rows),
        "loads": rows,
    }
    if rows:
        running = sum(r["num_running_reqs"] for r in rows)
        waiting = sum(r["num_waiting_reqs"] for r in rows)
        out["aggregate"] = {
            "total_running_reqs": running,
            "total_waiting_reqs": waiting,
            "total_reqs": running + waiting,
            "avg_token_usage": sum(r["token_usage"] for r in rows) / len(rows),
            "avg_throughput": sum(r["gen_throughput"] for r in rows) / len(rows),
            "avg_utilization": sum(r["utilization"] for r in rows) / len(rows),
        }
    return out

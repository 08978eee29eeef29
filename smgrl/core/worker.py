"""The registry's worker record and the pure rules around it (DP ranks, engine names, label sizes).

A ``Worker`` is one registry entry, exactly as SMG's registry holds it: a DP-aware engine with
``dp_size`` N is N entries ``<base_url>@0 .. @N-1`` that share one engine address. Records are
frozen; the registry projection (``smgrl.state.registry``) replaces them, never mutates them.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Mapping

import attrs

# Runtime names SMG renders lower-case in the discovery row's ``engine`` field; anything else
# (``unspecified``, an unknown hint) is shown as ``unknown``.
KNOWN_ENGINES = frozenset({"sglang", "vllm", "trtllm", "mlx", "tokenspeed", "generic", "external"})
WORKER_TYPES = ("regular", "prefill", "decode", "encode")
HEALTH_STATES = ("pending", "ready", "not_ready", "failed", "draining")
URL_SCHEMES = ("http://", "https://", "grpc://", "grpcs://", "ipc://")


@attrs.frozen
class Worker:
    id: str
    url: str
    base_url: str
    worker_type: str = "regular"
    connection_mode: str = "http"
    runtime: str = "unspecified"
    model_id: str | None = None
    caller_labels: Mapping[str, str] = attrs.field(factory=dict)
    discovered_labels: Mapping[str, str] = attrs.field(factory=dict)
    status: str = "pending"
    dp_aware: bool = False
    dp_rank: int | None = None
    dp_size: int | None = None
    # The id of the registered (rank-0) record: DP ranks created at discovery point back to it,
    # and removing it removes the whole group (one engine address).
    group: str = ""
    has_api_key: bool = False
    bootstrap_port: int | None = None
    source: str = "api"
    registered_seq: int = 0

    @property
    def labels(self) -> dict[str, str]:
        """Discovered metadata overlaid with caller labels (caller labels win, as in SMG)."""
        if not self.caller_labels:
            return dict(self.discovered_labels)
        return {**self.discovered_labels, **self.caller_labels}

    @property
    def engine(self) -> str:
        name = (self.runtime or "").lower()
        return name if name in KNOWN_ENGINES else "unknown"

    @property
    def effective_model_id(self) -> str:
        if self.model_id:
            return self.model_id
        labels = self.labels
        return labels.get("served_model_name") or labels.get("model_path") or "unknown"

    @property
    def is_visible(self) -> bool:
        """Pending registrations are invisible to ``/v1/rl`` (SMG: 404, never matched)."""
        return self.status != "pending"


def dp_rank_of(url: str) -> int:
    """Rank = integer after the last ``@``; missing or non-numeric gives 0 (SMG's rule)."""
    _, sep, tail = url.rpartition("@")
    if not sep or "/" in tail or not tail.isdigit():
        return 0
    return int(tail)


def strip_rank(url: str) -> str:
    """The base URL of a DP rank URL (``http://h:p@1`` -> ``http://h:p``)."""
    head, sep, tail = url.rpartition("@")
    if sep and tail.isdigit() and "/" not in tail:
        return head
    return url


def connection_mode_for(url: str) -> str:
    if url.startswith(("grpc://", "grpcs://")):
        return "grpc"
    if url.startswith("ipc://"):
        return "zmq"
    return "http"


def parse_size(value: str | None) -> int | None:
    """Labels ``tp_size``/``dp_size``/``pp_size``: trimmed, unsigned int, else None."""
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        return None
    number = int(text)
    return number if number < 2**64 else None


def new_worker_id(now_ms: int | None = None) -> str:
    """A UUIDv7 string (48-bit millisecond timestamp, version 7, variant 10, 74 random bits)."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


def is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True

"""Engine route paths, query passthrough and the bounded metric ``op`` label (docs/rl-control-plane.md, "Calling one engine", "Metrics").

Mirrors SMG 1.13.0's ``crates/rl/src/path.rs`` and ``metrics.rs``. The messages are part of
the wire contract (``invalid engine path: <reason>``), so they are constants here.
"""

from __future__ import annotations

from typing import Any

MAX_SEGMENTS = 4

PATH_EMPTY = "path is empty"
PATH_QUERY_OR_FRAGMENT = "path must not contain `?` or `#`"
PATH_TOO_DEEP = f"path has more than {MAX_SEGMENTS} segments"
PATH_EMPTY_SEGMENT = "path has an empty segment"
PATH_DOT_SEGMENT = "path must not contain `.` or `..` segments"

_SEGMENT_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")

# Operations that get their own `op` label; anything else is `other`, so callers cannot mint
# unbounded Prometheus label values by inventing paths.
KNOWN_OPS = frozenset(
    {
        "pause_generation",
        "continue_generation",
        "update_weights_from_disk",
        "update_weights_from_tensor",
        "update_weights_from_distributed",
        "init_weights_update_group",
        "destroy_weights_update_group",
        "update_weight_version",
        "flush_cache",
        "abort_request",
        "release_memory_occupation",
        "resume_memory_occupation",
        "pause",
        "resume",
        "sleep",
        "wake_up",
        "collective_rpc",
        "server_info",
        "get_server_info",
        "health",
    }
)


class EnginePathError(ValueError):
    """An engine path the control plane refuses to forward (``invalid_engine_path``, 400)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"invalid engine path: {reason}")

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return (type(self), (self.reason,))


def validate_engine_path(decoded: str) -> str:
    """Validate the already percent-decoded catch-all; return it without one leading ``/``.

    Checks run in the crate's order, so the first failing rule names the reason: empty,
    ``?``/``#``, segment count, then per segment empty / dot / character set.
    """
    path = decoded.removeprefix("/")
    if not path:
        raise EnginePathError(PATH_EMPTY)
    if "?" in path or "#" in path:
        raise EnginePathError(PATH_QUERY_OR_FRAGMENT)
    segments = path.split("/")
    if len(segments) > MAX_SEGMENTS:
        raise EnginePathError(PATH_TOO_DEEP)
    for seg in segments:
        if not seg:
            raise EnginePathError(PATH_EMPTY_SEGMENT)
        if seg in (".", ".."):
            raise EnginePathError(PATH_DOT_SEGMENT)
        if not all(c in _SEGMENT_CHARS for c in seg):
            raise EnginePathError(f"segment `{seg}` contains characters outside [A-Za-z0-9._-]")
    return path


def passthrough_query(raw: str | None) -> str | None:
    """The caller's raw query (no ``?``) minus every ``selector`` piece; ``None`` when nothing is left.

    Pieces are neither decoded nor re-encoded; empty pieces (``a&&b``) are dropped, order and
    duplicates are kept. Only the exact raw key ``selector`` is dropped (``selectorx``,
    ``Selector`` and ``selector%3D`` survive).
    """
    if not raw:
        return None
    kept = [piece for piece in raw.split("&") if piece and piece.split("=", 1)[0] != "selector"]
    return "&".join(kept) if kept else None


def metric_op(path: str) -> str:
    """Bounded ``op`` label: the validated path when it is exactly a known operation, else ``other``."""
    return path if path in KNOWN_OPS else "other"

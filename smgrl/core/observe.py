"""What a control call means for an engine's state, read from its path and request body (pure).

These are the passthrough-observation rules of SMG's next milestone (M2, docs/data-plane.md), which
smgrl adopts: a 2xx answer to one of these calls confirms the intent; any other answer changes
nothing. The intent is computed once, when the call is made, and stored in the journal's
``control.started`` event, so replay never needs the (possibly compacted) request body.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from smgrl.core.version import observed_version

VERSION_FIELDS = {
    "update_weights_from_disk": "weight_version",
    "update_weights_from_tensor": "weight_version",
    "update_weights_from_distributed": "weight_version",
    "update_weights_from_mooncake": "weight_version",  # TokenSpeed builds advertising mooncake
    "update_weight_version": "new_version",
    "finish_weight_update": "weight_version",  # vLLM's weight-transfer engine
}
CONTROL_STATES = {
    "pause_generation": "paused",
    "pause": "paused",
    "continue_generation": "active",
    "resume": "active",
    "wake_up": "active",
    "resume_memory_occupation": "active",
    "release_memory_occupation": "asleep",
    "sleep": "asleep",
}
# Phases of a refit cycle, for grouping calls into cycles (``smgrl journal refits``).
PHASES = {
    **{p: "pause" for p in ("pause_generation", "pause")},
    **{p: "resume" for p in ("continue_generation", "resume")},
    **{p: "update" for p in VERSION_FIELDS},
    "begin_weight_update": "update",
    "end_weight_update": "update",
    "start_weight_update": "update",
    "update_weights": "update",
    "collective_rpc": "update",
    "init_weights_update_group": "setup",
    "init_weight_transfer_engine": "setup",
    "destroy_weights_update_group": "teardown",
    "shutdown_weight_transfer_engine": "teardown",
    "flush_cache": "flush",
    "reset_prefix_cache": "flush",
    "release_memory_occupation": "sleep",
    "sleep": "sleep",
    "resume_memory_occupation": "wake",
    "wake_up": "wake",
}


@attrs.frozen
class Intent:
    version: str | None = None
    control: str | None = None
    phase: str | None = None

    def to_json(self) -> dict[str, Any] | None:
        if self.version is None and self.control is None and self.phase is None:
            return None
        return {"version": self.version, "control": self.control, "phase": self.phase}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Intent:
        if not data:
            return NO_INTENT
        return cls(data.get("version"), data.get("control"), data.get("phase"))


NO_INTENT = Intent()


def intent_of(method: str, path: str, body: bytes) -> Intent:
    """The state change a 2xx answer to ``method path`` with this body would confirm."""
    if method == "HEAD":
        return NO_INTENT
    phase = PHASES.get(path)
    control = CONTROL_STATES.get(path)
    version = None
    field = VERSION_FIELDS.get(path)
    if field is not None and body:
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            data = None
        if isinstance(data, dict) and field in data:
            version = observed_version(data[field])
    return Intent(version=version, control=control, phase=phase)

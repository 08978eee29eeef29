"""Which instances may take a request right now: the state-aware filter. Pure.

Reads the registry's health and the journal's engine projection (``EngineFacts``). An instance is
held out, with the reason named (the 503 says why when nothing is left):

- ``unhealthy``: the registry does not say ``ready``;
- ``paused`` / ``asleep``: a confirmed pause or release, never routed (a refit is in progress);
- ``unknown``: a pause/continue call got no answer, so the engine's state is not known;
- ``mixed``: the engine's last refit failed while the rest of the fleet moved on;
- ``unconfirmed``: a call that would have set its version got no answer;
- ``quarantined``: a refit (or an operator) quarantined it (smgrl/state/sagas.py).

The last three hold until a later call confirms the engine (the projection clears them). Version
policies (``smgrl.routing.version_policy``) then narrow what is left (``stale``,
``unversioned``).
"""

from __future__ import annotations

from smgrl.core import EngineFacts

HOLD_REASONS = ("unhealthy", "paused", "asleep", "unknown", "mixed", "unconfirmed", "quarantined")


def hold_reason(status: str, facts: EngineFacts | None) -> str | None:
    """Why an instance is held out of routing, or None when it may be selected."""
    if status != "ready":
        return "unhealthy"
    if facts is None:
        return None
    if facts.quarantined is not None:
        return "quarantined"
    control = facts.control
    if control != "active":
        return control if control in ("paused", "asleep") else "unknown"
    if facts.mixed:
        return "mixed"
    if not facts.version_known:
        return "unconfirmed"
    return None


def effective_version(facts: EngineFacts | None, label_version: str | None) -> str | None:
    """The engine's version as the table knows it: a confirmed/API version, else the label seed."""
    if facts is not None and facts.weight_version is not None:
        return facts.weight_version
    return label_version

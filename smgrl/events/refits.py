"""Journal events of refit sagas and quarantine (docs/journal.md, docs/refits.md).

A saga (stream ``refit:<id>``) is ``refit.started`` (the whole plan), then per phase a
``refit.step`` intent (durable before any engine is called; it names the control operations the
phase runs, each journaled as ``control.*`` in its own ``op:<id>`` stream) and a
``refit.step_done`` outcome (each engine's verdict), ``refit.state`` for waits (a trainer's
transfer), and ``refit.finished``. Recovery after a crash is a fold of these events.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from journal.codec import Event, event_type, tuple_field

__all__ = [
    "RefitFinished",
    "RefitStarted",
    "RefitState",
    "RefitStep",
    "RefitStepDone",
    "WorkerIdentitySeen",
    "WorkerQuarantined",
    "WorkerReleased",
]

OnFailure = Literal["quarantine", "rollback", "abort"]


# Shaped like smgrl/events/catalogue.py's classes: each is a contract of its own; nothing to share but the decorator.
@event_type("refit.started", schema=2)
@attrs.frozen(slots=True, kw_only=True)
class RefitStarted(Event):
    """A refit was accepted: its request and its per-engine plan.

    ``engines`` holds one dict per engine: ``worker_id``, ``url``, ``base_url``, ``engine``
    (kind), ``pause_mode``, ``rank_offset`` (distributed), ``previous_version`` and
    ``previous_model_path`` (what a rollback reloads), ``plan`` (phases with their native calls).
    """

    refit_id: str
    source: Literal["disk", "distributed"]
    weight_version: str
    on_failure: OnFailure
    selector: str | None = None
    model_path: str | None = None
    distributed: dict[str, Any] | None = None  # master_address, master_port, group_name, backend, checksums
    world_size: int | None = None
    pause_mode: str | None = None
    flush: bool = True
    force: bool = False
    transfer_timeout_secs: float | None = None
    engines: tuple[dict[str, Any], ...] = tuple_field()
    principal: str | None = None
    request_id: str | None = None
    # Several gateway processes on one journal (schema 2): the process driving the saga; when it
    # dies, the recovery lease's holder resumes the saga (smgrl/cluster/sharing.py).
    gateway: str | None = None


@event_type("refit.step", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class RefitStep(Event):
    """Intent: ``phase`` is about to run on ``worker_ids`` through the control operations
    ``op_ids`` (durable before any engine is called)."""

    refit_id: str
    phase: str
    worker_ids: tuple[str, ...] = tuple_field()
    op_ids: tuple[str, ...] = tuple_field()
    rollback: bool = False


@event_type("refit.step_done", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class RefitStepDone(Event):
    """Outcome of a phase: per engine ``{"worker_id", "result": ok|failed|unknown, "detail",
    "version"}`` (``version`` = what a read-back reported; ``detail`` = why it failed)."""

    refit_id: str
    phase: str
    results: tuple[dict[str, Any], ...] = tuple_field()
    rollback: bool = False


@event_type("refit.state", schema=2)
@attrs.frozen(slots=True, kw_only=True)
class RefitState(Event):
    """A saga-level state change: ``awaiting_transfer``, ``committing``, ``rolling_back``,
    ``recovering``; ``detail`` says why (e.g. the transfer's timeout)."""

    refit_id: str
    state: str
    detail: str | None = None
    # Schema 2: on ``recovering``, the process that resumed the saga and drives it from here on
    # (several processes on one journal: the trainer's hand-off is forwarded to it).
    gateway: str | None = None


@event_type("refit.finished", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class RefitFinished(Event):
    """The saga ended. ``result``: ``succeeded`` (every engine on the new version),
    ``quarantined`` (the rest resumed on it; ``quarantined`` names the held-out engines),
    ``rolled_back``, ``aborted`` (everything left paused) or ``failed``."""

    refit_id: str
    result: Literal["succeeded", "quarantined", "rolled_back", "aborted", "failed"]
    weight_version: str
    quarantined: tuple[str, ...] = tuple_field()
    detail: str | None = None


@event_type("worker.quarantined", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class WorkerQuarantined(Event):
    """An engine is held out of routing until released: by a refit (``refit_id``), by hand
    (``principal``) or by the recovered-engine rule."""

    worker_id: str
    base_url: str
    reason: str
    refit_id: str | None = None
    principal: str | None = None


@event_type("worker.released", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class WorkerReleased(Event):
    """A quarantine was lifted: by hand, or by a refit that loaded and verified the engine."""

    worker_id: str
    base_url: str
    reason: str
    refit_id: str | None = None
    principal: str | None = None


@event_type("worker.identity_seen", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class WorkerIdentitySeen(Event):
    """The engine's startup identity (the server-info field that changes when it restarts:
    SGLang ``startup_time``, TokenSpeed ``start_time``) as the health checker read it: the first
    time (``previous`` null), and whenever it changed (the engine restarted; a
    ``worker.quarantined`` with a ``recovered`` reason is committed with it)."""

    worker_id: str
    base_url: str
    identity: str
    previous: str | None = None

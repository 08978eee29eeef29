"""Errors of the refit routes (stable codes; docs/refits.md)."""

from __future__ import annotations

from smgrl.core.errors import RlError


# Shaped like smgrl/core/errors.py's classes (one per code); the behaviour is ApiError's.
class RefitUnsupported(RlError):
    """Some selected engines cannot take this refit (their kind, source or pause mode)."""

    code, status = "refit_unsupported", 409


class CheckpointMissing(RlError):
    """A disk refit names an absolute checkpoint path that does not exist, and every selected
    engine runs on this host (reads the same filesystem): refused before any engine is paused."""

    code, status = "checkpoint_not_found", 409


class VersionLeft(RlError):
    """The fleet already left this version (published earlier, per the journal) and force is off."""

    code, status = "version_left", 409


class RefitInProgress(RlError):
    code, status = "refit_in_progress", 409


class RefitNotFound(RlError):
    code, status = "refit_not_found", 404

    def __init__(self, refit_id: str) -> None:
        super().__init__(f"refit `{refit_id}` not found", id=refit_id)


class RefitWrongState(RlError):
    """The refit is not in a state that takes this call (e.g. commit when not awaiting a transfer)."""

    code, status = "refit_state", 409


class RefitDriverUnavailable(RlError):
    """Several gateway processes: the process driving the saga does not answer (it died) and no
    other process resumed the saga yet, or the saga is being resumed. Retryable: the recovery
    lease's holder resumes it within about the lease ttl plus a round (docs/scale-out.md)."""

    code, status = "refit_driver_unavailable", 503
    retryable = True

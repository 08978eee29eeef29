"""Refits as first-class operations: the pure per-kind plan (``plan``), the request's parsing
(``request``), the journaled saga runner (``saga``) and crash recovery (a fold of the journal plus
the remaining steps; see docs/refits.md)."""

from smgrl.refit.errors import (
    CheckpointMissing,
    RefitDriverUnavailable,
    RefitInProgress,
    RefitNotFound,
    RefitUnsupported,
    RefitWrongState,
    VersionLeft,
)
from smgrl.refit.recovered import STREAM, hold_recovered, identity_events
from smgrl.refit.request import parse_refit
from smgrl.refit.saga import RefitService

__all__ = [
    "STREAM",
    "CheckpointMissing",
    "RefitDriverUnavailable",
    "RefitInProgress",
    "RefitNotFound",
    "RefitService",
    "RefitUnsupported",
    "RefitWrongState",
    "VersionLeft",
    "hold_recovered",
    "identity_events",
    "parse_refit",
]

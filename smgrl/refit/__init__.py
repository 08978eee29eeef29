"""Refits as first-class operations: the pure per-kind plan (``plan``), the request's parsing
(``request``), the journaled saga runner (``saga``) and crash recovery (a fold of the journal plus
the remaining steps; see docs/refits.md)."""

from smgrl.refit.recovered import hold_recovered
from smgrl.refit.request import parse_refit
from smgrl.refit.saga import RefitService

__all__ = [
    "RefitService",
    "hold_recovered",
    "parse_refit",
]

"""Refits as first-class operations: the pure per-kind plan (``plan``), the request's parsing
(``request``), the journaled saga runner (``saga``) and crash recovery (a fold of the journal plus
the remaining steps; see docs/refits.md)."""

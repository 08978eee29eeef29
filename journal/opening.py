"""``open_store(target)``: the store a ``--journal`` value names, chosen by its form.

* ``postgresql://...`` (or ``postgres://``): :class:`journal.postgres.PgStore` (psycopg needed);
* ``:memory:``: :class:`MemoryStore` (nothing survives the process);
* anything else: a path, :class:`SqliteStore`.

``describe(target)`` is how to show a target anywhere (a URL's password replaced by ``***``).
"""

from __future__ import annotations

from typing import Any

from .memory import MemoryStore
from .store import SqliteStore
from .urls import is_postgres_url, redact_url

__all__ = ["describe", "is_postgres_url", "open_store"]


def open_store(target: str, *, readonly: bool = False, **options: Any) -> Any:
    """Open the journal ``target`` names; ``options`` go to that store's ``open``."""
    if is_postgres_url(target):
        from .postgres import PgStore

        return PgStore.open(target, readonly=readonly, **options)
    if target == ":memory:":
        return MemoryStore()
    return SqliteStore.open(target, readonly=readonly, **options)


def describe(target: str) -> str:
    return redact_url(target) if is_postgres_url(target) else target

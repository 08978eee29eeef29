"""Fixtures of the journal tests: ``backend`` runs a test against SqliteStore, MemoryStore and
PgStore (a fresh schema of one real PostgreSQL server per session: ``pg_server``)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pg_harness
import pytest
from journal_helpers import MemoryBackend, PgBackend, SqliteBackend

_schemas = itertools.count(1)


@pytest.fixture(scope="session")
def pg_server() -> Iterator[pg_harness.PgServer]:
    why = pg_harness.unavailable()
    if why is not None:
        pytest.skip(f"PostgreSQL tests need a server: {why}")
    server = pg_harness.PgServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pg_url(pg_server: pg_harness.PgServer) -> str:
    """A journal URL on a schema no other test uses."""
    return pg_server.url(f"t{next(_schemas)}")


@pytest.fixture(params=["sqlite", "memory", "postgres"])
def backend(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[SqliteBackend | MemoryBackend | PgBackend]:
    if request.param == "postgres":
        b = PgBackend(request.getfixturevalue("pg_url"))
    elif request.param == "sqlite":
        b = SqliteBackend(tmp_path)
    else:
        b = MemoryBackend(tmp_path)
    yield b
    b.close()


@pytest.fixture(autouse=True)
def _journal_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`smgrl journal` on a postgresql:// URL keeps a cache (smgrl/cli/journal/pgmirror.py): each
    test's in its own directory (subprocesses inherit it), never the user's ~/.cache."""
    monkeypatch.setenv("SMGRL_JOURNAL_CACHE", str(tmp_path / "journal-cache"))

"""Fixtures of the journal tests: ``backend`` runs a test against SqliteStore and MemoryStore."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from journal_helpers import MemoryBackend, SqliteBackend


@pytest.fixture(params=["sqlite", "memory"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SqliteBackend | MemoryBackend]:
    b = SqliteBackend(tmp_path) if request.param == "sqlite" else MemoryBackend(tmp_path)
    yield b
    b.close()

"""README.md's documentation list names every page of docs/ (a new page without a line fails)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
LISTED = README[README.index("## Documentation") :]


@pytest.mark.parametrize("page", sorted(p.name for p in (ROOT / "docs").glob("*.md")))
def test_the_readme_lists_every_page(page):
    assert f"`docs/{page}`" in LISTED, f"README.md's documentation list does not name docs/{page}"

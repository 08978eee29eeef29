"""A malformed ``postgresql://`` journal URL is a one-line error without its password (regression:
``smgrl journal --journal 'postgresql://...?schema=Bad'`` ended in a ValueError traceback). No
server is needed: the URL is refused before any connection."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("psycopg")

PASSWORD = "pw-never-shown-7f3a"


@pytest.mark.parametrize(
    "url, why",
    [
        (
            f"postgresql://u:{PASSWORD}@127.0.0.1:1/db?schema=Bad-Name",
            "schema= must be a lowercase identifier",
        ),
        (f"postgresql://u:{PASSWORD}@[::1/db", "Invalid IPv6 URL"),
    ],
)
def test_a_bad_journal_url_is_one_line_without_its_password(url, why):
    result = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "--journal", url, "stats"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 4, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: bad journal URL postgresql://"), lines
    assert why in lines[0]
    assert PASSWORD not in result.stderr + result.stdout


def test_a_closed_store_stays_closed(pg_url):
    # Found in review: _live() quietly opened a new connection for a store used after close().
    from journal import JournalError, PgStore

    store = PgStore.open(pg_url)
    assert store.last_seq() == 0
    store.close()
    with pytest.raises(JournalError, match="closed"):
        store.last_seq()

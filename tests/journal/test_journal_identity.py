"""What ``SqliteStore.open`` refuses before it writes anything: files that are not smgrl journals
(left byte-for-byte unchanged) and journals of a newer smgrl. And ``verify(after=...)``, the
startup check from a trusted anchor. Real SQLite files."""

from __future__ import annotations

import hashlib
import os
import sqlite3

import pytest

from journal import Append, JournalError, JournalForeignError, JournalTooNewError, SqliteStore
from smgrl.events import WorkerRegistered


def fingerprint(path) -> tuple[str, int, list[str]]:
    with open(path, "rb") as f:
        data = f.read()
    siblings = sorted(p for p in os.listdir(os.path.dirname(path)) if p.startswith(os.path.basename(path)))
    return hashlib.sha256(data).hexdigest(), os.stat(path).st_mtime_ns, siblings


def foreign_db(path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
    conn.execute("INSERT INTO notes (text) VALUES ('mine')")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("readonly", [False, True])
def test_another_applications_database_is_refused_untouched(tmp_path, readonly):
    path = str(tmp_path / "app.db")
    foreign_db(path)
    before = fingerprint(path)
    with pytest.raises(JournalForeignError) as refused:
        SqliteStore.open(path, readonly=readonly)
    assert "not an smgrl journal" in str(refused.value) and "tables: notes" in str(refused.value)
    assert "read-write" not in str(refused.value)
    assert fingerprint(path) == before  # same bytes, same mtime, no -wal/-shm created


def test_a_file_that_is_not_sqlite_is_refused_untouched(tmp_path):
    path = str(tmp_path / "notes.db")
    with open(path, "wb") as f:
        f.write(b"these are my notes, not a database\n" * 50)
    before = fingerprint(path)
    with pytest.raises(JournalForeignError, match="not a readable SQLite database"):
        SqliteStore.open(path)
    assert fingerprint(path) == before


def test_an_empty_file_becomes_a_journal_but_is_not_read_as_one(tmp_path):
    path = str(tmp_path / "empty.db")
    open(path, "wb").close()
    with pytest.raises(JournalForeignError, match="empty SQLite database"):
        SqliteStore.open(path, readonly=True)
    SqliteStore.open(path).close()
    SqliteStore.open(path, readonly=True).close()


def newer(path, *, fmt: int | None = None, migration: str | None = None) -> None:
    SqliteStore.open(path).close()
    conn = sqlite3.connect(path)
    if fmt is not None:
        conn.execute("UPDATE meta SET value = ? WHERE key = 'format_version'", (str(fmt),))
    if migration is not None:
        conn.execute(
            "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) VALUES (?, ?, ?)",
            ("smgrl.journal", migration, "2030-01-01 00:00:00"),
        )
    conn.commit()
    conn.close()


@pytest.mark.parametrize("readonly", [False, True])
def test_a_newer_format_version_is_refused(tmp_path, readonly):
    path = str(tmp_path / "j.db")
    newer(path, fmt=2)
    with pytest.raises(JournalTooNewError, match="format 2, written by a newer smgrl"):
        SqliteStore.open(path, readonly=readonly)


def test_newer_migrations_are_refused_for_writing_only(tmp_path):
    path = str(tmp_path / "j.db")
    newer(path, migration="0002_from_the_future")
    before = fingerprint(path)
    with pytest.raises(JournalTooNewError, match="0002_from_the_future"):
        SqliteStore.open(path)
    assert fingerprint(path)[0] == before[0]
    SqliteStore.open(path, readonly=True).close()  # reading a newer journal stays possible


def registered(n: int) -> Append:
    url = f"http://127.0.0.1:{40000 + n}"
    return Append(f"worker:w{n}", WorkerRegistered(worker_id=f"w{n}", url=url, base_url=url, source="api"))


def test_verify_after_a_trusted_seq_checks_only_the_rows_after_it(tmp_path):
    path = str(tmp_path / "j.db")
    store = SqliteStore.open(path)
    store.append_batch([registered(n) for n in range(10)])
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE events SET payload = replace(payload, '40002', '40999') WHERE seq = 3")
    conn.commit()
    conn.close()
    store = SqliteStore.open(path, readonly=True)
    assert store.verify().first_bad_seq == 3
    assert store.verify(after=2).first_bad_seq == 3
    assert store.verify(after=3).ok  # row 3 is behind the anchor: trusted by whoever chose it
    assert store.verify(after=5).checked == 5
    assert not store.verify(after=5, anchor="0" * 64).ok  # a wrong anchor breaks the first link
    with pytest.raises(JournalError):
        store.append_batch([registered(11)])
    store.close()


@pytest.mark.parametrize(
    "bad_id", ["x\r\nSet-Cookie: a=b", "\x1b]0;PWN\x07", "", "A" * 32, "0" * 31, "0" * 5000]
)
def test_a_malformed_journal_id_is_refused_for_serving(tmp_path, bad_id):
    # Found against a live gateway: the id is sent as `x-smgrl-gateway-id` on every /health answer;
    # an edited meta.journal_id with CR LF made /health answer 500, with ESC ]0; it reached clients raw.
    path = str(tmp_path / "j.db")
    SqliteStore.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = ? WHERE key = 'journal_id'", (bad_id,))
    conn.commit()
    conn.close()
    before = fingerprint(path)
    with pytest.raises(JournalForeignError, match="meta.journal_id") as refused:
        SqliteStore.open(path)
    assert fingerprint(path)[0] == before[0]
    text = str(refused.value)
    assert len(text) < 400 and all(c.isprintable() for c in text)
    SqliteStore.open(path, readonly=True).close()  # `smgrl journal verify` can still read it

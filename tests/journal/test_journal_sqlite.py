"""What is specific to SqliteStore: the file, its mode, pragmas, migrations, readonly opens, failures."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import stat

import pytest
import sqlite_utils
from journal_helpers import a_few, registered, started

from journal import Append, JournalError, SqliteStore


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class TestFile:
    def test_new_file_and_wal_are_private(self, tmp_path):
        path = tmp_path / "j.db"
        old = os.umask(0)  # even a permissive umask must not widen the mode
        try:
            store = SqliteStore.open(path)
        finally:
            os.umask(old)
        store.append_batch([Append("workers", registered(), {"w1": "secret-key"})])
        assert _mode(path) == 0o600
        assert _mode(f"{path}-wal") == 0o600
        assert _mode(f"{path}-shm") == 0o600
        store.close()

    def test_existing_mode_is_left_alone(self, tmp_path):
        path = tmp_path / "j.db"
        path.touch(mode=0o640)
        os.chmod(path, 0o640)
        SqliteStore.open(path).close()
        assert _mode(path) == 0o640

    def test_pragmas(self, tmp_path):
        store = SqliteStore.open(tmp_path / "j.db")
        conn = store._conn
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
        store.close()
        full = SqliteStore.open(tmp_path / "j.db", synchronous="full", busy_timeout_ms=250)
        assert full._conn.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert full._conn.execute("PRAGMA busy_timeout").fetchone()[0] == 250
        full.close()
        with pytest.raises(ValueError):
            SqliteStore.open(tmp_path / "j.db", synchronous="OFF")


class TestSchema:
    def test_schema_is_plain_and_readable(self, tmp_path):
        path = tmp_path / "j.db"
        with SqliteStore.open(path) as store:
            store.append_batch([Append("workers", registered(), {"w1": "k"}), Append("control", started())])
            store.save_snapshot("registry", 2, "{}")
        db = sqlite_utils.Database(path)
        assert {t: db[t].columns_dict for t in ("events", "secrets", "snapshots", "meta")} == {
            "events": {
                "seq": int, "ts": float, "stream": str, "type": str, "schema": int,
                "payload": str, "prev_hash": str, "hash": str,
            },
            "secrets": {"worker_id": str, "api_key": str, "seq": int},
            "snapshots": {"id": int, "kind": str, "upto_seq": int, "ts": float, "state": str, "hash": str},
            "meta": {"key": str, "value": str},
        }  # fmt: skip
        assert {tuple(i.columns) for i in db["events"].indexes} >= {
            ("stream", "seq"),
            ("type", "seq"),
            ("ts",),
        }
        assert db["events"].pks == ["seq"]
        # The CLI's kind of query, straight from SQLite's JSON functions:
        rows = db.query(
            "SELECT json_extract(payload, '$.worker_id') AS w FROM events WHERE type = 'worker.registered'"
        )
        assert list(rows) == [{"w": "w1"}]
        meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
        assert meta["format_version"] == "1"
        assert meta["high_water_seq"] == "2"
        applied = sqlite_utils.Migrations("smgrl.journal").applied(db)
        assert [m.name for m in applied] == ["0001_create_journal", "0002_leases", "0003_op_index"]
        # The derived operation index (journal/opindex.py) holds the one operation started.
        assert [(r["seq"], r["op_id"]) for r in db.query("SELECT seq, op_id FROM op_index")] == [(2, "op1")]
        db.close()

    def test_reopen_is_idempotent(self, tmp_path):
        path = tmp_path / "j.db"
        with SqliteStore.open(path) as store:
            store.append_batch(a_few(3))
            journal_id = store.meta()["journal_id"]
        with SqliteStore.open(path) as store:
            assert store.meta()["journal_id"] == journal_id
            assert store.append_batch(a_few(1))[0].seq == 4
            assert store.verify().ok

    def test_newer_journal_is_not_written(self, tmp_path):
        path = tmp_path / "j.db"
        SqliteStore.open(path).close()
        with sqlite3.connect(path) as conn:
            conn.execute(
                "INSERT INTO _sqlite_migrations (migration_set, name, applied_at) VALUES ('smgrl.journal', '0999_future', 'x')"
            )
        conn.close()
        with pytest.raises(JournalError, match="newer"):
            SqliteStore.open(path)
        SqliteStore.open(path, readonly=True).close()  # reading is still allowed


class TestReadOnly:
    def test_missing_file_is_not_created(self, tmp_path):
        with pytest.raises(FileNotFoundError):
            SqliteStore.open(tmp_path / "nope.db", readonly=True)
        assert not (tmp_path / "nope.db").exists()

    def test_unmigrated_file_is_refused(self, tmp_path):
        path = tmp_path / "empty.db"
        path.touch()
        with pytest.raises(JournalError):
            SqliteStore.open(path, readonly=True)
        assert path.stat().st_size == 0

    def test_readonly_open_does_not_touch_the_database(self, tmp_path):
        path = tmp_path / "j.db"
        with SqliteStore.open(path) as store:
            store.append_batch(a_few(5))
        before = _digest(path)
        with SqliteStore.open(path, readonly=True) as ro:
            assert ro.count() == 5
            assert ro.verify().ok
            with pytest.raises(sqlite3.OperationalError):
                ro._conn.execute("DELETE FROM events")  # even behind the API's back
        assert _digest(path) == before
        wal = tmp_path / "j.db-wal"
        assert not wal.exists() or wal.stat().st_size == 0

    def test_readonly_sees_commits_of_a_live_writer(self, tmp_path):
        path = tmp_path / "j.db"
        with SqliteStore.open(path) as writer, SqliteStore.open(path, readonly=True) as ro:
            for n in (1, 2, 3):
                writer.append_batch(a_few(1))
                assert ro.last_seq() == n


class TestFailures:
    def test_disk_full_rolls_back_the_whole_batch_and_recovers(self, tmp_path):
        with SqliteStore.open(tmp_path / "j.db") as store:
            store.append_batch(a_few(3))
            conn = store._conn
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.execute(f"PRAGMA max_page_count = {pages}")  # the disk is now "full"
            big = [Append("control", started(f"op{i}", body=b"x" * 60_000)) for i in range(3)]
            with pytest.raises(sqlite3.OperationalError, match="full"):
                store.append_batch([*big, Append("workers", registered("w9"), {"w9": "k9"})])
            assert store.count() == 3
            assert store.secrets() == {}
            assert store.verify().ok
            conn.execute("PRAGMA max_page_count = 1073741823")  # space is back
            assert [r.seq for r in store.append_batch(big)] == [4, 5, 6]
            assert store.verify().ok

    def test_two_writers_on_one_file_keep_one_chain(self, tmp_path):
        # E.g. the CLI appending or compacting while the gateway runs: the head is read inside
        # each write transaction, never cached.
        path = tmp_path / "j.db"
        with SqliteStore.open(path) as a, SqliteStore.open(path) as b:
            for _ in range(5):
                a.append_batch(a_few(2))
                b.append_batch([Append("control", started())])
            assert b.compact_bodies(100) == 5
            a.append_batch(a_few(1))
            assert [r.seq for r in a.read()] == list(range(1, 17))
            assert a.verify().ok
            assert b.verify().ok


def test_migration_names_match_the_set():
    from journal._schema import MIGRATION_NAMES, MIGRATIONS

    pending = MIGRATIONS.pending(sqlite_utils.Database(memory=True))
    assert tuple(m.name for m in pending) == MIGRATION_NAMES


class TestWalSize:
    # Found against a live gateway: after a burst the -wal file stayed at its peak size for the
    # life of the process (SQLite never shrinks it by itself).
    LIMIT = 256 * 1024

    def burst(self, store, batches=40):
        for i in range(batches):
            store.append_batch([Append("control", started(f"op{i}", body=b"x" * 30_000))])

    def test_a_checkpoint_after_a_burst_brings_the_wal_under_the_limit(self, tmp_path):
        path = tmp_path / "j.db"
        with SqliteStore.open(path, wal_size_limit=self.LIMIT) as store:
            self.burst(store)
            assert store.wal_size() > self.LIMIT  # the burst grew it (no autocheckpoint)
            store.checkpoint()
            assert store.wal_size() <= self.LIMIT
            assert store.count() == 40 and store.verify().ok
            self.burst(store, 2)  # the truncated WAL takes writes as before
            assert store.count() == 42 and store.verify().ok

    def test_a_reader_on_an_old_snapshot_delays_the_truncation_never_the_checkpoint(self, tmp_path):
        path = tmp_path / "j.db"
        with SqliteStore.open(path, wal_size_limit=self.LIMIT) as store:
            store.append_batch(a_few(1))
            reader = sqlite3.connect(path)
            reader.execute("BEGIN")
            assert reader.execute("SELECT count(*) FROM events").fetchone() == (1,)  # snapshot held
            self.burst(store)
            store.checkpoint()  # returns at once: TRUNCATE answers busy instead of waiting
            assert store.wal_size() > self.LIMIT
            reader.rollback()
            reader.close()
            store.checkpoint()
            assert store.wal_size() <= self.LIMIT
            assert store.count() == 41 and store.verify().ok

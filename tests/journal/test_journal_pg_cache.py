"""``smgrl journal`` on a ``postgresql://`` journal reads an SQLite cache kept between commands
(smgrl/cli/journal/pgmirror.py): only what was appended since is copied, the seam is checked by
the hash chain, it is never stale (appends, compaction, dropped snapshots, another journal at the
same address), it holds no secret and its name no part of the URL. A real server."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading

import psycopg
import pytest
from journal_helpers import finished, outcome, registered, started

from journal import Append, PgStore
from smgrl.cli.journal import pgmirror

pytestmark = pytest.mark.usefixtures("pg_server")

KEY = "sk-cached-key-never-copied-42"
TABLES = {
    "events": "SELECT * FROM events ORDER BY seq",
    "meta": "SELECT * FROM meta ORDER BY key",
    "snapshots": "SELECT * FROM snapshots ORDER BY id",
    "op_index": "SELECT * FROM op_index ORDER BY seq",
    "secrets": "SELECT * FROM secrets",
}


def _dump(path: str) -> dict[str, list[tuple]]:
    conn = sqlite3.connect(path)
    try:
        return {name: conn.execute(sql).fetchall() for name, sql in TABLES.items()}
    finally:
        conn.close()


def _fresh(url: str, tmp_path, name: str = "fresh.db") -> dict[str, list[tuple]]:
    path = str(tmp_path / name)
    pgmirror.copy_to_sqlite(url, path)
    return _dump(path)


def _cached(url: str, directory: str) -> dict[str, list[tuple]]:
    with pgmirror.cached_copy(url, directory) as path:
        return _dump(path)


def _operation(store: PgStore, op_id: str) -> None:
    store.append_batch(
        [Append(f"op:{op_id}", started(op_id, body=b'{"weights": "/ckpt/' + op_id.encode() + b'"}'))]
    )
    store.append_batch([Append(f"op:{op_id}", outcome(op_id, "w1")), Append(f"op:{op_id}", finished(op_id))])


def test_the_cache_follows_appends_snapshots_and_compaction(pg_url, tmp_path):
    cache = str(tmp_path / "cache")
    store = PgStore.open(pg_url)
    try:
        store.append_batch([Append("workers", registered("w1", has_api_key=True), {"w1": KEY})])
        _operation(store, "op1")
        store.save_snapshot("fleet", 2, "{}")
        first = _cached(pg_url, cache)
        assert first == _fresh(pg_url, tmp_path, "f1.db") and len(first["events"]) == 4
        # What happens between two commands reaches the cache: new events (an operation started
        # before is ended after), a snapshot taken, one dropped, bodies compacted.
        store.append_batch([Append("op:op2", started("op2"))])
        store.save_snapshot("fleet", 5, "{}")
        _operation(store, "op3")
        store.append_batch([Append("op:op2", finished("op2"))])
        with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
            schema = pg_url.rsplit("schema=", 1)[1]
            conn.execute(f"DELETE FROM {schema}.snapshots WHERE upto_seq = 2")
        assert store.compact_bodies(4) == 1
        second = _cached(pg_url, cache)
        assert second == _fresh(pg_url, tmp_path, "f2.db")
        assert len(second["events"]) == 9 and [s[2] for s in second["snapshots"]] == [5]
        assert [row[0] for row in second["op_index"]] == [2, 5, 6]
        assert second["secrets"] == [] and KEY not in json.dumps(second)
    finally:
        store.close()
    files = os.listdir(cache)
    assert all(len(name.split(".")[0]) == 32 for name in files)  # a hash: no host, user or password
    assert {os.stat(os.path.join(cache, n)).st_mode & 0o777 for n in files} == {0o600}
    assert os.stat(cache).st_mode & 0o777 == 0o700


def test_only_the_events_after_the_cache_head_are_copied(pg_url, tmp_path):
    cache = str(tmp_path / "cache")
    store = PgStore.open(pg_url)
    try:
        _operation(store, "op1")
        with pgmirror.cached_copy(pg_url, cache) as path:
            pass
        # Change a copied row's body in the cache (not its hash): a later update copies what
        # follows the head and leaves the rows before it alone, so the change stays.
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE events SET payload = replace(payload, 'op1', 'opX') WHERE seq = 1")
        _operation(store, "op2")
        cached = _cached(pg_url, cache)
        assert len(cached["events"]) == 6 and "opX" in cached["events"][0][5]
        # ... which is why `verify` reads a fresh copy: it checks the rows PostgreSQL holds.
        assert cached["events"][1:] == _fresh(pg_url, tmp_path)["events"][1:]
    finally:
        store.close()


def test_another_journal_at_the_same_address_replaces_the_cache(pg_url, tmp_path):
    cache = str(tmp_path / "cache")
    schema = pg_url.rsplit("schema=", 1)[1]
    store = PgStore.open(pg_url)
    try:
        _operation(store, "old")
        _operation(store, "old2")
        assert len(_cached(pg_url, cache)["events"]) == 6
    finally:
        store.close()
    with psycopg.connect(pg_url.split("?")[0], autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")  # gone; a new journal is created in its place
    store = PgStore.open(pg_url)
    try:
        for name in ("a", "b", "c"):  # more events than the cache held: its head seq exists
            _operation(store, name)
        cached = _cached(pg_url, cache)
        assert cached == _fresh(pg_url, tmp_path) and "old" not in json.dumps(cached["events"])
    finally:
        store.close()


def test_a_second_command_waits_for_the_one_reading(pg_url, tmp_path, monkeypatch):
    # A command reads under a shared lock: another one cannot update the file under it.
    cache = str(tmp_path / "cache")
    store = PgStore.open(pg_url)
    try:
        _operation(store, "op1")
        monkeypatch.setattr(pgmirror, "LOCK_WAIT_SECS", 0.2)
        with pgmirror.cached_copy(pg_url, cache) as path:
            _operation(store, "op2")
            errors: list[Exception] = []
            other = threading.Thread(target=lambda: _try(pg_url, cache, errors))
            other.start()
            other.join(timeout=30)
            assert len(errors) == 1 and "stayed locked by another `smgrl journal` command" in str(errors[0])
            assert len(_dump(path)["events"]) == 3  # what this command read is unchanged
        assert len(_cached(pg_url, cache)["events"]) == 6
    finally:
        store.close()


def _try(url: str, cache: str, errors: list[Exception]) -> None:
    try:
        _cached(url, cache)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        errors.append(exc)


def test_cli_uses_the_cache_directory_of_its_environment(pg_url, pg_server, tmp_path):
    store = PgStore.open(pg_url)
    try:
        store.append_batch([Append("workers", registered("w1", has_api_key=True), {"w1": KEY})])
        _operation(store, "op1")
    finally:
        store.close()
    cache = tmp_path / "cli-cache"
    env = {**os.environ, "SMGRL_JOURNAL_CACHE": str(cache)}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "smgrl", "journal", "--journal", pg_url, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    first = run("ops", "--json")
    assert first.returncode == 0, first.stderr
    (name,) = [n for n in os.listdir(cache) if n.endswith(".db")]
    store = PgStore.open(pg_url)
    try:
        _operation(store, "op2")
    finally:
        store.close()
    second = run("ops", "--json")
    assert second.returncode == 0, second.stderr
    assert [op["id"] for op in json.loads(second.stdout)["operations"]] == ["op1", "op2"]
    verify = run("verify")  # a fresh copy, not the cache
    assert verify.returncode == 0 and "ok: 7 events verified" in verify.stdout, verify.stderr
    for result in (first, second, verify):
        assert pg_server.password not in result.stdout + result.stderr
        assert KEY not in result.stdout + result.stderr
    assert pg_server.password not in name
    off = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "--journal", pg_url, "events", "--json"],
        env={**env, "SMGRL_JOURNAL_CACHE": "off", "XDG_CACHE_HOME": str(tmp_path / "xdg")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert off.returncode == 0, off.stderr
    assert len(off.stdout.splitlines()) == 7 and not (tmp_path / "xdg").exists()


def test_a_cache_path_that_is_no_directory_is_one_line_naming_the_variable(pg_url, pg_server, tmp_path):
    PgStore.open(pg_url).close()
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("x")
    result = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "--journal", pg_url, "events"],
        env={**os.environ, "SMGRL_JOURNAL_CACHE": str(not_a_dir)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 4 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "SMGRL_JOURNAL_CACHE" in result.stderr, result.stderr
    assert pg_server.password not in result.stderr

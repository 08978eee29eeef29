"""``smgrl journal`` and ``smgrl launch`` on a ``postgresql://`` journal (a real server), with the
URL's password and the workers' keys never shown."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest
from journal_helpers import FakeClock, finished, outcome, registered, started

from journal import Append, PgStore, SqliteStore, open_store
from smgrl.demo.procs import free_port, start_gateway, wait_listening

pytestmark = pytest.mark.e2e

SECRET = "sk-worker-key-never-shown-0123"


def _fill(store) -> None:
    store._clock = FakeClock(1_700_000_000.0)
    store.append_batch([Append("workers", registered("w1", has_api_key=True), {"w1": SECRET})])
    store.append_batch(
        [
            Append("op:op1", started("op1", body=b'{"weights": "/ckpt/1"}')),
            Append("op:op1", outcome("op1", "w1")),
            Append("op:op1", finished("op1")),
        ]
    )


def smgrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "smgrl", *args], check=False, capture_output=True, text=True, timeout=120
    )


def _no_secrets(result: subprocess.CompletedProcess, password: str) -> None:
    for text in (result.stdout, result.stderr):
        assert password not in text
        assert SECRET not in text


def test_journal_commands_on_postgres_match_sqlite(pg_url, pg_server, tmp_path):
    pg = PgStore.open(pg_url)
    sq = SqliteStore.open(tmp_path / "same.db")
    try:
        _fill(pg)
        _fill(sq)  # the same events at the same times: the same rows, the same hashes
    finally:
        pg.close()
        sq.close()
    sqlite_path = str(tmp_path / "same.db")
    for command in (["events", "--json"], ["verify", "--json"], ["ops", "--json"], ["workers", "--json"]):
        on_pg = smgrl("journal", "--journal", pg_url, *command)
        on_sqlite = smgrl("journal", "--journal", sqlite_path, *command)
        assert on_pg.returncode == 0, on_pg.stderr
        _no_secrets(on_pg, pg_server.password)
        assert on_pg.stdout == on_sqlite.stdout, command
    # Writing commands write to PostgreSQL itself.
    snap = smgrl("journal", "--journal", pg_url, "replay", "--snapshot", "--json")
    assert snap.returncode == 0, snap.stderr
    assert json.loads(snap.stdout)["snapshot"]["upto_seq"] == 4
    compact = smgrl("journal", "--journal", pg_url, "compact", "--before", "5", "--json")
    assert compact.returncode == 0, compact.stderr
    assert json.loads(compact.stdout)["compacted"] == 1
    stats = smgrl("journal", "--journal", pg_url, "stats", "--json")
    assert stats.returncode == 0, stats.stderr
    out = json.loads(stats.stdout)
    assert out["path"] == pg_url.replace(pg_server.password, "***")
    assert out["events"] == 4 and len(out["snapshots"]) == 1 and out["meta"]["bodies_compacted_before"] == "5"
    verify = smgrl("journal", "--journal", pg_url, "verify")
    assert verify.returncode == 0 and "ok: 4 events verified" in verify.stdout, verify.stderr
    exported = smgrl("journal", "export", "--journal", pg_url)
    assert exported.returncode == 0, exported.stderr
    for r in (snap, compact, stats, verify, exported):
        _no_secrets(r, pg_server.password)
    with open_store(pg_url) as store:
        assert store.verify().ok and store.latest_snapshot("fleet") is not None


def test_errors_name_the_url_without_its_password(pg_server):
    wrong = pg_server.url("x").replace(pg_server.password, "not-the-" + pg_server.password)
    result = smgrl("journal", "--journal", wrong, "events")
    assert result.returncode == 4
    assert result.stderr.startswith("error: cannot connect to the journal postgresql://postgres:***@")
    assert pg_server.password not in result.stderr
    missing = smgrl("journal", "--journal", pg_server.url("nothing_here"), "verify")
    assert missing.returncode == 4 and "no smgrl journal in schema 'nothing_here'" in missing.stderr
    _no_secrets(missing, pg_server.password)


def test_the_gateway_serves_a_postgres_journal(pg_url, pg_server, tmp_path):
    port = free_port()
    log_path = tmp_path / "gateway.log"
    with open(log_path, "a") as log:
        child = start_gateway(
            ["--journal", pg_url, "--enable-rl", "--prometheus-port", str(free_port())], port=port, log=log
        )
    try:
        wait_listening(f"http://127.0.0.1:{port}", child=child)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/rl/journal?limit=10", timeout=30) as r:
            body = r.read().decode()
        assert "gateway.started" in body
    finally:
        assert child.stop() == 0
    log_text = log_path.read_text()
    assert pg_server.password not in log_text
    with open_store(pg_url) as store:
        types = [r.event.TYPE for r in store.read()]
        assert types[0] == "gateway.started" and types[-1] == "gateway.stopped"
        config = next(store.read()).event
        assert pg_server.password not in repr(config)
        assert store.verify().ok


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("postgresql://u:secret@h:5432/db", "postgresql://u:***@h:5432/db"),
        ("postgresql://u:p%40ss%2Fw@h/db?schema=s1", "postgresql://u:***@h/db?schema=s1"),
        ("postgres://h/db", "postgres://h/db"),
        ("postgresql://u@h/db", "postgresql://u@h/db"),
        ("./smgrl-journal.db", "./smgrl-journal.db"),
    ],
)
def test_a_url_is_shown_without_its_password(url, shown):
    from journal import describe

    assert describe(url) == shown


@pytest.mark.parametrize("schema", ["Upper", "a-b", "x;drop", "", "a" * 50])
def test_a_bad_schema_parameter_is_refused_before_connecting(schema):
    from journal._pg_schema import split_url as _split_url

    with pytest.raises(ValueError, match="schema="):
        _split_url(f"postgresql://u:pw@127.0.0.1:1/db?schema={schema}")


def test_a_gateway_that_cannot_open_its_postgres_journal_says_so_in_one_line(pg_server):
    wrong = pg_server.url("x").replace(pg_server.password, "wrong-" + pg_server.password)
    for url, says in (
        (wrong, "cannot connect to the journal postgresql://postgres:***@"),
        (pg_server.url("x").replace("schema=x", "schema=Bad-Name"), "schema= must be a lowercase identifier"),
    ):
        result = smgrl("launch", "--port", "0", "--prometheus-port", str(free_port()), "--journal", url)
        assert result.returncode == 1, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0] and "Traceback" not in result.stderr, result.stderr
        assert pg_server.password not in result.stderr + result.stdout


def test_a_broken_connection_fails_one_operation_and_the_next_reconnects(pg_url, pg_server):
    import psycopg

    with open_store(pg_url) as store:
        store.append_batch([Append("workers", registered("w1"), {"w1": SECRET})])
        token = store.change_token()  # starts the LISTEN thread too
        with psycopg.connect(pg_server.url(), autocommit=True) as admin:
            # What a server restart or a network cut does to the store's connections.
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE pid <> pg_backend_pid() AND datname = 'postgres' AND backend_type = 'client backend'"
            )
        from journal import JournalError

        with pytest.raises(JournalError) as failed:
            store.append_batch([Append("workers", registered("w2"))])
        assert pg_server.password not in str(failed.value)
        (rec,) = store.append_batch([Append("workers", registered("w3"))])
        assert rec.seq == 2  # the failed batch left nothing; the chain goes on
        assert store.verify().ok and store.get_secret("w1") == SECRET
        end = time.monotonic() + 20
        while store.change_token() == token:  # the LISTEN thread reconnects on its own
            assert time.monotonic() < end, "the LISTEN connection did not come back"
            time.sleep(0.05)

"""Journals edited outside smgrl: every command names what it found, in one line, with its exit
status (docs/journal.md: 1 the journal failed a check), never a traceback; `launch` refuses in
its one line. Real files edited with sqlite3, real `smgrl` processes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from journal_cli_builder import fleet_journal

from smgrl.cli.journal import journal_group

SMGRL = [sys.executable, "-m", "smgrl"]


def _control_started_seq(conn: sqlite3.Connection) -> int:
    return conn.execute("SELECT min(seq) FROM events WHERE type = 'control.started'").fetchone()[0]


def _deep(conn: sqlite3.Connection) -> int:
    conn.execute(
        "UPDATE events SET payload = ? WHERE seq = 2", ('{"x":' + "[" * 100_000 + "]" * 100_000 + "}",)
    )
    return 2


def _blob(conn: sqlite3.Connection) -> int:
    conn.execute("UPDATE events SET payload = ? WHERE seq = 2", (b'\xff\xfe{"a": 1}',))
    return 2


def _text_ts(conn: sqlite3.Connection) -> int:
    conn.execute("UPDATE events SET ts = 'yesterday' WHERE seq = 2")
    return 2


def _row_before_the_first(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT * FROM events WHERE seq = 1").fetchone()
    conn.execute(f"INSERT INTO events VALUES ({', '.join('?' * len(row))})", (-1, *row[1:]))
    return -1


def _body_encoding(conn: sqlite3.Connection) -> int:
    seq = _control_started_seq(conn)
    payload = json.loads(conn.execute("SELECT payload FROM events WHERE seq = ?", (seq,)).fetchone()[0])
    assert payload["body"] is not None
    payload["body_encoding"] = "rot13"
    conn.execute("UPDATE events SET payload = ? WHERE seq = ?", (json.dumps(payload), seq))
    return seq


TAMPERS = {
    "payload-100000-deep": (_deep, "nested too deeply"),
    "payload-an-invalid-utf8-blob": (_blob, "not text"),
    "ts-as-text": (_text_ts, "ts is not a number"),
    "a-row-at-seq-minus-1": (_row_before_the_first, "before the first"),
    "body_encoding-changed": (_body_encoding, "hash mismatch"),
}


def _smgrl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SMGRL, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("tamper", list(TAMPERS), ids=list(TAMPERS))
def test_a_tampered_journal_is_a_named_finding_never_a_traceback(tmp_path: Path, tamper: str) -> None:
    path = tmp_path / "fleet.db"
    fleet_journal(path)
    edit, finding = TAMPERS[tamper]
    with sqlite3.connect(path) as conn:
        seq = edit(conn)
    conn.close()
    verify = _smgrl("journal", "--journal", str(path), "verify")
    assert verify.returncode == 1, verify
    assert verify.stderr.count("\n") == 1 and f"seq {seq}" in verify.stderr and finding in verify.stderr
    for command in ("events", "export", "replay", "ops", "workers"):
        # In process (an exception would fail the test, catch_exceptions=False): fast, and the
        # real process above and below shows what an operator sees.
        done = CliRunner().invoke(journal_group, ["--journal", str(path), command], catch_exceptions=False)
        assert done.exit_code in (0, 1), (command, done.exit_code, done.output)
        if done.exit_code:
            assert done.stderr.count("\n") == 1 and f"seq {seq}" in done.stderr, (command, done.stderr)
    launch = _smgrl("launch", "--journal", str(path), "--port", "0", "--prometheus-port", "0")
    assert launch.returncode == 1 and launch.stderr.count("\n") == 1, launch.stderr[-3000:]
    assert f"seq {seq}" in launch.stderr and "smgrl journal verify" in launch.stderr

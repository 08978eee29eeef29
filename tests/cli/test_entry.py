"""``smgrl journal`` runs with the journal reader's imports only (the interpreter and
imports are the floor of every history command), and behaves as through the whole ``smgrl``
group: same output, same exit codes."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(*args: str, whole: bool = False) -> subprocess.CompletedProcess:
    if whole:  # the whole `smgrl` group, as before the fast path
        argv = [
            sys.executable,
            "-c",
            "import sys; from smgrl.cli.main import main; main(sys.argv[1:])",
            *args,
        ]
    else:
        argv = [sys.executable, "-m", "smgrl", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_journal_commands_do_not_import_the_gateway():
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "smgrl", "journal", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line}
    assert "smgrl.cli.journal" in imported
    assert not imported & {"trio", "smgrl.cli.main", "smgrl.fake", "smgrl.demo"}


@pytest.mark.parametrize(
    "args",
    [
        ("journal", "--help"),
        ("journal", "events", "--help"),
        ("journal", "--journal", "/nonexistent/j.db", "events"),
        ("journal", "--journal", "/nonexistent/j.db", "events", "--bogus"),
        ("journal", "nosuchcommand"),
        ("--version",),
    ],
)
def test_journal_through_the_fast_path_equals_the_whole_group(args):
    fast, whole = _run(*args), _run(*args, whole=True)
    assert (fast.returncode, fast.stdout, fast.stderr) == (whole.returncode, whole.stdout, whole.stderr)

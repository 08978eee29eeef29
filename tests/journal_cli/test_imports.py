"""`smgrl journal` readers import only what reading needs: the gateway's server stack
and the schema migrations' library are for the gateway and for writers, and their imports are
a fixed cost of every command an operator runs after something went wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Never needed to read a journal: the HTTP server stack (hypercorn, quart), the clients
# (httpx), the event loop (trio: `journal` imports it only for a live gateway), and sqlite_utils
# (the migrations: a read-only open never migrates).
NOT_FOR_READERS = ("hypercorn", "quart", "httpx", "trio", "sqlite_utils", "dateutil")

_PROBE = """
import json, runpy, sys
sys.argv = ["smgrl", *sys.argv[1:]]
try:
    runpy.run_module("smgrl", run_name="__main__", alter_sys=True)
except SystemExit as exc:
    code = exc.code
else:
    code = 0
sys.stdout.flush()
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def _loaded(*args: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, "journal", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(proc.stderr.strip().splitlines()[-1])
    assert report["code"] in (0, None), proc.stderr
    return {m.split(".")[0] for m in report["modules"]}


@pytest.mark.parametrize(
    "args",
    [("versions",), ("refits", "--all"), ("ops", "--all"), ("ops", "--all", "--json")],
    ids=lambda a: " ".join(a),
)
def test_history_readers_skip_the_gateway_and_migration_imports(journal, args):
    loaded = _loaded("--journal", journal["path"], *args)
    assert "journal" in loaded  # the probe did run the command
    assert not loaded & set(NOT_FOR_READERS), sorted(loaded & set(NOT_FOR_READERS))


def test_a_writer_open_still_migrates(tmp_path):
    """The migrations run on a read-write open (imported then): a new journal gets every table."""
    from journal.store import SqliteStore

    store = SqliteStore.open(tmp_path / "new.db")
    try:
        names = {r[0] for r in store._conn.execute("SELECT name FROM sqlite_master")}
    finally:
        store.close()
    assert {"events", "meta", "op_index", "_sqlite_migrations"} <= names

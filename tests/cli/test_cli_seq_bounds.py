"""``smgrl journal`` with a sequence number past 64 bits (regression): it is past every event.

``journal events --after 99999999999999999999`` ended in a traceback (the database driver's
OverflowError: "Python int too large to convert to SQLite INTEGER")."""

import json
import subprocess
import sys

from journal import Append, SqliteStore
from journal.base import MAX_SEQ
from smgrl.events import WorkerRemoved
from smgrl.history.values import parse_point, seq_range

HUGE = 10**20 - 1  # 20 digits: what the integer parser still takes


def test_ranges_and_points_past_64_bits_are_capped():
    assert seq_range(HUGE, None).after == MAX_SEQ
    assert seq_range(None, HUGE).before == MAX_SEQ
    assert seq_range(3, 9).after == 3 and seq_range(3, 9).before == 9
    assert parse_point(str(HUGE), 0.0).seq == MAX_SEQ
    assert parse_point("12", 0.0).seq == 12


def test_journal_events_after_past_64_bits_lists_nothing(tmp_path):
    path = str(tmp_path / "j.db")
    with SqliteStore.open(path) as store:
        store.append_batch([Append("workers", WorkerRemoved(worker_id="w1", reason="test"))])
    for args in (["--after", str(HUGE)], ["--before", str(HUGE)]):
        proc = subprocess.run(
            [sys.executable, "-m", "smgrl", "journal", "--journal", path, "--json", "events", *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert "Traceback" not in proc.stderr
        seqs = [json.loads(line)["seq"] for line in proc.stdout.splitlines() if line.strip()]
        assert seqs == ([] if args[0] == "--after" else [1]), (args, proc.stdout)


def test_one_clamp_for_every_seq_a_caller_gives():
    """`?after`/`?upto` (GET /v1/rl/journal), `?after` (the journal stream) and `--after`/`--before`
    (`smgrl journal`) are clamped by one helper, ``journal.base.clamp_seq``: no module keeps its own
    64-bit limit to drift from the others (there were three)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    limit = re.compile(r"2\s*\*\*\s*63\s*-\s*1|9223372036854775807")
    own = sorted(
        str(p.relative_to(root))
        for p in [*root.glob("smgrl/**/*.py"), *root.glob("journal/*.py")]
        if limit.search(p.read_text()) and p.name != "base.py"
    )
    # Not a sequence number: the fork's i64::MAX that orders requests without a numeric id last.
    not_seqs = ["smgrl/routing/dispatch_order.py"]
    assert own == not_seqs
    users = ("smgrl/http/routes/journal_routes.py", "smgrl/http/routes/stream.py", "smgrl/history/values.py")
    for path in users:
        assert "clamp_seq(" in (root / path).read_text(), path

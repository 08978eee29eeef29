"""The README's main command and the examples, run as a user would, against real processes."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from smgrl.demo.procs import wait_for_workers
from smgrl.fake.checkpoint import make_checkpoint
from smgrl.rl import RL, FanoutError

ROOT = Path(__file__).resolve().parents[2]


def test_demo_exits_zero_and_shows_the_refit(tmp_path):
    journal = tmp_path / "demo.db"
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "smgrl", "demo", "--engines", "2", "--journal", str(journal)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo passed" in proc.stdout
    assert proc.stdout.count("step-1") >= 3  # two rows after the refit, and the generation
    assert "chain verified" in proc.stdout
    assert journal.exists()
    lines = proc.stdout.splitlines()
    # 80 columns, except the commands it suggests, which are printed whole (below: they run).
    commands = [line.strip() for line in lines if line.startswith("    smgrl journal ")]
    assert [line for line in lines if len(line) > 80 and line.strip() not in commands] == []
    # Ids cut as smgrl journal cuts them, each kind to one length of at least 8: the worker ids
    # of the fleet tables (two engines, before and after the refit) and the op ids of the
    # journal's table. Each cut names exactly one id of its kind in the journal, so its commands
    # take it. (The two kinds have lengths of their own: the op ids are made after the worker
    # tables are printed, and a shared length would grow with them.)
    uuid_cut = re.compile(r"^( {2}| {4})([0-9a-f]{8}-[0-9a-f-]*) ")
    workers = [m.group(2) for m in map(uuid_cut.match, lines) if m and m.group(1) == "  "]
    op_cuts = [m.group(2) for m in map(uuid_cut.match, lines) if m and m.group(1) == "    "]
    assert len(workers) == 4 and len(set(workers)) == 2
    assert op_cuts and len(set(op_cuts)) == len(op_cuts)
    for cuts in (workers, op_cuts):
        assert len({len(i) for i in cuts}) == 1 and len(cuts[0]) >= 8, cuts
    ops = json.loads(
        subprocess.run(
            [sys.executable, "-m", "smgrl", "journal", "--journal", str(journal), "--json", "ops"],
            check=True, capture_output=True, text=True, timeout=60,
        ).stdout
    )  # fmt: skip
    op_ids = [o["id"] for o in ops["operations"]]
    assert all(sum(full.startswith(i) for full in op_ids) == 1 for i in op_cuts)
    listed = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "--journal", str(journal), "--json", "workers"],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout  # fmt: skip
    worker_ids = re.findall(r'"(?:id|worker_id)": "([0-9a-f-]{36})"', listed)
    assert all(sum(full.startswith(i) for full in set(worker_ids)) == 1 for i in set(workers)), listed
    assert len(commands) == 4
    for command in commands:
        argv = [sys.executable, "-m", *shlex.split(command)]  # the smgrl of this interpreter
        assert subprocess.run(argv, check=False, capture_output=True, timeout=60).returncode == 0, command
    # A demo that passed leaves no smgrl-demo-* directory behind.
    assert sorted(p.name for p in temp.glob("smgrl-demo-*")) == []


def test_a_failed_demo_says_where_its_files_are(tmp_path):
    temp = tmp_path / "tmp"
    temp.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "smgrl", "demo", "--engines", "1", "--journal", str(tmp_path / "no" / "j.db")],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "TMPDIR": str(temp)},
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr
    (kept,) = temp.glob("smgrl-demo-*")
    assert f"kept {kept}" in proc.stdout and "demo FAILED: the gateway exited early" in proc.stdout
    assert (kept / "gateway.log").read_text()  # the gateway said why


def test_refit_from_disk_example(fakes, gateway, tmp_path):
    urls = fakes("sglang", 2)
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *urls)
    wait_for_workers(http.base, 2, child=gw)
    ckpt = make_checkpoint(tmp_path / "step-7", "example/step-7")
    for _ in range(2):  # twice in a row on the same fleet: the second run refits to 7 again
        run = subprocess.run(
            [
                sys.executable,
                str(ROOT / "examples" / "refit_from_disk.py"),
                "--gateway",
                http.base,
                "--model-path",
                str(ckpt),
                "--weight-version",
                "7",
            ],
            check=False,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        assert "weight_version '7'" in run.stdout
    # A checkpoint that does not exist: the fan-out fails, paused() still resumes, exit 1.
    bad = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "refit_from_disk.py"),
            "--gateway",
            http.base,
            "--model-path",
            str(tmp_path / "missing"),
            "--weight-version",
            "8",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1
    # Each failed engine is named with the engine's own reason, not just "upstream_error HTTP 400".
    missing = f"No such file or directory: '{tmp_path / 'missing'}'"
    for row in http.request("GET", "/v1/rl/workers")[2]["workers"]:
        line = next(x for x in bad.stderr.splitlines() if row["id"] in x and "upstream_error" in x)
        assert row["url"] in line and "HTTP 400" in line and missing in line, bad.stderr
    _, _, rows = http.request("GET", "/v1/rl/workers")
    assert all(w["control"] == "active" and w["weight_version"] == "7" for w in rows["workers"])


def test_fanout_error_carries_each_engine_s_reason(fakes, gateway, tmp_path):
    """smgrl.rl's FanoutError against real fakes: a refit from a missing directory names every
    failed engine with the engine's own message; the payload stays SMG's."""
    urls = fakes("sglang", 2)
    _, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *urls)
    rows = wait_for_workers(http.base, 2)
    missing = tmp_path / "no-such-checkpoint"
    rl = RL(http.base, timeout=30)
    with pytest.raises(FanoutError) as info:
        rl.fanout("update_weights_from_disk", {"model_path": str(missing)}, selector="engine=sglang")
    err = info.value
    ids = sorted(row["id"] for row in rows)
    assert err.payload["message"].startswith("failed workers: ")
    assert sorted(err.payload["message"].removeprefix("failed workers: ").split(", ")) == ids
    lines = str(err).splitlines()[1:]
    assert (
        len(lines) == 3 and lines[-1] == "  failed on every target (2 of 2)"
    )  # one per engine, then the sum
    for row in rows:
        (line,) = [x for x in lines if row["id"] in x]
        assert f"{row['url']}: upstream_error HTTP 400: " in line
        assert f"No such file or directory: '{missing}'" in line

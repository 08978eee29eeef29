"""The README's main command and the examples, run as a user would, against real processes."""

import os
import subprocess
import sys
from pathlib import Path

from smgrl.demo.procs import wait_for_workers
from smgrl.fake.checkpoint import make_checkpoint

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
    # Issue 12: a demo that passed leaves no smgrl-demo-* directory behind.
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
    assert "upstream_error" in bad.stderr
    _, _, rows = http.request("GET", "/v1/rl/workers")
    assert all(w["control"] == "active" and w["weight_version"] == "7" for w in rows["workers"])

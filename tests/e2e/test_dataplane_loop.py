"""The asynchronous RL loop, run as a user would: rollouts stream through a
real gateway process while the trainer refits; no rollout fails, every sample names its version,
none comes from an engine mid-refit."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

from smgrl.demo.procs import wait_for_workers
from smgrl.fake.checkpoint import make_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_async_rl_loop_example_twice_on_one_fleet(fakes, gateway):
    """The example runs twice in a row on the same fleet: each run publishes versions of its own
    (the second starts from the first's last version and never re-publishes one)."""
    urls = fakes("sglang", 2, "--token-latency-ms", "2")
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *urls)
    wait_for_workers(http.base, 2, child=gw)
    published = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "async_rl_loop.py"), "--gateway", http.base,
             "--clients", "8", "--refits", "2", "--refit-every", "0.6", "--tail", "0.3", "--tokens", "8"],
            check=False, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert run.returncode == 0, run.stdout + run.stderr
        assert "async RL loop passed" in run.stdout
        versions = set(re.findall(r"now at (loop-\d{8}T\d{9}-00[12])", run.stdout))
        assert len(versions) == 2, run.stdout
        published.append(versions)
    assert not published[0] & published[1]
    # Text versions compare as text: the second run's are newer than the first run's, so a rollout
    # floor taken before its first refit is met after it (a random prefix sorted either way).
    assert max(published[0]) < min(published[1])


def test_async_rl_loop_says_what_it_needs(fakes, gateway, tmp_path):
    """Engines whose model_path is a directory that is gone (an earlier refit from a temporary
    checkpoint): exit 2 with what to do, before any rollout or refit; --model-path then works."""
    gone = make_checkpoint(tmp_path / "gone", "example/gone")
    urls = fakes("sglang", 1, "--token-latency-ms", "2", "--model-path", str(gone))
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *urls)
    (row,) = wait_for_workers(http.base, 1, child=gw)
    assert row["labels"]["model_path"] == str(gone)
    shutil.rmtree(gone)
    args = [sys.executable, str(ROOT / "examples" / "async_rl_loop.py"), "--gateway", http.base,
            "--clients", "2", "--refits", "1", "--refit-every", "0.3", "--tail", "0.2", "--tokens", "4"]  # fmt: skip
    run = subprocess.run(args, check=False, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert f"model_path {gone} is not a directory on this host" in run.stderr and "--model-path" in run.stderr
    ckpt = make_checkpoint(tmp_path / "ckpt", "example/ckpt")
    run = subprocess.run(
        [*args, "--model-path", str(ckpt)], check=False, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_demo_rollouts(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "smgrl", "demo", "--rollouts", "--engines", "2", "--clients", "4",
         "--journal", str(tmp_path / "demo.db")],
        check=False, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo passed" in proc.stdout and "engine.state_set" in proc.stdout

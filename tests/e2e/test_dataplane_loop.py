"""The asynchronous RL loop, run as a user would: rollouts stream through a
real gateway process while the trainer refits; no rollout fails, every sample names its version,
none comes from an engine mid-refit."""

import subprocess
import sys
from pathlib import Path

from smgrl.demo.procs import wait_for_workers

ROOT = Path(__file__).resolve().parents[2]


def test_async_rl_loop_example(fakes, gateway):
    urls = fakes("sglang", 2, "--token-latency-ms", "2")
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *urls)
    wait_for_workers(http.base, 2, child=gw)
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "async_rl_loop.py"), "--gateway", http.base,
         "--clients", "8", "--refits", "2", "--refit-every", "0.6", "--tail", "0.3", "--tokens", "8"],
        check=False, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "async RL loop passed" in run.stdout
    assert "step-1=" in run.stdout and "step-2=" in run.stdout


def test_demo_rollouts(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "smgrl", "demo", "--rollouts", "--engines", "2", "--clients", "4",
         "--journal", str(tmp_path / "demo.db")],
        check=False, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo passed" in proc.stdout and "engine.state_set" in proc.stdout

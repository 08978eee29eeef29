"""`smgrl refit` against a real gateway and fake engines: progress per phase, exit 1 naming the
quarantined engine, exit 2 when refused."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request

import pytest

from smgrl.fake.checkpoint import make_checkpoint

pytestmark = pytest.mark.e2e


def set_knobs(url: str, **knobs) -> None:
    req = urllib.request.Request(
        url + "/_fake/knobs",
        data=json.dumps(knobs).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()


def run_refit(base: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "smgrl", "refit", "--gateway", base, *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_refit_cli_shows_phases_and_names_the_quarantined_engine(fakes, gateway, tmp_path):
    urls = fakes("sglang", 3)
    _, http, port = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *urls)
    deadline = time.monotonic() + 30
    while len(http.request("GET", "/v1/rl/workers")[2]["workers"]) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    base = f"http://127.0.0.1:{port}"
    ckpt = str(make_checkpoint(tmp_path / "ckpt", "fake/model", seed=3))
    ok = run_refit(base, "--selector", "engine=sglang", "--model-path", ckpt, "--version", "3")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "  load     [" in ok.stdout and "3/3" in ok.stdout and "succeeded: 3 engine(s) on 3" in ok.stdout
    # A load whose weights changed although it answered an error: quarantined, reason named.
    set_knobs(urls[1], fail_loads_after_swap=1)
    bad = run_refit(base, "--selector", "engine=sglang", "--model-path", ckpt, "--version", "4")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    rows = {w["url"]: w for w in http.request("GET", "/v1/rl/workers")[2]["workers"]}
    assert rows[urls[1]]["quarantined"] is True
    assert f"{rows[urls[1]]['id']} {urls[1]}: quarantined: load: HTTP 500: internal error" in bad.stdout
    assert "ended quarantined" in bad.stdout
    # A load the engine refused (its old version read back): resumed on it, the refusal named.
    set_knobs(urls[2], fail_loads=1)
    ckpt5 = str(make_checkpoint(tmp_path / "ckpt5", "fake/model", seed=5))
    kept = run_refit(base, "--selector", "engine=sglang", "--model-path", ckpt5, "--version", "5")
    assert kept.returncode == 1 and "ended partial" in kept.stdout, kept.stdout + kept.stderr
    line = next(ln for ln in kept.stdout.splitlines() if urls[2] in ln)
    assert ": refused: load: HTTP 400: Failed to get weights iterator:" in line and "fail_loads" in line, line
    rows = {w["url"]: w for w in http.request("GET", "/v1/rl/workers")[2]["workers"]}
    assert not rows[urls[2]].get("quarantined") and rows[urls[2]]["weight_version"] == "4"
    # A typo on a fleet running here: refused before anything is paused.
    typo = run_refit(base, "--selector", "engine=sglang", "--model-path", "/no/such/dir", "--version", "6")
    assert typo.returncode == 2 and "checkpoint_not_found" in typo.stderr, typo.stderr
    assert {w.get("control", "active") for w in http.request("GET", "/v1/rl/workers")[2]["workers"]} == {
        "active"
    }
    refused = run_refit(base, "--selector", "engine=sglang", "--model-path", ckpt, "--version", "3")
    assert refused.returncode == 2 and "version_left" in refused.stderr, refused.stderr

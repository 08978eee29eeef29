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
    set_knobs(urls[1], fail_loads=1)
    bad = run_refit(base, "--selector", "engine=sglang", "--model-path", ckpt, "--version", "4")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    rows = {w["url"]: w for w in http.request("GET", "/v1/rl/workers")[2]["workers"]}
    assert rows[urls[1]]["quarantined"] is True
    assert f"{rows[urls[1]]['id']} {urls[1]}: " in bad.stdout and "ended quarantined" in bad.stdout
    refused = run_refit(base, "--selector", "engine=sglang", "--model-path", ckpt, "--version", "3")
    assert refused.returncode == 2 and "version_left" in refused.stderr, refused.stderr

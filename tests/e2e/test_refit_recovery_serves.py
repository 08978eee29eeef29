"""A refit saga recovered after a crash leaves the fleet serving on the new version (real processes).

The gateway (or, with ``--workers 2``, the worker process driving the saga) is SIGKILLed while the
engines load (the fakes' loads slowed to 3 s). After the restart (or the takeover) the saga
reads every engine's version back, resumes them and ends ``succeeded``. What this guards:

* the engines it read back and resumed are routable on the new version: discovery shows the
  new version with ``version_status: consistent``, nothing is held out as ``unconfirmed``, and a
  rollout is answered at once (not after the eligible-wait, then 503), also after a further
  restart (the confirmation is in the journal, not in memory);
* ``smgrl journal refits`` tells the same story as the saga: the cycle is not called ``failed``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from test_workers import request, start_supervisor, wait_until
from test_workers_forwarding import peers

from smgrl.fake.checkpoint import make_checkpoint

pytestmark = pytest.mark.e2e

GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
LOAD_DELAY_MS = 3000


def set_knobs(url: str, **knobs) -> None:
    st, _, body = request(url, "POST", "/_fake/knobs", knobs)
    assert st == 200, body


def start_refit(base: str, ckpt: str, version: str) -> str:
    st, _, body = request(
        base,
        "POST",
        "/v1/rl/refits",
        {"selector": "engine=sglang", "source": {"disk": {"model_path": ckpt}}, "weight_version": version},
    )
    assert st == 202, body
    return body["refit_id"]


def loading(base: str, refit_id: str) -> bool:
    """Every engine is inside its load call (its outcome not known yet)."""
    st, _, record = request(base, "GET", f"/v1/rl/refits/{refit_id}")
    return st == 200 and all(e["phase"] == "load" and e["status"] == "running" for e in record["engines"])


def finished(base: str, refit_id: str) -> dict | None:
    st, _, record = request(base, "GET", f"/v1/rl/refits/{refit_id}")
    return record if st == 200 and record["result"] else None


def assert_serving(base: str, urls: list[str], version: str) -> None:
    """Every engine routable on ``version``: discovery agrees, and a rollout is answered at once."""
    rows = {w["url"]: w for w in request(base, "GET", "/v1/rl/workers")[2]["workers"]}
    for url in urls:
        row = rows[url]
        assert row["weight_version"] == version and row["version_status"] == "consistent", row
        assert not row.get("quarantined") and row.get("control", "active") == "active", row
    for _ in range(len(urls) * 2):
        st, _, body = request(base, "POST", "/generate", GEN, timeout=20)
        assert st == 200, body


def journal_refits(journal: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "refits", "--journal", journal, "--json"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def assert_journal_agrees(journal: str, refit_id: str) -> None:
    told = journal_refits(journal)
    saga = next(s for s in told["sagas"] if s["refit_id"] == refit_id)
    assert saga["state"] == "succeeded" and "recovering" in saga["states"], saga
    cycles = [c for c in told["cycles"] if c["version"] == "2"]
    assert cycles, told["cycles"]
    for c in cycles:
        assert c["status"] not in ("failed", "abandoned"), c


def test_a_saga_recovered_after_a_gateway_crash_mid_load_leaves_the_fleet_serving(fakes, gateway, tmp_path):
    urls = fakes("sglang", 2, "--weight-version", "1")
    for url in urls:
        set_knobs(url, load_delay_ms=LOAD_DELAY_MS)
    journal = str(tmp_path / "journal.db")
    # A short eligible wait: a held-out fleet answers 503 in seconds, not after 30 minutes.
    args = ["--enable-rl", "--disable-health-check", "--eligible-wait-secs", "3", "--worker-urls", *urls]
    child, _, port = gateway(*args, journal=journal)
    base = f"http://127.0.0.1:{port}"
    wait_until(
        "both engines discovered", lambda: len(request(base, "GET", "/v1/rl/workers")[2]["workers"]) == 2
    )
    ckpt = str(make_checkpoint(tmp_path / "ckpt", "fake/model", seed=2))
    refit_id = start_refit(base, ckpt, "2")
    wait_until("the engines loading", lambda: loading(base, refit_id))
    child.kill()
    child, _, port = gateway(*args, journal=journal, port=port)
    done = wait_until("the recovered saga to finish", lambda: finished(base, refit_id), timeout=60)
    assert done["result"] == "succeeded", done
    assert_serving(base, urls, "2")
    # A further restart: the confirmation was journaled, so it holds.
    child.stop()
    child, _, port = gateway(*args, journal=journal, port=port)
    assert_serving(base, urls, "2")
    child.stop()
    assert_journal_agrees(journal, refit_id)


def test_a_saga_whose_driver_worker_is_killed_mid_load_leaves_the_fleet_serving(fakes, children, tmp_path):
    urls = fakes("sglang", 2, "--weight-version", "1")
    for url in urls:
        set_knobs(url, load_delay_ms=LOAD_DELAY_MS)
    journal = str(tmp_path / "j.db")
    _, base, _, pids, _ = start_supervisor(
        children,
        tmp_path,
        journal,
        "--enable-rl",
        "--disable-health-check",
        "--eligible-wait-secs",
        "3",
        "--worker-urls",
        *urls,
    )
    a, b = peers(journal)
    for peer in (a, b):
        wait_until(
            "both engines visible in every worker",
            lambda peer=peer: len(request(peer.url, "GET", "/v1/rl/workers")[2]["workers"]) == 2,
        )
    ckpt = str(make_checkpoint(tmp_path / "ckpt", "fake/model", seed=2))
    refit_id = start_refit(a.url, ckpt, "2")
    wait_until("the engines loading", lambda: loading(a.url, refit_id))
    driver = int(a.gateway.split(":")[1])
    assert driver in pids
    os.kill(driver, signal.SIGKILL)
    done = wait_until("the resumed saga to finish", lambda: finished(b.url, refit_id), timeout=90)
    assert done["result"] == "succeeded", done
    assert_serving(b.url, urls, "2")
    # Whichever process accepts the connection (the restarted worker too) routes to them.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        st, _, body = request(base, "POST", "/generate", GEN, timeout=20)
        if st == 200:
            break
        time.sleep(0.2)
    assert st == 200, body
    assert_serving(base, urls, "2")
    assert_journal_agrees(journal, refit_id)

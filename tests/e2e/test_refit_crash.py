"""A refit saga survives SIGKILL (real processes; docs/refits.md "Crash recovery").

Each round starts a disk refit of a fleet of fake SGLang engines (every engine call slowed down, the
load slowed down more, so the saga spends time in every phase), SIGKILLs the gateway at a seeded
point of the saga, restarts it on the same journal, and checks that:

* the saga finishes (or quarantines) after the restart, without a new request;
* no engine is ever resumed on unknown weights: every engine that is not paused reports the
  refit's version and holds the checkpoint's weights; a quarantined engine is still paused;
* the journal verifies and ``smgrl journal refits`` tells the cycle.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import urllib.request

import pytest

import smgrl.events  # noqa: F401 - registers the event catalogue: the journal is read below
from journal import SqliteStore
from smgrl.fake.checkpoint import make_checkpoint

pytestmark = pytest.mark.e2e

ROUNDS = 4
SEED = 20261201
ENGINES = 4


def fake_state(url: str) -> dict:
    with urllib.request.urlopen(url + "/_fake/state", timeout=10) as r:
        return json.loads(r.read())


def set_knobs(url: str, **knobs) -> None:
    req = urllib.request.Request(
        url + "/_fake/knobs",
        data=json.dumps(knobs).encode(),
        method="POST",
        headers={"content-type": "application/json"},
    )
    urllib.request.urlopen(req, timeout=10).read()


def wait_finished(http, refit_id: str, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status, _, body = http.request("GET", f"/v1/rl/refits/{refit_id}")
        assert status == 200, body
        if body["result"] is not None:
            return body
        time.sleep(0.05)
    raise AssertionError(f"refit {refit_id} did not finish after the restart: {body}")


def test_sigkill_at_seeded_points_of_a_refit_saga(fakes, gateway, tmp_path):
    rng = random.Random(SEED)
    urls = fakes("sglang", ENGINES)
    for url in urls:
        set_knobs(url, latency_ms=40, load_delay_ms=300)
    journal = str(tmp_path / "journal.db")
    args = ["--enable-rl", "--disable-health-check", "--worker-urls", *urls]
    child, http, port = gateway(*args, journal=journal)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if len(http.request("GET", "/v1/rl/workers")[2]["workers"]) == ENGINES:
            break
        time.sleep(0.05)
    outcomes = []
    for round_ in range(ROUNDS):
        version = f"v{round_ + 1}"
        ckpt = str(make_checkpoint(tmp_path / f"ckpt-{round_}", "fake/model", seed=round_ + 1))
        status, _, body = http.request(
            "POST",
            "/v1/rl/refits",
            {
                "selector": "engine=sglang",
                "source": {"disk": {"model_path": ckpt}},
                "weight_version": version,
            },
        )
        assert status == 202, body
        refit_id = body["refit_id"]
        time.sleep(rng.uniform(0.0, 1.0))  # the seeded kill point within the saga (about 1 s long)
        child.kill()
        child, http, port = gateway(*args, journal=journal, port=port)
        done = wait_finished(http, refit_id)
        outcomes.append(done["result"])
        # failed: no engine reached the new version (all quarantined: every load was cut short
        # before it set the version the restart read back).
        assert done["result"] in ("succeeded", "quarantined", "failed"), done
        if done["result"] == "failed":
            assert {e["status"] for e in done["engines"]} == {"quarantined"}, done
        rows = {w["url"]: w for w in http.request("GET", "/v1/rl/workers")[2]["workers"]}
        for url in urls:
            state = fake_state(url)
            engine = next(e for e in done["engines"] if e["url"] == url)
            if state["paused"] is None:
                # Resumed: only ever on the refit's weights, read back and verified.
                assert state["weight_version"] == version and state["model_path"] == ckpt, (url, state)
                assert engine["status"] == "resumed", engine
            else:
                assert engine["status"] == "quarantined" and rows[url]["quarantined"] is True, (
                    engine,
                    rows[url],
                )
        # The next round starts from a clean fleet: quarantined engines are refitted with it.
    child.stop()
    with SqliteStore.open(journal, readonly=True) as store:
        states = [rec.event.state for rec in store.read(types=["refit.state"])]
        finished = list(store.read(types=["refit.finished"]))
        steps = [rec.event.phase for rec in store.read(types=["refit.step"])]
    assert len(finished) == ROUNDS
    assert states.count("recovering") >= ROUNDS // 2, states  # the kills landed inside sagas
    assert {"pause", "load", "flush", "verify", "resume"} <= set(steps)
    assert set(outcomes) <= {"succeeded", "quarantined", "failed"}
    out = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "verify", "--journal", journal],
        check=False,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "refits", "--journal", journal, "--json"],
        check=False,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    told = json.loads(out.stdout)
    # Every saga's story: how it ended, the restart it went through, each engine's fate.
    assert [s["state"] for s in told["sagas"]] == outcomes, told["sagas"]
    assert sum("recovering" in s["states"] for s in told["sagas"]) >= ROUNDS // 2
    for saga in told["sagas"]:
        held = {q["worker"] for q in saga["quarantines"] if q["action"] == "held"}
        for engine in saga["engines"]:
            assert engine["status"] in ("resumed", "quarantined"), engine
            assert (engine["status"] == "quarantined") == (engine["worker_id"] in held), saga

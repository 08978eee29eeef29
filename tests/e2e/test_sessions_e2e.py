"""Agent sessions end to end: real fake-engine and gateway processes with the in-process-trained
tokenizer; examples/agent_session.py (the official ``openai`` client) drives a 10-turn agent with
tool calls, streaming and not, across a fleet refit in the middle of the episode, and checks the
training arrays (token-exact capture, aligned masks/log-probs, generated-token count, versions)."""

import json
import subprocess
import sys
from pathlib import Path

from smgrl.demo.procs import wait_for_workers
from smgrl.tito.testkit import make_model_dir

ROOT = Path(__file__).resolve().parents[2]


def test_agent_session_example_across_a_refit(engines, gateway, tmp_path):
    tok = make_model_dir(tmp_path / "tok")
    fleet = engines("sglang", 2, "--tokenizer-path", str(tok), "--weight-version", "1")
    gw, http, _port = gateway(
        "--enable-rl", "--disable-health-check", "--tokenizer-path", str(tok), *fleet.gateway_args()
    )
    fleet.register(http)  # over gRPC: each turn's token ids go in a Generate request
    wait_for_workers(http.base, 2, child=gw)
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "agent_session.py"),
            "--gateway",
            http.base,
            "--turns",
            "10",
            "--refit-at",
            "5",
            "--refit-version",
            "2",
            "--scripted",
            "--check",
            "--tokenizer-path",
            str(tok),
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    turns = [line for line in lines if line.startswith("turn ")]
    assert len(turns) == 10
    assert all("version 1" in line for line in turns[:5]) and all("version 2" in line for line in turns[5:])
    assert sum("tool call" in line for line in turns) == 5
    assert "versions ['1', '2']" in run.stdout
    assert "check: token-exact capture" in run.stdout
    # A second run on the same fleet, with the example's own default version: it refits again.
    again = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "agent_session.py"), "--gateway", http.base]
        + ["--turns", "4", "--refit-at", "2", "--scripted", "--check", "--tokenizer-path", str(tok)],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    turns = [line for line in again.stdout.splitlines() if line.startswith("turn ")]
    assert all("version 2" in line for line in turns[:2]) and all(
        "version session-" in line for line in turns[2:]
    )
    # The journal tells the story: smgrl journal sessions lists it, deleted, with both versions.
    listing = subprocess.run(
        [
            sys.executable,
            "-m",
            "smgrl",
            "journal",
            "--journal",
            str(tmp_path / "journal.db"),
            "--json",
            "sessions",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    session, _second = sorted(json.loads(listing.stdout)["sessions"], key=lambda s: s["turns"], reverse=True)
    assert session["state"] == "deleted" and session["turns"] == 10 and session["versions"] == ["1", "2"]
    detail = subprocess.run(
        [
            sys.executable,
            "-m",
            "smgrl",
            "journal",
            "--journal",
            str(tmp_path / "journal.db"),
            "--json",
            "sessions",
            session["session_id"],
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    turns = json.loads(detail.stdout)["turns"]
    assert [t["version"] for t in turns] == ["1"] * 5 + ["2"] * 5
    assert all(t["refit_op"] for t in turns[5:])  # traced to the refit operation that loaded "2"


def test_a_turn_survives_a_fleet_sync_that_aborts_it(engines, transport, gateway, tmp_path):
    """The trainer syncs the fleet DURING turn 6 (pause_generation mode abort, weights from disk,
    continue): the turn is looped back and captured whole; its tokens carry version 1 up to the
    abort and 2 after it; the journal records the loopback. Over gRPC the pause ends the turn's
    Generate stream with an ``abort`` Complete, which loops back by the same rule."""
    tok = make_model_dir(tmp_path / "tok")
    fleet = engines(
        "sglang", 2, "--tokenizer-path", str(tok), "--weight-version", "1", "--token-latency-ms", "15"
    )
    gw, http, _port = gateway(
        "--enable-rl", "--disable-health-check", "--tokenizer-path", str(tok), *fleet.gateway_args()
    )
    fleet.register(http)
    wait_for_workers(http.base, 2, child=gw)
    args = ["--turns", "8", "--refit-at", "5", "--abort-sync", "--scripted", "--check"]
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "agent_session.py"), "--gateway", http.base, *args]
        + ["--tokenizer-path", str(tok), "--refit-version", "2"],
        check=False,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    turns = [line for line in lines if line.startswith("turn ") and "version " in line]
    assert all("version 1" in line for line in turns[:5]) and all(
        "version 2" in line for line in turns[5:]
    ), run.stdout
    (looped,) = [line for line in lines if "looped back" in line]
    assert looped.startswith("turn 6: looped back 1x") and "('1', " in looped and "('2', " in looped
    assert "check: token-exact capture" in run.stdout
    runs = 1
    if transport == "http":  # (the second sync is transport-agnostic: run once, kept off gRPC's time)
        runs = 2
        # Again on the same fleet (engines at 2 now, the default version of its own for the sync).
        again = subprocess.run(
            [sys.executable, str(ROOT / "examples" / "agent_session.py"), "--gateway", http.base, *args]
            + ["--tokenizer-path", str(tok)],
            check=False,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert again.returncode == 0, again.stdout + again.stderr
        (looped,) = [line for line in again.stdout.splitlines() if "looped back" in line]
        assert looped.startswith("turn 6: looped back 1x") and "('2', " in looped and "('session-" in looped
    events = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "--journal", str(tmp_path / "journal.db"), "--json"]
        + ["loopbacks"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    recs = json.loads(events.stdout)["loopbacks"]
    assert len(recs) == runs and all(r["outcome"] == "completed" and r["tokens_kept"] >= 4 for r in recs)


def test_a_restart_ends_open_sessions_explicitly(fakes, gateway, tmp_path):
    tok = make_model_dir(tmp_path / "tok")
    journal = str(tmp_path / "sessions.db")
    gw, http, port = gateway("--tokenizer-path", str(tok), journal=journal)
    st, _, body = http.request("POST", "/sessions")
    assert st == 201
    sid = body["session_id"]
    gw.proc.kill()  # a crash: nothing ends the session but the next start
    gw.proc.wait(10)
    _gw2, http2, _ = gateway("--tokenizer-path", str(tok), journal=journal, port=port)
    st, hdrs, body = http2.request("GET", f"/sessions/{sid}")
    assert (
        st == 410 and body["error"]["code"] == "session_gone" and hdrs["x-smg-error-code"] == "session_gone"
    )
    st, _, _ = http2.request("POST", f"/sessions/{sid}/v1/chat/completions", {"messages": []})
    assert st == 410
    listing = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "--journal", journal, "--json", "sessions"],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    (session,) = json.loads(listing.stdout)["sessions"]
    assert session["session_id"] == sid and session["state"] == "ended (restart)"

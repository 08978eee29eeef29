"""``smgrl journal``: every subcommand on a journal with refits of three engine kinds, a failure and
a crash; JSON output; filters; errors and their exit statuses; never a secret."""

from __future__ import annotations

import json
import sqlite3

import attrs
import pytest
from journal_cli_builder import SECRET, T0

from journal import Append, SqliteStore, UnknownEvent
from smgrl.cli.journal import events as events_mod
from smgrl.cli.journal import journal_group
from smgrl.events import GatewayStopped
from smgrl.history.replay import restore
from smgrl.state import snapshot

EVERY_COMMAND = [
    ["events"],
    ["events", "--json"],
    ["workers"],
    ["workers", "--json"],
    ["ops"],
    ["ops", "--json"],
    ["refits"],
    ["refits", "--json"],
    ["loopbacks"],
    ["loopbacks", "--json"],
    ["versions"],
    ["verify"],
    ["replay"],
    ["export"],
    ["stats"],
    ["stats", "--json"],
    ["sessions"],
    ["sessions", "--json"],
    ["reindex"],
]


@pytest.mark.parametrize("args", EVERY_COMMAND, ids=" ".join)
def test_every_command_runs_and_never_prints_a_secret(run, args):
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    assert '"api_key"' not in result.output


def test_every_command_is_exercised_here():
    listed = {args[0] for args in EVERY_COMMAND} | {"compact"}
    assert listed == set(journal_group.commands)


def jsonl(output):
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def test_events_filters(run, journal):
    all_events = jsonl(run("events", "--json").output)
    assert [e["seq"] for e in all_events] == list(range(1, journal["last_seq"] + 1))
    starts = jsonl(run("events", "--json", "--type", "control.started").output)
    assert {e["type"] for e in starts} == {"control.started"} and len(starts) == 19
    workers = jsonl(run("events", "--json", "--type", "worker.*", "--type", "gateway.started").output)
    assert {e["type"] for e in workers} == {"worker.registered", "worker.discovered", "gateway.started"}
    window = jsonl(run("events", "--json", "--after", "10", "--before", "15").output)
    assert [e["seq"] for e in window] == [11, 12, 13, 14]
    assert len(jsonl(run("events", "--json", "--limit", "3").output)) == 3
    late = jsonl(run("events", "--json", "--since", str(T0 + 60)).output)
    assert late and all(e["ts"] >= T0 + 60 for e in late) and late[0]["seq"] > 1
    early = jsonl(run("events", "--json", "--until", "2027-01-15T08:00:01Z").output)
    assert early and all(e["ts"] < T0 + 1 for e in early)


def test_events_of_one_worker(run):
    rows = jsonl(run("events", "--json", "--worker", "w2").output)
    streams = {r["stream"] for r in rows}
    assert "worker:w2" in streams and not any(s.startswith("worker:") and s != "worker:w2" for s in streams)
    outcomes = [r for r in rows if r["type"] == "control.outcome"]
    assert outcomes and {r["payload"]["worker_id"] for r in outcomes} == {"w2"}
    # w2 was in no per-worker call: the vLLM calls on w3 are not listed
    ops = {r["payload"]["op_id"] for r in rows if r["type"] == "control.started"}
    assert len(ops) == 15
    by_url = jsonl(run("events", "--json", "--worker", "http://127.0.0.1:31002").output)
    assert by_url == rows
    only_outcomes = jsonl(run("events", "--json", "--worker", "w2", "--type", "control.outcome").output)
    assert only_outcomes == outcomes


def test_events_follow_prints_new_events_until_interrupted(run, journal, monkeypatch):
    sleeps = []

    def fake_sleep(_secs):
        sleeps.append(_secs)
        if len(sleeps) == 1:
            with SqliteStore.open(journal["path"]) as store:
                store.append_batch([Append("gateway", GatewayStopped(clean=True, reason="test"))])
        else:
            raise KeyboardInterrupt

    monkeypatch.setattr(events_mod.time, "sleep", fake_sleep)
    result = run("events", "--json", "--follow")
    assert result.exit_code == 0
    rows = jsonl(result.output)
    assert [r["type"] for r in rows] == ["gateway.stopped"] and rows[0]["seq"] == journal["last_seq"] + 1


def test_events_follow_seconds_ends_the_tail(run, monkeypatch):
    monkeypatch.setattr(events_mod.time, "sleep", lambda _s: None)
    result = run("events", "--follow", "--follow-seconds", "0", "--after", "110")
    assert result.exit_code == 0 and "gateway.started" in result.output


def test_workers_now_and_in_the_past(run, journal):
    now = json.loads(run("workers", "--json").output)
    by_id = {w["id"]: w for w in now["workers"]}
    assert by_id["w0"]["weight_version"] == "step-5" and by_id["w0"]["control"] == "paused"
    assert by_id["w2"]["version_status"] == "unknown" and by_id["w0"]["has_api_key"] is True
    # seq 28: after cycle 1 (continue_generation finished), before cycle 2
    past = json.loads(run("workers", "--json", "--at", "28").output)
    assert {w["weight_version"] for w in past["workers"]} == {"step-1"}
    assert {w["control"] for w in past["workers"]} == {"active"}
    at_time = json.loads(run("workers", "--json", "--at", "@" + str(T0 + 0.05)).output)
    assert at_time["at_seq"] == 5 and len(at_time["workers"]) == 2
    assert "registry at seq 111" in run("workers").output


def test_workers_at_uses_a_snapshot_and_agrees_with_replay(run, journal):
    with SqliteStore.open(journal["path"]) as store:
        fleet, _ = restore(store, until_seq=60)
        store.save_snapshot(snapshot.KIND, 60, snapshot.to_json(fleet))
    with_snap = json.loads(run("workers", "--json", "--at", "80").output)
    assert with_snap["snapshot_seq"] == 60
    with SqliteStore.open(journal["path"], readonly=True) as store:
        expected, _ = restore(store, until_seq=80, use_snapshot=False)
    assert {w["id"]: w["weight_version"] for w in with_snap["workers"]} == {
        w.id: (expected.facts()[w.base_url].weight_version) for w in expected.registry
    }


def test_versions_timeline(run):
    rows = json.loads(run("versions", "--json", "w2").output)["changes"]
    assert [(r["weight_version"], r["version_status"]) for r in rows] == [
        ("v0", "consistent"),
        ("step-1", "consistent"),
        ("step-1", "mixed"),
        ("step-3", "consistent"),
        ("step-3", "unknown"),
    ]
    assert "step-4" in run("versions", "http://127.0.0.1:31003").output


def test_ops_list_and_show(run, journal):
    ops = json.loads(run("ops", "--json").output)["operations"]
    assert len(ops) == 19
    cut = next(o for o in ops if o["id"] == journal["cut_op"])
    assert cut["result"] == "interrupted" and cut["succeeded"] == 2 and cut["total"] == 4
    failed = json.loads(run("ops", "--json", "--result", "partial").output)["operations"]
    assert [o["id"] for o in failed] == [journal["failed_op"]]
    calls = json.loads(run("ops", "--json", "--worker", "w3", "--path", "update_weight*").output)[
        "operations"
    ]
    disk, dist = "/update_weights_from_disk", "/update_weights_from_distributed"
    assert [o["path"] for o in calls] == [disk, disk, dist, dist, dist, "/update_weight_version", disk]
    assert len(json.loads(run("ops", "--json", "--last", "2").output)["operations"]) == 2
    shown = json.loads(run("ops", "show", "--json", journal["failed_op"][:8]).output)
    statuses = {t["worker_id"]: t["outcome"]["status"] for t in shown["targets"]}
    assert statuses == {"w0": 200, "w1": 200, "w2": 500, "w3": 200} and shown["body_kept"] is True
    text = run("ops", "show", journal["cut_op"]).output
    assert "no outcome recorded for: w2, w3" in text


def test_refits_table_json_and_pictures(run, tmp_path):
    cycles = json.loads(run("refits", "--json").output)["cycles"]
    assert [(c["status"], c["version"], len(c["engines"])) for c in cycles] == [
        ("ok", "step-1", 4),
        ("failed", "step-2", 4),
        ("ok", "step-3", 4),
        ("ok", "step-4", 1),
        ("open", "step-5", 4),
    ]
    assert list(cycles[2]["phases"]) == ["pause", "setup", "update", "teardown", "resume"]
    assert cycles[1]["failed"] == {"http://127.0.0.1:31002": ["update: HTTP 500"]}
    assert len(json.loads(run("refits", "--json", "--last", "2").output)["cycles"]) == 2
    html, svg = tmp_path / "r.html", tmp_path / "r.svg"
    result = run("refits", "--html", str(html), "--svg", str(svg))
    assert result.exit_code == 0 and "wrote" in result.output
    page, picture = html.read_text(), svg.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "<script" not in page
    assert picture.startswith("<svg") and "update: HTTP 500" in picture and "no outcome" in picture
    for doc in (page, picture):
        assert "src=" not in doc and "<link" not in doc and "@import" not in doc  # self-contained
    assert "step-2" in run("refits").output


def test_verify_replay_snapshot_and_compact(run, journal):
    assert run("verify").exit_code == 0
    saved = run("replay", "--snapshot")
    assert saved.exit_code == 0 and f"snapshot at seq {journal['last_seq']}" in saved.output
    checked = json.loads(run("verify", "--json").output)
    assert checked["ok"] and any("equals a full replay" in n for n in checked["notes"])
    stats = json.loads(run("stats", "--json").output)
    assert stats["events"] == journal["last_seq"] and stats["snapshots"][0]["upto_seq"] == journal["last_seq"]
    assert stats["types"]["control.started"] == 19
    compacted = json.loads(run("compact", "--json", "--before", "60").output)
    assert compacted["compacted"] > 0 and compacted["bodies_compacted_before"] == 60
    assert run("verify").exit_code == 0
    shown = json.loads(run("ops", "show", "--json", "00000001").output)
    assert shown["body_kept"] is False


def test_verify_names_the_first_bad_seq_of_an_edited_row(run, journal):
    conn = sqlite3.connect(journal["path"])
    with conn:
        conn.execute("UPDATE events SET payload = replace(payload, 'step-2', 'step-X') WHERE seq = 35")
    conn.close()
    result = run("verify")
    assert result.exit_code == 1 and "seq 35" in result.output and "Traceback" not in result.output


def test_verify_checks_event_schemas(run, journal):
    with SqliteStore.open(journal["path"]) as store:
        store.append_batch(
            [Append("worker:x", UnknownEvent("worker.removed", 1, {"worker_id": 5, "reason": "r"}))]
        )
    result = run("verify")
    assert result.exit_code == 1 and f"seq {journal['last_seq'] + 1}" in result.output
    assert "worker_id" in result.output


def test_verify_reports_events_of_a_newer_smgrl_without_failing(run, journal):
    with SqliteStore.open(journal["path"]) as store:
        store.append_batch([Append("x", UnknownEvent("worker.teleported", 1, {"worker_id": "w0"}))])
    result = run("verify")
    assert result.exit_code == 0 and "worker.teleported" in result.output


def test_verify_compares_the_snapshot_with_a_full_replay(run, journal):
    with SqliteStore.open(journal["path"]) as store:
        fleet, _ = restore(store, until_seq=50)
        w = fleet.registry.workers["w1"]
        fleet.registry.workers["w1"] = attrs.evolve(w, caller_labels={"forged": "yes"})
        store.save_snapshot(snapshot.KIND, 50, snapshot.to_json(fleet))
    result = run("verify")
    assert result.exit_code == 1 and "seq 50" in result.output and "caller_labels" in result.output


def test_export_is_json_lines_with_hashes(run, journal, tmp_path):
    lines = jsonl(run("export").output)
    assert len(lines) == journal["last_seq"] and all(len(line["hash"]) == 64 for line in lines)
    out = tmp_path / "events.jsonl"
    result = run("export", "--type", "control.*", "--output", str(out))
    assert result.exit_code == 0
    types = {json.loads(line)["type"] for line in out.read_text().splitlines()}
    assert types == {"control.started", "control.outcome", "control.finished", "control.interrupted"}
    assert SECRET not in out.read_text()


@pytest.mark.parametrize(
    "args, code, text",
    [
        (["events", "--after", "20", "--before", "10"], 2, "empty range"),
        (["events", "--before", "0"], 2, "--before"),
        (["events", "--since", "yesterday-ish"], 2, "is not a time"),
        (["events", "--since", "1h", "--until", "2h"], 2, "empty time range"),
        (["events", "--follow", "--before", "5"], 2, "--follow"),
        (["events", "--type", "nothing.*"], 2, "no event type"),
        (["workers", "--at", "999999"], 2, "beyond"),
        (["ops", "show", "zzz"], 1, "no operation"),
        (["ops", "show", "0000"], 2, "ambiguous"),
        (["events", "--worker", "http://nowhere:1"], 1, "no worker"),
        (["compact", "--before", "0"], 2, "--before"),
        (["refits", "--last", "2", "--all"], 2, "contradict"),
        (["ops", "--last", "2", "--all"], 2, "contradict"),
    ],
)
def test_bad_values_are_one_line_errors(run, args, code, text):
    result = run(*args)
    assert result.exit_code == code, result.output
    assert text in result.output and "Traceback" not in result.output


def test_missing_and_foreign_files(run, tmp_path):
    missing = run("events", path=str(tmp_path / "nope.db"))
    assert missing.exit_code == 3 and "no journal at" in missing.output
    text_file = tmp_path / "notes.txt"
    text_file.write_text("hello, not sqlite at all" * 100)
    assert run("stats", path=str(text_file)).exit_code == 4
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.close()
    for args in (["events"], ["compact", "--before", "5"], ["replay", "--snapshot"]):
        result = run(*args, path=str(other))
        # Says what the file is; never the old, wrong advice to "open it read-write once".
        assert result.exit_code == 4 and "not an smgrl journal" in result.output, result.output
        assert "another application (tables: t)" in result.output and "read-write" not in result.output
    tables = {r[0] for r in sqlite3.connect(other).execute("SELECT name FROM sqlite_master")}
    assert tables == {"t"}  # a foreign database is never migrated
    assert run("events", path=str(tmp_path)).exit_code == 4


def test_subcommand_options_and_group_options_agree(journal):
    from click.testing import CliRunner

    runner = CliRunner(env={"SMGRL_JOURNAL": journal["path"]})
    via_env = runner.invoke(journal_group, ["stats", "--json"])
    via_flag = runner.invoke(journal_group, ["--json", "stats", "--journal", journal["path"]])
    assert via_env.exit_code == via_flag.exit_code == 0
    assert json.loads(via_env.output)["events"] == json.loads(via_flag.output)["events"]


def test_recent_cycles_and_ops_are_read_from_a_window_at_the_end(tmp_path, monkeypatch):
    from click.testing import CliRunner
    from journal_cli_builder import Builder

    from smgrl.history import reading

    path = tmp_path / "long.db"
    b = Builder(path)
    engines = [(f"w{i}", f"http://127.0.0.1:{31000 + i}") for i in range(2)]
    for wid, url in engines:
        b.register(wid, url)
    for step in range(70):
        b.op("pause_generation", engines, {})
        b.op("update_weights_from_disk", engines, {"model_path": "/c", "weight_version": f"s{step}"})
        b.op("continue_generation", engines, {})
    b.close()
    monkeypatch.setattr(reading, "MIN_WINDOW", 30)  # force several widenings

    def run(*args):
        result = CliRunner().invoke(journal_group, ["--journal", str(path), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    everything = run("refits", "--json", "--all")["cycles"]
    assert len(everything) == 70 and {c["status"] for c in everything} == {"ok"}
    assert run("refits", "--json")["cycles"] == everything[-50:]
    assert run("refits", "--json", "--last", "3")["cycles"] == everything[-3:]
    all_ops = run("ops", "--json", "--all")["operations"]
    assert len(all_ops) == 210 and run("ops", "--json")["operations"] == all_ops[-50:]
    updates = run("ops", "--json", "--path", "update_*", "--last", "5")["operations"]
    assert [o["version"] for o in updates] == [f"s{i}" for i in range(65, 70)]


def test_verify_detects_an_edited_snapshot(run, journal):
    assert run("replay", "--snapshot").exit_code == 0
    conn = sqlite3.connect(journal["path"])
    with conn:
        conn.execute("UPDATE snapshots SET state = replace(state, 'step-5', 'step-9')")
    conn.close()
    result = run("verify")
    assert result.exit_code == 1 and "does not match its hash" in result.output
    assert f"seq {journal['last_seq']}" in result.output


def test_exit_statuses_through_the_smgrl_entry_point(journal, tmp_path, capsys):
    from smgrl.cli.main import main

    with pytest.raises(SystemExit) as missing:
        main(["journal", "--journal", str(tmp_path / "nope.db"), "events"])
    assert missing.value.code == 3
    with pytest.raises(SystemExit) as bad:
        main(["journal", "--journal", journal["path"], "events", "--after", "9", "--before", "3"])
    assert bad.value.code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 2 and "Traceback" not in err

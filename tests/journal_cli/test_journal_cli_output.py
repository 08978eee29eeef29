"""``smgrl journal`` output in a terminal: nothing a client or an engine wrote is
printed raw, tables fit 80 and 120 columns with short unique ids (full with --wide / --json), the
`events` columns never change width partway, `engine.*` globs work, and the bare group shows help.
"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner
from journal_cli_builder import Builder

from smgrl.cli.journal import journal_group
from smgrl.core.ids import new_worker_id, uuid7
from smgrl.core.printable import UNSAFE
from smgrl.events import (
    ControlFinished,
    ControlOutcome,
    ControlStarted,
    EngineStateSet,
    GatewayStarted,
    RequestLoopedBack,
)

OSC = "\x1b]0;pwned\x07"  # sets the terminal title, ends with BEL
HOSTILE = [OSC, "\r", "\x9b2J", "\x85", "\u2028", "\u202e", "\x1b[2J"]
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _hostile_journal(path, n_workers: int = 6) -> dict:
    """UUIDv7 ids made in one millisecond (long shared prefixes), values full of escapes."""
    b = Builder(path)
    b.add("gateway", GatewayStarted(version="0.1.0", pid=1, config={"port": 1}))
    now = 1_800_000_000_000
    workers = [(uuid7(now), f"http://127.0.0.1:{31000 + i}") for i in range(n_workers)]
    for wid, url in workers:
        b.register(wid, url, labels={"role": "policy" + OSC})
    op = uuid7(now + 1)
    b.add(
        f"op:{op}",
        ControlStarted(
            op_id=op,
            kind="fanout",
            method="POST",
            path="flush_cache",
            selector="engine=sglang" + OSC,
            targets=[{"worker_id": w, "url": u, "control_url": u} for w, u in workers],
            principal="trainer\r",
            request_id="req\x1b[31mred\x85",
            **ControlStarted.body_fields(b"{}"),
        ),
    )
    for wid, url in workers:
        b.add(
            f"op:{op}",
            ControlOutcome(
                op_id=op,
                worker_id=wid,
                url=url,
                control_url=url,
                status=500,
                message="engine says \x1b]8;;http://evil\x07click\x1b]8;;\x07\r\u2028done",
                latency_ms=3,
            ),
        )
    b.add(
        f"op:{op}",
        ControlFinished(
            op_id=op,
            result="failed",
            http_status=502,
            total=len(workers),
            succeeded=0,
            failed=len(workers),
            latency_ms=9,
        ),
    )
    b.add(
        "engine",
        EngineStateSet(
            control="paused",
            targets=[{"worker_id": workers[0][0], "url": workers[0][1], "base_url": workers[0][1]}],
            selector="role=policy" + OSC,
            request_id="r\x07",
        ),
    )
    b.add(
        "dataplane",
        RequestLoopedBack(
            request_id="rollout" + OSC,
            model="m\r",
            generated_tokens=4,
            tokens_kept=2,
            loopbacks=1,
            outcome="completed",
            op_ids=(op,),
            segments=({"op_id": op, "start": 0, "end": 2}, {"op_id": None, "start": 2, "end": 4}),
        ),
    )
    b.audit("/v1/rl/workers" + OSC)
    b.close()
    return {"workers": [w for w, _ in workers], "op": op}


@pytest.fixture
def hostile(tmp_path):
    path = tmp_path / "hostile.db"
    ids = _hostile_journal(path)
    return {"path": str(path), **ids}


def _run(path, *args, env=None):
    result = CliRunner().invoke(journal_group, ["--journal", path, *args], catch_exceptions=False, env=env)
    return result


def _commands(ids) -> list[list[str]]:
    return [
        ["events"],
        ["events", "--type", "engine.*"],
        ["workers"],
        ["ops"],
        ["ops", "show", ids["op"]],
        ["refits"],
        ["loopbacks"],
        ["versions"],
        ["stats"],
        ["verify"],
        ["events", "--worker", ids["workers"][0]],
        ["export"],
    ]


@pytest.mark.parametrize("extra", [[], ["--json"], ["--wide"]], ids=["table", "json", "wide"])
def test_no_command_prints_an_escape_sequence_raw(hostile, extra):
    for args in _commands(hostile):
        result = _run(hostile["path"], *args, *extra)
        assert result.exit_code == 0, (args, result.output)
        out = result.output.replace("\n", "")
        raw = sorted({f"U+{ord(c):04X}" for c in out if UNSAFE.match(c)})
        assert raw == [], (args, extra, raw)
        if ("--json" in extra and args[0] == "events") or args[0] == "export":
            for line in result.output.splitlines():
                json.loads(line)  # still valid JSON, the same text once decoded
    shown = _run(hostile["path"], "ops", "show", hostile["op"]).output
    assert "\\x1b]0;pwned\\x07" in shown and "\\r" in shown  # shown, escaped, not dropped
    decoded = json.loads(_run(hostile["path"], "ops", "show", hostile["op"], "--json").output)
    assert decoded["selector"] == "engine=sglang" + OSC


def test_engine_globs_cover_every_event_type(hostile):
    result = _run(hostile["path"], "events", "--type", "engine.*", "--json")
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["type"] for line in result.output.splitlines()] == ["engine.state_set"]
    every = _run(hostile["path"], "events", "--type", "*", "--json")
    assert len(every.output.splitlines()) == len(
        _run(hostile["path"], "events", "--json").output.splitlines()
    )


@pytest.mark.parametrize("width", [80, 120])
def test_the_standard_journal_fits_too(run, journal, width):
    """Twelve refits columns, the events of four engines, a failed op: all within the width."""
    for args in (
        ["events"],
        ["workers"],
        ["ops"],
        ["ops", "show", journal["failed_op"]],
        ["refits"],
        ["versions"],
        ["stats"],
        ["workers", "--at", "20"],
    ):
        out = run(*args, "--width", str(width)).output
        too_long = [line for line in out.splitlines() if len(line) > width]
        assert [line for line in too_long if not line.startswith(("journal /", "operation ", "  "))] == []


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("how", ["option", "COLUMNS"])
def test_tables_fit_the_terminal(hostile, width, how):
    for args in _commands(hostile):
        if args[0] == "export":
            continue  # JSON Lines, not a table
        if how == "option":
            result = _run(hostile["path"], *args, "--width", str(width))
        else:
            result = _run(hostile["path"], *args, env={"COLUMNS": str(width)})
        assert result.exit_code == 0, result.output
        too_long = [line for line in result.output.splitlines() if len(line) > width]
        # ops show's header lines carry the full operation id on purpose; only tables are fitted.
        if args[:2] == ["ops", "show"]:
            too_long = [line for line in too_long if not line.startswith(("operation ", "  "))]
        # stats names the file it read: the path is as long as the caller made it.
        too_long = [line for line in too_long if not line.startswith("journal /")]
        assert too_long == [], (args, too_long)


def test_short_ids_are_unique_prefixes_and_full_with_wide_or_json(hostile):
    workers = hostile["workers"]
    table = _run(hostile["path"], "workers").output
    assert not UUID.search(table)  # no full id in the table
    shown = [line.split()[0] for line in table.splitlines()[2:]]
    assert len(set(shown)) == len(workers)
    assert all(any(w.startswith(s) for w in workers) for s in shown)
    assert len({len(s) for s in shown}) == 1 and len(shown[0]) >= 8  # one length: aligned
    # Each printed prefix can be typed back.
    for prefix, full in zip(sorted(shown), sorted(workers), strict=True):
        events = _run(hostile["path"], "events", "--worker", prefix, "--json").output
        assert json.loads(events.splitlines()[0])["payload"]["worker_id"] == full
    wide = _run(hostile["path"], "workers", "--wide").output
    assert set(UUID.findall(wide)) == set(workers)
    listed = json.loads(_run(hostile["path"], "workers", "--json").output)
    assert json.dumps(listed).count(workers[0]) >= 1


def test_an_ambiguous_prefix_is_an_error(hostile):
    common = hostile["workers"][0][:8]  # made in one millisecond: all share it
    result = _run(hostile["path"], "events", "--worker", common)
    assert result.exit_code == 1 and "ambiguous" in result.output


def test_events_columns_keep_their_width_across_chunks(tmp_path):
    b = Builder(tmp_path / "long.db")
    b.add("gateway", GatewayStarted(version="0.1.0", pid=1, config={"port": 1}))
    for i in range(450):  # more than two chunks of 200 rows; seq widths grow from 1 to 3 digits
        wid = new_worker_id()
        b.register(wid, f"http://127.0.0.1:{20000 + i}")
    b.close()
    for width in ("80", "120"):
        out = _run(str(tmp_path / "long.db"), "events", "--width", width).output.splitlines()
        header = out[0]
        starts = [header.index(c) for c in ("time", "type", "summary")]
        for line in out[1:]:
            # Every column starts where the header's does, in every chunk.
            assert all(line[s - 2 : s] == "  " and line[s] != " " for s in starts), line
            assert len(line) <= int(width)


def test_the_bare_group_shows_its_help(hostile):
    result = _run(hostile["path"])
    assert result.exit_code == 0
    assert "Commands:" in result.output and "events" in result.output and "error" not in result.output


@pytest.mark.parametrize("width", [80, 120])
def test_workers_and_refits_keep_their_key_columns_whole(run, journal, width):
    """At 80 and 120 columns: the workers table keeps id, url, engine and weight_version, drops
    optional columns rather than cut, never cuts a URL or a header (no two headers alike); the
    refits table names each failed engine and its reason in full, under the table."""
    workers = run("workers", "--width", str(width)).output.splitlines()
    header = workers[1].split()
    assert header[:3] == ["id", "url", "engine"] and "weight_version" in header
    assert len(set(header)) == len(header) and not any("…" in h for h in header)
    urls = [line.split()[1] for line in workers[2:]]
    assert urls and all(u.startswith("http://127.0.0.1:") and "…" not in u for u in urls)
    assert all(len(line) <= width for line in workers)
    refits = run("refits", "--width", str(width)).output
    table = refits.splitlines()
    assert not any("…" in h for h in table[0].split()) and len(set(table[0].split())) == len(table[0].split())
    failures = [line for line in table if line.startswith("  cycle ")]
    assert failures and any("http://127.0.0.1:31002 (update: HTTP 500)" in line for line in failures)
    assert all(len(line) <= width for line in table if not line.startswith(" "))
    wide = run("refits", "--wide").output
    assert "http://127.0.0.1:31002 (update: HTTP 500)" in wide and "  cycle " not in wide

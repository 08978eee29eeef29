"""``smgrl journal loopbacks`` and the loopback columns of ``smgrl journal refits``: which requests
were looped back during refit N, and how many tokens that saved (``dataplane.request_looped_back``
events, attributed to a cycle by the operation that aborted each segment)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from journal_cli_builder import Builder

from smgrl.cli.journal import journal_group
from smgrl.cli.journal.group import EXIT_BAD_VALUE
from smgrl.events import RequestLoopedBack

OSC = "\x1b]0;pwned\x07"


def _seg(i: int, start: int, end: int, op_id: str | None, reason: str = "abort") -> dict:
    return {
        "iteration": i,
        "worker_id": "w0",
        "url": "http://127.0.0.1:31000",
        "dp_rank": None,
        "version": f"v{i}",
        "start": start,
        "end": end,
        "finish_reason": reason,
        "op_id": op_id,
    }


def _looped(b: Builder, rid: str, segments: list[dict], outcome: str = "completed") -> None:
    aborted = [s for s in segments if s["op_id"]]
    b.add(
        "dataplane",
        RequestLoopedBack(
            request_id=rid,
            model="m",
            prompt_tokens=5,
            generated_tokens=segments[-1]["end"],
            tokens_kept=aborted[-1]["end"] if aborted else 0,
            loopbacks=len(aborted),
            outcome=outcome,
            op_ids=tuple(dict.fromkeys(s["op_id"] for s in aborted)),
            segments=tuple(segments),
        ),
    )


@pytest.fixture
def looped(tmp_path):
    """Two refit cycles. r1 and r2 are looped back by cycle 1's update; r3 by cycle 1's update and
    then cycle 2's pause (its share split between them); r4 by an op outside any cycle."""
    path = tmp_path / "loop.db"
    b = Builder(path)
    engines = [("w0", "http://127.0.0.1:31000"), ("w1", "http://127.0.0.1:31001")]
    for wid, url in engines:
        b.register(wid, url)
    ids: dict = {"path": str(path)}
    ids["c1"] = b.store.last_seq() + 1
    b.op("pause_generation", engines, {"mode": "abort"})
    up1 = b.op("update_weights_from_disk", engines, {"model_path": "/c/1", "weight_version": "v1"})
    b.op("continue_generation", engines, {})
    _looped(b, "r1", [_seg(0, 0, 7, up1), _seg(1, 7, 20, None, "stop")])
    _looped(b, "r2" + OSC, [_seg(0, 0, 3, up1), _seg(1, 3, 4, None, "length")], outcome="cancelled")
    b.wait(30)
    ids["c2"] = b.store.last_seq() + 1
    pause2 = b.op("pause_generation", engines, {"mode": "abort"})
    b.op("update_weights_from_disk", engines, {"model_path": "/c/2", "weight_version": "v2"})
    b.op("continue_generation", engines, {})
    _looped(b, "r3", [_seg(0, 0, 10, up1), _seg(1, 10, 25, pause2), _seg(2, 25, 30, None, "stop")])
    b.wait(30)
    b.op("flush_cache", engines, {})  # not a refit: r4's op belongs to no cycle
    _looped(b, "r4", [_seg(0, 0, 2, "no-such-op"), _seg(1, 2, 9, None, "stop")])
    b.close()
    return ids


def _run(path: str, *args: str):
    return CliRunner().invoke(journal_group, ["--journal", path, *args], catch_exceptions=False)


def test_refits_count_the_requests_and_tokens_each_cycle_looped_back(looped):
    cycles = json.loads(_run(looped["path"], "refits", "--json").output)["cycles"]
    assert [c["cycle"] for c in cycles] == [looped["c1"], looped["c2"]]
    # cycle 1: r1 (7), r2 (3), r3's first segment (10); cycle 2: r3's second segment (15).
    assert [c["loopbacks"] for c in cycles] == [
        {"requests": 3, "tokens_kept": 20},
        {"requests": 1, "tokens_kept": 15},
    ]
    table = _run(looped["path"], "refits").output.splitlines()
    assert table[0].split()[-3:] == ["looped", "kept", "failed"]
    assert table[1].split()[-3:] == ["3", "20", "-"]


def test_loopbacks_of_one_refit(looped):
    out = json.loads(_run(looped["path"], "loopbacks", "--refit", str(looped["c2"]), "--json").output)
    assert [lb["request_id"] for lb in out["loopbacks"]] == ["r3"]
    assert (out["requests"], out["tokens_kept"]) == (1, 15)
    out = json.loads(_run(looped["path"], "loopbacks", "--refit", str(looped["c1"]), "--json").output)
    assert [lb["request_id"] for lb in out["loopbacks"]] == ["r1", "r2" + OSC, "r3"]
    assert (out["requests"], out["tokens_kept"]) == (3, 20)
    assert [lb["refit_tokens_kept"] for lb in out["loopbacks"]] == [7, 3, 10]
    # --last shows fewer rows; the cycle's totals still count every request it looped back.
    out = json.loads(
        _run(looped["path"], "loopbacks", "--refit", str(looped["c1"]), "--last", "1", "--json").output
    )
    assert [lb["request_id"] for lb in out["loopbacks"]] == ["r3"]
    assert (out["requests"], out["tokens_kept"]) == (3, 20)
    text = _run(looped["path"], "loopbacks", "--refit", str(looped["c1"])).output
    assert text.splitlines()[-1] == f"refit cycle {looped['c1']}: 3 requests looped back, 20 tokens kept"


def test_loopbacks_lists_every_request_with_its_tokens(looped):
    out = json.loads(_run(looped["path"], "loopbacks", "--json").output)["loopbacks"]
    assert [(lb["request_id"], lb["tokens_kept"], lb["loopbacks"]) for lb in out] == [
        ("r1", 7, 1),
        ("r2" + OSC, 3, 1),
        ("r3", 25, 2),
        ("r4", 2, 1),
    ]
    assert [
        lb["request_id"]
        for lb in json.loads(_run(looped["path"], "loopbacks", "--json", "--last", "1").output)["loopbacks"]
    ] == ["r4"]


@pytest.mark.parametrize("window", [1, 3, 4096])
def test_a_cycle_is_read_whole_whatever_the_first_window(looped, monkeypatch, window):
    """The cycle is read from a window after its first seq, widened until it is closed."""
    from smgrl.cli.journal import loopbacks

    monkeypatch.setattr(loopbacks, "CYCLE_WINDOW", window)
    out = json.loads(_run(looped["path"], "loopbacks", "--refit", str(looped["c1"]), "--json").output)
    assert (out["requests"], out["tokens_kept"]) == (3, 20)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--refit", "2"], "no refit cycle 2"),
        (["--refit", "6"], "no refit cycle 6"),  # an outcome of cycle 1's first op, not an op
        (["--last", "2", "--all"], "contradict"),
    ],
)
def test_loopbacks_bad_values(looped, args, message):
    result = _run(looped["path"], "loopbacks", *args)
    assert result.exit_code == EXIT_BAD_VALUE
    assert message in result.output


@pytest.mark.parametrize("width", [80, 120])
def test_loopbacks_output_is_escaped_and_fits(looped, width):
    for args in (["loopbacks"], ["loopbacks", "--refit", str(looped["c1"])], ["refits"]):
        out = _run(looped["path"], *args, "--width", str(width)).output
        assert "\x1b" not in out and "\x07" not in out
        assert [line for line in out.splitlines() if len(line) > width] == []
    assert "\\x1b]0;pwned\\x07" in _run(looped["path"], "loopbacks", "--wide").output


def test_no_loopbacks(tmp_path):
    b = Builder(tmp_path / "none.db")
    b.register("w0", "http://127.0.0.1:31000")
    b.close()
    assert _run(str(tmp_path / "none.db"), "loopbacks").output == "no looped-back requests\n"

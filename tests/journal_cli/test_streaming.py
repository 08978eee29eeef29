"""Streamed history: ``ops --all`` and ``refits --all`` read operations in start order
with bounded state (``opscan.stream_ops``, ``refits.iter_cycles``) and print per chunk
(``render.ChunkedTable``). They must say exactly what the whole read says (``load_ops`` +
``group_cycles``) on hypothesis-generated journals (test_history's generator: fan-outs that pause,
update or resume with refused and timed-out answers, operations cut short, interrupted or
overlapping), hold a bounded number of operations, and never cut a value the whole table shows."""

from __future__ import annotations

import json
import tracemalloc

import attrs
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_history import build, register, step

from journal import SqliteStore
from smgrl.cli.journal import journal_group
from smgrl.cli.journal.render import UUID, ChunkedTable, FixedTable, _ids_in_columns, output
from smgrl.history.reading import load_ops, stream_ops
from smgrl.state.refits import group_cycles, iter_cycles


def _ops_json(ops) -> list[dict]:
    return [attrs.asdict(op) for op in ops]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(register, min_size=4, max_size=4),
    st.lists(step, min_size=1, max_size=50),
    st.integers(0, 30),
    st.sampled_from(["needed", "all", "none"]),
)
def test_streamed_ops_and_cycles_equal_the_whole_read(tmp_path_factory, fleet, steps, after, outcomes):
    path = tmp_path_factory.mktemp("s") / "j.db"
    build(path, [(kind, i, label, dp) for i, (kind, _slot, label, dp) in enumerate(fleet)] + steps)
    with SqliteStore.open(path, readonly=True) as store:
        whole = load_ops(store, after_seq=after, outcomes=outcomes).in_order()
        streamed = list(stream_ops(store, after_seq=after, outcomes=outcomes))
        assert _ops_json(streamed) == _ops_json(whole)
        cycles = [c.to_json() for c in iter_cycles(stream_ops(store, after_seq=after))]
        assert cycles == [c.to_json() for c in group_cycles(load_ops(store, after_seq=after).in_order())]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(register, min_size=4, max_size=4), st.lists(step, min_size=1, max_size=50))
def test_all_commands_equal_the_whole_listing(tmp_path_factory, fleet, steps):
    """``--all`` (streamed) and ``--last`` larger than the journal (one whole read) agree."""
    path = tmp_path_factory.mktemp("c") / "j.db"
    build(path, [(kind, i, label, dp) for i, (kind, _slot, label, dp) in enumerate(fleet)] + steps)

    def run(*args):
        result = CliRunner().invoke(
            journal_group, ["--journal", str(path), "--json", *args], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    assert run("ops", "--all") == run("ops", "--last", "100000")
    assert run("refits", "--all") == run("refits", "--last", "100000")


def _sequential_ops(path, n: int) -> None:
    steps = [("register", i, "v0", False) for i in range(4)]
    steps += [
        ("op", ["pause_generation", "update_weights_from_disk", "continue_generation"][i % 3], [0, 1, 2, 3])
        + (["ok", "ok", "refused", "ok"] if i % 5 == 0 else ["ok"] * 4, "finished", i % 10)
        for i in range(n)
    ]
    build(path, steps)


def _peak_streaming(path) -> int:
    with SqliteStore.open(path, readonly=True) as store:
        tracemalloc.start()
        try:
            count = sum(1 for _ in iter_cycles(stream_ops(store)))
            _size, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert count > 0
    return peak


def test_streaming_memory_does_not_grow_with_the_journal(tmp_path):
    """Ten times the operations, about the same peak: only open operations and cycles are held
    (the whole read holds every operation: its peak grows tenfold)."""
    small, large = tmp_path / "small.db", tmp_path / "large.db"
    _sequential_ops(small, 150)
    _sequential_ops(large, 1500)
    assert _peak_streaming(large) < 2 * _peak_streaming(small)


def test_chunked_table_never_cuts_a_value_that_grows_past_the_first_chunk():
    """Seqs and versions get longer as a journal goes on: the first chunk's widths were cut
    ("9999…") in later chunks; now the layout widens and the header is printed again."""
    rows = [{"seq": 10**k, "version": "v" * k} for k in range(1, 12)]
    with output(None, False):
        layout = ChunkedTable()
        text = "\n".join(layout.render(rows[i : i + 2], ("seq", "version")) for i in range(0, len(rows), 2))
    lines = [line.split() for line in text.splitlines() if not line.startswith("seq")]
    assert lines == [[str(r["seq"]), r["version"]] for r in rows]
    assert "…" not in text


def test_chunked_table_keeps_a_fitted_width_when_the_terminal_narrowed_it():
    """A column the fit cut to the terminal's width stays cut (as the whole table would be),
    without a header per chunk."""
    rows = [{"id": str(i), "text": "x" * (200 + i)} for i in range(6)]
    with output(80, False):
        layout = ChunkedTable()
        text = "\n".join(layout.render(rows[i : i + 2], ("id", "text")) for i in range(0, 6, 2))
    assert sum(1 for line in text.splitlines() if line.startswith("id")) == 1
    assert all(len(line) <= 80 for line in text.splitlines())


def test_streamed_picture_with_json_lists_every_cycle(tmp_path):
    """`refits --all --svg F --json`: the picture keeps the last cycles only, the JSON all of them."""
    path = tmp_path / "j.db"
    _sequential_ops(path, 30)

    def run(*args):
        result = CliRunner().invoke(
            journal_group, ["--journal", str(path), "--json", "refits", *args], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    svg = tmp_path / "r.svg"
    pictured = run("--since", "0", "--svg", str(svg))
    assert pictured == run("--last", "1000") and len(pictured["cycles"]) == 10
    assert svg.read_text().startswith("<svg")


@given(
    st.lists(st.integers(min_value=0, max_value=12), min_size=1, max_size=5).flatmap(
        lambda widths: st.tuples(
            st.just(widths),
            st.lists(
                st.tuples(*(st.text(" ab-\u00e9", max_size=w or 20) for w in widths)), min_size=1, max_size=6
            ),
        )
    ),
    st.integers(min_value=1, max_value=3),
)
def test_fitting_rows_render_as_the_generic_table_does(case, gap):
    """The one-format-string rendering of rows that fit (``ChunkedTable``'s fast path) is the
    same text as ``FixedTable.render``: padding, an unbounded last column, trailing spaces
    stripped (even a last cell of spaces)."""
    widths, rows = case
    layout = FixedTable(tuple(f"c{i}" for i in range(len(widths))), widths, gap)
    for header in (True, False):
        assert layout.render_fitting(rows, header=header) == layout.render(rows, header=header)


@given(st.lists(st.one_of(st.none(), st.integers(-(10**40), 10**40))))
def test_integer_columns_hold_no_ids_as_their_text_would_say(values):
    """``_ids_in_columns`` skips a column of integers (refits' cycle and engines): the same
    answer as searching their text."""
    assert _ids_in_columns([values]) == UUID.findall("\n".join(str(v) for v in values if v))

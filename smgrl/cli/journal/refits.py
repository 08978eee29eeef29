"""``smgrl journal refits``: refit cycles as a table, JSON, or a picture (``--html``, ``--svg``)."""

from __future__ import annotations

import collections
import json
import tempfile
from collections.abc import Iterable, Iterator
from typing import Any

import click

from smgrl.cli.journal.group import Ctx, command, last_or_all, refuse_last_with_all
from smgrl.cli.journal.loopbacks import per_cycle, read_loopbacks
from smgrl.cli.journal.render import ChunkedTable, chunks, current, json_text, notes, table
from smgrl.cli.journal.timeline import OVERVIEW_MAX, html_parts, render_html, render_svg
from smgrl.history import sagas as sv
from smgrl.history.reading import add_outcomes, recent, seq_at, stream_ops
from smgrl.history.values import Point, fmt_ms, fmt_ts, parse_time, time_window
from smgrl.state import PHASE_ORDER, Cycle, OpsFold, group_cycles, iter_cycles

LAST_DEFAULT = 50  # cycles shown unless --last, --all, --since or --until say otherwise
DETAIL_DEFAULT = 20  # cycles drawn in detail in a picture unless --last says otherwise
MARGIN = 4096  # events read before --since, so a cycle that began just before is read whole


def cycle_row(c: Cycle, phases: list[str], looped: tuple[int, int] | None = None) -> dict[str, Any]:
    spans = c.phases()
    failed = c.failures()
    row: dict[str, Any] = {
        "cycle": c.index,  # the seq of its first operation
        "start": fmt_ts(c.start),
        "status": c.status,
        "version": c.version,
        "engines": len(c.engines),
    }
    for phase in phases:
        s = spans.get(phase)
        if s is None:
            row[phase] = "-"
        else:
            d = s[1] - s[0]  # fmt_ms's first case inlined (most phases last under a second)
            row[phase] = f"{d * 1000:.0f} ms" if d < 1 else fmt_ms(d)
    # c.end, from the phases just read: each phase's end is the latest last_ts of its ops.
    row["total"] = fmt_ms(max([s[1] for s in spans.values()]) - c.start) if spans else fmt_ms(c.end - c.start)
    if looped is not None:  # only when the journal has loopbacks in the cycles shown
        row["looped"], row["kept"] = looped
    row["failed"] = ", ".join(f"{e} ({'; '.join(why)})" for e, why in failed.items()) if failed else "-"
    return row


@command("refits")
@click.option("--since", default=None, metavar="TIME", help="Only cycles started at or after TIME.")
@click.option("--until", default=None, metavar="TIME", help="Only cycles started before TIME.")
@last_or_all(f"The N most recent cycles (default {LAST_DEFAULT}).", "Every cycle in the journal.")
@click.option(
    "--html", "html_path", type=click.Path(dir_okay=False), default=None, help="Write an HTML report."
)
@click.option(
    "--svg", "svg_path", type=click.Path(dir_okay=False), default=None, help="Write an SVG picture."
)
def refits(ctx: Ctx, since, until, last, everything, html_path, svg_path) -> None:
    """Refit cycles (pause, weight updates, resume): version, engines, phase durations, failures."""
    since_ts = parse_time(since, ctx.now) if since else None
    until_ts = parse_time(until, ctx.now) if until else None
    time_window(since_ts, until_ts)
    ranged = since_ts is not None or until_ts is not None
    refuse_last_with_all(last, everything)
    picture = bool(html_path or svg_path)
    with ctx.reader() as store:
        if not (ranged or everything):
            # The last N cycles: a window at the end of the journal, widened until it holds them.
            fold, cycles = recent(
                store, last or LAST_DEFAULT, lambda f: group_cycles(f.in_order()), per_item=40
            )
            detail = cycles if last is not None else cycles[-DETAIL_DEFAULT:]
            if picture:
                # Per-engine bars need every target's own timing: read the outcomes of the drawn ops.
                add_outcomes(store, fold, [op.op_id for c in detail for op in c.ops])
            _output(ctx, store, cycles, detail, len(cycles), html_path, svg_path)
            return
        # --all, --since, --until: streamed in start order, memory bounded by the open cycles.
        start = seq_at(store, Point(ts=since_ts)) - MARGIN if since_ts is not None else 0
        stream: Iterable[Cycle] = iter_cycles(stream_ops(store, after_seq=max(0, start)))
        if ranged:
            stream = (
                c
                for c in stream
                if (since_ts is None or c.start >= since_ts) and (until_ts is None or c.start < until_ts)
            )
        if last is not None:
            stream = collections.deque(stream, maxlen=last)
        first: list[int] = []  # the first cycle's seq: quarantines outside sagas are read from there
        ids: list[str] = []  # the sagas behind the cycles shown (few: one per saga refit)

        told: dict[str, dict[str, Any] | None] = {}

        def noted(cycles: Iterable[Cycle]) -> Iterator[Cycle]:
            for c in cycles:
                if not first:
                    first.append(c.index)
                for op in c.ops:  # few cycles belong to a saga: saga_ids only for those
                    if op.selector and op.selector.startswith(sv.PREFIX):
                        ids.extend(_settle(store, [c], told))
                        break
                yield c

        stream = noted(stream)
        if picture:
            _picture(ctx, store, stream, last, html_path, svg_path)
        elif ctx.json:
            shown = 0
            for chunk in chunks(stream, CHUNK):
                head = '{"cycles": [' if shown == 0 else ","
                # Loopbacks per cycle, read from the chunk's first cycle on (the (type, seq) index).
                looped = per_cycle(chunk, read_loopbacks(ctx.path, chunk[0].index - 1))
                texts = (json_text(_with_loopbacks(c.to_json(), looped[c.index]), lines=True) for c in chunk)
                click.echo(head + ",".join(texts), nl=False)
                shown += len(chunk)
            click.echo('{"cycles": [' if shown == 0 else "", nl=False)
            sagas = _sagas(store, ids, first, since_ts is not None, told)
            click.echo("]," + json_text(sagas, lines=True)[1:])
        else:
            # A narrow terminal drops phase columns (the total stays) and then the engine count;
            # a failure's engine and reason are never cut (the terminal wraps the line).
            optional = [*reversed(PHASE_ORDER), "engines"]
            shown, layout, seen = 0, ChunkedTable(limits=LIMITS, optional=optional), set()
            for chunk in chunks(stream, CHUNK):
                for c in chunk:
                    seen.update(c.phases())
                phases = [p for p in PHASE_ORDER if p in seen]
                rows, failures = terminal_rows([cycle_row(c, phases) for c in chunk])
                click.echo(layout.render(rows, _columns(phases)))
                if failures:
                    click.echo(notes(failures))
                shown += len(chunk)
            if shown == 0:
                click.echo("no refit cycles")
            _print_sagas(_sagas(store, ids, first, since_ts is not None, told))


CHUNK = 500  # cycles per printed chunk: the output is streamed, never held whole
LIMITS = {"failed": 120, "version": 24}


def terminal_rows(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows for a terminal table, and the lines printed under it: a failed cycle's ``failed`` cell
    holds how many engines failed, and a line under the table names each one with its reason in
    full (wrapped, never cut: a cut URL or id would name another engine). ``--wide`` keeps the
    full text in the cell."""
    if current().wide:
        return rows, []
    shown, lines = [], []
    for row in rows:
        failed = row.get("failed", "-")
        if failed and failed != "-":
            lines.append(f"cycle {row['cycle']} failed: {failed}")
            row = {**row, "failed": f"{len(failed.split('), '))} below"}
        shown.append(row)
    return shown, lines


def _columns(phases: list[str]) -> list[str]:
    return ["cycle", "start", "status", "version", "engines", *phases, "total", "failed"]


def _picture(ctx: Ctx, store, stream: Iterable[Cycle], last, html_path, svg_path) -> None:
    """The picture of a streamed range: the overview draws the last OVERVIEW_MAX cycles and the
    panels the last ``--last`` (else DETAIL_DEFAULT), so only those are held. The HTML table has
    a row per cycle: each is spooled to a temporary file as it comes (every phase; the phases
    never seen are dropped when the page is written), so memory stays flat in the journal."""
    n_detail = last if last is not None else DETAIL_DEFAULT
    # With --json too, the JSON lists every cycle of the range: then all of them are held.
    keep = None if ctx.json else max(OVERVIEW_MAX, n_detail)
    tail: collections.deque[Cycle] = collections.deque(maxlen=keep)
    seen: set[str] = set()
    total = 0
    every = _columns(list(PHASE_ORDER))
    with tempfile.TemporaryFile("w+", encoding="utf-8") as spool:
        for c in stream:
            tail.append(c)
            total += 1
            spans = c.phases()
            seen.update(spans)
            if html_path and not ctx.json:
                row = cycle_row(c, list(PHASE_ORDER))
                spool.write(json.dumps([row[k] for k in every]) + "\n")
        cycles = list(tail)
        detail = cycles[-n_detail:]
        fold = OpsFold()
        fold.ops = {op.op_id: op for c in detail for op in c.ops}
        add_outcomes(store, fold, list(fold.ops))
        columns = _columns([p for p in PHASE_ORDER if p in seen])
        if ctx.json or not html_path:
            _output(ctx, store, cycles, detail, total, html_path, svg_path, rows=None if ctx.json else [])
            return
        spool.seek(0)
        rows = (
            {k: v for k, v in zip(every, json.loads(line), strict=True) if k in columns} for line in spool
        )
        title = f"smgrl refits · {ctx.label}"
        with open(html_path, "w", encoding="utf-8") as f:
            f.writelines(html_parts(cycles, rows, columns, title=title, detail=len(detail), total=total))
        if svg_path:
            _write(svg_path, render_svg(cycles, title=title, detail=len(detail)))
    for path in (html_path, svg_path):
        if path:
            click.echo(f"wrote {path} ({total} cycles, {len(detail)} in detail)")


def _settle(store, cycles: Iterable[Cycle], told: dict[str, dict[str, Any] | None]) -> list[str]:
    """Tell each saga's cycle in its saga's words (``Cycle.settle``: the saga's result and
    reasons, the same vocabulary as ``GET /v1/rl/refits/{id}``); the saga ids, in order. Each
    saga is read once (``told``)."""
    ids = list(sv.saga_ids(cycles))
    for c in cycles:
        for rid in sv.saga_ids([c]):
            if rid not in told:
                told[rid] = sv.read_saga(store, rid)
            if told[rid] is not None:
                c.settle(told[rid])
    return ids


def _sagas(
    store, ids: Iterable[str], first: list[int], ranged: bool, told: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The sagas behind the cycles shown, and the quarantines set outside them since the first
    cycle shown (the whole journal when nothing narrowed it)."""
    told = {} if told is None else told
    for rid in dict.fromkeys(ids):
        if rid not in told:
            told[rid] = sv.read_saga(store, rid)
    sagas = [told[rid] for rid in dict.fromkeys(ids) if told[rid] is not None]
    after = first[0] - 1 if first else (store.last_seq() if ranged else 0)
    return {"sagas": sagas, "quarantines": sv.other_quarantines(store, max(0, after))}


def _print_sagas(found: dict[str, Any]) -> None:
    if found["sagas"]:
        click.echo("\nrefit sagas (docs/refits.md)")
        click.echo(table([sv.saga_row(s) for s in found["sagas"]], sv.COLUMNS, limits=sv.LIMITS))
    if found["quarantines"]:
        click.echo("\nquarantines outside sagas (by hand, recovered engines)")
        click.echo(table(found["quarantines"], sv.QUARANTINE_COLUMNS, limits=sv.LIMITS))


def _output(
    ctx: Ctx,
    store,
    cycles: list[Cycle],
    detail: list[Cycle],
    total: int,
    html_path,
    svg_path,
    rows=None,
) -> None:
    # Loopbacks are journaled when their request ends, after the op that caused them: read from
    # the first cycle shown on (the (type, seq) index; nothing else is parsed).
    looped = per_cycle(cycles, read_loopbacks(ctx.path, cycles[0].index - 1)) if cycles else {}
    any_looped = any(n for n, _ in looped.values())
    told: dict[str, dict[str, Any] | None] = {}
    ids = _settle(store, cycles, told)  # before the rows: a saga's cycle says what the saga says
    if rows is None:
        seen = {p for c in cycles for p in c.phases()}
        phases = [p for p in PHASE_ORDER if p in seen]
        rows = [cycle_row(c, phases, looped[c.index] if any_looped else None) for c in cycles]
    title = f"smgrl refits · {ctx.label}"
    if html_path:
        _write(html_path, render_html(cycles, rows, title=title, detail=len(detail), total=total))
    if svg_path:
        _write(svg_path, render_svg(cycles, title=title, detail=len(detail)))
    found = _sagas(store, ids, [cycles[0].index] if cycles else [], False, told)
    if ctx.json:
        ctx.emit({"cycles": [_with_loopbacks(c.to_json(), looped[c.index]) for c in cycles], **found})
        return
    if html_path or svg_path:
        for path in (html_path, svg_path):
            if path:
                click.echo(f"wrote {path} ({total} cycles, {len(detail)} in detail)")
        return
    if not rows:
        click.echo("no refit cycles")
    else:
        shown, failures = terminal_rows(rows)
        click.echo(table(shown, list(shown[0]), limits=LIMITS, optional=[*reversed(PHASE_ORDER), "engines"]))
        if failures:
            click.echo(notes(failures))
    _print_sagas(found)


def _with_loopbacks(cycle: dict[str, Any], looped: tuple[int, int]) -> dict[str, Any]:
    cycle["loopbacks"] = {"requests": looped[0], "tokens_kept": looped[1]}
    return cycle


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)

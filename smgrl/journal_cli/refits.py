"""``smgrl journal refits``: refit cycles as a table, JSON, or a picture (``--html``, ``--svg``)."""

from __future__ import annotations

from typing import Any

import click

from smgrl.journal_cli.group import EXIT_BAD_VALUE, CliError, Ctx, command
from smgrl.journal_cli.loopbacks import per_cycle, read_loopbacks
from smgrl.journal_cli.reading import add_outcomes, load_ops, recent, seq_at
from smgrl.journal_cli.render import table
from smgrl.journal_cli.timeline import render_html, render_svg
from smgrl.journal_cli.values import Point, fmt_ms, fmt_ts, parse_time, time_window
from smgrl.state.refits import PHASE_ORDER, Cycle, group_cycles

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
        row[phase] = fmt_ms(s[1] - s[0]) if s else "-"
    row["total"] = fmt_ms(c.end - c.start)
    if looped is not None:  # only when the journal has loopbacks in the cycles shown
        row["looped"], row["kept"] = looped
    row["failed"] = ", ".join(f"{e} ({'; '.join(why)})" for e, why in failed.items()) if failed else "-"
    return row


@command("refits")
@click.option("--since", default=None, metavar="TIME", help="Only cycles started at or after TIME.")
@click.option("--until", default=None, metavar="TIME", help="Only cycles started before TIME.")
@click.option(
    "--last",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help=f"The N most recent cycles (default {LAST_DEFAULT}).",
)
@click.option("--all", "everything", is_flag=True, help="Every cycle in the journal.")
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
    if last is not None and everything:
        raise CliError("--last and --all contradict each other", EXIT_BAD_VALUE)
    picture = bool(html_path or svg_path)
    with ctx.reader() as store:
        if ranged:
            # A margin before --since lets a cycle that began just before it be read whole.
            start = seq_at(store, Point(ts=since_ts)) - MARGIN if since_ts is not None else 0
            fold = load_ops(store, after_seq=max(0, start))
            cycles = [
                c
                for c in group_cycles(fold.in_order())
                if (since_ts is None or c.start >= since_ts) and (until_ts is None or c.start < until_ts)
            ]
            cycles = cycles if last is None else cycles[-last:]
        else:
            want = None if everything else (last or LAST_DEFAULT)
            fold, cycles = recent(store, want, lambda f: group_cycles(f.in_order()), per_item=40)
        detail = cycles if last is not None else cycles[-DETAIL_DEFAULT:]
        if picture:
            # Per-engine bars need every target's own timing: read the outcomes of the drawn ops.
            add_outcomes(store, fold, [op.op_id for c in detail for op in c.ops])
    seen = {p for c in cycles for p in c.phases()}
    phases = [p for p in PHASE_ORDER if p in seen]
    # Loopbacks are journaled when their request ends, after the op that caused them: read from
    # the first cycle shown on (the (type, seq) index; nothing else is parsed).
    looped = per_cycle(cycles, read_loopbacks(ctx.path, cycles[0].index - 1)) if cycles else {}
    any_looped = any(n for n, _ in looped.values())
    rows = [cycle_row(c, phases, looped[c.index] if any_looped else None) for c in cycles]
    title = f"smgrl refits · {ctx.path}"
    if html_path:
        _write(html_path, render_html(cycles, rows, title=title, detail=len(detail)))
    if svg_path:
        _write(svg_path, render_svg(cycles, title=title, detail=len(detail)))
    if ctx.json:
        ctx.emit({"cycles": [_with_loopbacks(c.to_json(), looped[c.index]) for c in cycles]})
        return
    if picture:
        for path in (html_path, svg_path):
            if path:
                click.echo(f"wrote {path} ({len(cycles)} cycles, {len(detail)} in detail)")
        return
    if not rows:
        click.echo("no refit cycles")
        return
    click.echo(table(rows, list(rows[0]), limits={"failed": 120, "version": 24}))


def _with_loopbacks(cycle: dict[str, Any], looped: tuple[int, int]) -> dict[str, Any]:
    cycle["loopbacks"] = {"requests": looped[0], "tokens_kept": looped[1]}
    return cycle


def _write(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)

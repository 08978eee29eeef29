"""``smgrl journal workers [--at]`` and ``smgrl journal versions [ENGINE]``: the projections."""

from __future__ import annotations

from typing import Any

import click

from smgrl.cli.journal.group import Ctx, command
from smgrl.cli.journal.render import ChunkedTable, chunks, json_text, table
from smgrl.core import EngineFacts, Worker, facts_for
from smgrl.history import sqlview
from smgrl.history.queries import add_times, fleet_at, grouped, version_changes
from smgrl.history.reading import seq_at
from smgrl.history.values import fmt_ts, parse_point


def version_status(facts: EngineFacts | None) -> str | None:
    if facts is None:
        return None
    return "unknown" if not facts.version_known else "mixed" if facts.mixed else "consistent"


def worker_record(w: Worker, facts: EngineFacts | None) -> dict[str, Any]:
    """A registry entry with its engine's projected state (the discovery row's rule for versions)."""
    label_version = w.labels.get("weight_version")
    weight_version = facts.weight_version if facts and facts.weight_version is not None else label_version
    source = facts.version_source if facts else None
    if source is None and weight_version is not None and (facts is None or facts.weight_version is None):
        source = "registration"  # the registration label is what is shown (the API row says null)
    return {
        "id": w.id,
        "url": w.url,
        "base_url": w.base_url,
        "engine": w.engine,
        "model_id": w.effective_model_id,
        "worker_type": w.worker_type,
        "connection_mode": w.connection_mode,
        "status": w.status,
        "dp_rank": w.dp_rank,
        "dp_size": w.dp_size,
        "group": w.group,
        "source": w.source,
        "registered_seq": w.registered_seq,
        "has_api_key": w.has_api_key,  # whether one exists; the key itself is never read
        "labels": w.labels,
        "weight_version": weight_version,
        "version_source": source,
        "control": facts.control if facts else None,
        "version_status": version_status(facts),
    }


@command("workers")
@click.option("--at", "at", default=None, metavar="SEQ|TIME", help="The registry as it was at SEQ or TIME.")
def workers(ctx: Ctx, at: str | None) -> None:
    """Every registered worker with its engine's weight version and control state."""
    with ctx.reader() as store:
        upto = seq_at(store, parse_point(at, ctx.now)) if at else store.last_seq()
        fleet, snapshot_seq = fleet_at(ctx.path, store, upto)
    engines = fleet.facts()
    rows = [worker_record(w, facts_for(w, engines)) for w in fleet.registry]
    if ctx.json:
        ctx.emit({"at_seq": upto, "snapshot_seq": snapshot_seq, "workers": rows})
        return
    click.echo(f"registry at seq {upto}: {len(rows)} workers")
    if rows:
        cols = (
            "id",
            "url",
            "engine",
            "status",
            "weight_version",
            "version_source",
            "control",
            "version_status",
        )
        # Narrow terminals drop the journal's extra columns first; id, url, engine and the
        # version are always shown whole.
        click.echo(table(rows, cols, optional=WORKER_OPTIONAL))


def _engine_cell(row: dict[str, Any]) -> str:
    engines = row["engines"]
    return engines[0] if len(engines) == 1 else f"{engines[0]} (+{len(engines) - 1})"


@command("versions")
@click.argument("engine", required=False)
def versions(ctx: Ctx, engine: str | None) -> None:
    """The weight-version timeline of every engine (or of ENGINE: an address, or a worker id)."""
    with ctx.reader() as store:
        wanted = None
        if engine:
            fleet, _ = fleet_at(ctx.path, store, store.last_seq())
            worker = fleet.registry.get(engine)
            wanted = (worker.base_url, True) if worker is not None else (engine.rstrip("/"), False)
        changes = version_changes(ctx.path)
        if wanted is not None:
            target, exact = wanted
            changes = (
                (c._replace(engines=hit), via)
                for c, via in changes
                if (hit := tuple(e for e in c.engines if e == target or (not exact and target in e)))
            )
        # Streamed: rows are printed as they are found, so memory does not grow with the journal.
        shown, layout = 0, ChunkedTable(limits={"engine": 48})
        with sqlview.view(ctx.path) as conn:
            for chunk in chunks(grouped(changes), CHUNK):
                add_times(conn, chunk)
                shown = _print_versions(ctx, chunk, shown, layout)
    if ctx.json:
        click.echo('{"changes": []}' if shown == 0 else "]}")
    elif shown == 0:
        click.echo("no weight-version changes recorded" + (f" for {engine}" if engine else ""))


WORKER_OPTIONAL = ("version_source", "version_status", "control", "status")
VERSION_COLUMNS = ("seq", "time", "engine", "weight_version", "version_source", "version_status", "via")
CHUNK = 500  # rows per printed chunk: the output is streamed, never held whole


def _print_versions(ctx: Ctx, chunk: list[dict[str, Any]], shown: int, layout: ChunkedTable) -> int:
    """Print one chunk of version rows: JSON streamed as one object; a table whose column widths
    are those the first chunk was fitted to, so they never change partway."""
    for row in chunk:
        row["time"] = fmt_ts(row["ts"])
    if ctx.json:
        head = '{"changes": [' if shown == 0 else ","
        click.echo(head + ",".join(json_text(r, lines=True) for r in chunk), nl=False)
        return shown + len(chunk)
    for row in chunk:
        row["engine"] = _engine_cell(row)
    click.echo(layout.render(chunk, VERSION_COLUMNS))
    return shown + len(chunk)

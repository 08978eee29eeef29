"""``smgrl journal workers [--at]`` and ``smgrl journal versions [ENGINE]``: the projections."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import click

from journal.events import decode
from smgrl.core.view import EngineFacts, facts_for
from smgrl.core.worker import Worker, strip_rank
from smgrl.journal_cli.group import Ctx, command
from smgrl.journal_cli.reading import seq_at
from smgrl.journal_cli.render import table
from smgrl.journal_cli.values import fmt_ts, parse_point
from smgrl.state.fleet import FleetState
from smgrl.state.replay import FOLDED_TYPES, read_types, restore


def version_status(facts: EngineFacts | None) -> str | None:
    if facts is None:
        return None
    return "unknown" if not facts.version_known else "mixed" if facts.mixed else "consistent"


def worker_record(w: Worker, facts: EngineFacts | None) -> dict[str, Any]:
    """A registry entry with its engine's projected state (the discovery row's rule for versions)."""
    label_version = w.labels.get("weight_version")
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
        "weight_version": facts.weight_version
        if facts and facts.weight_version is not None
        else label_version,
        "version_source": facts.version_source if facts else None,
        "control": facts.control if facts else None,
        "version_status": version_status(facts),
    }


@command("workers")
@click.option("--at", "at", default=None, metavar="SEQ|TIME", help="The registry as it was at SEQ or TIME.")
def workers(ctx: Ctx, at: str | None) -> None:
    """Every registered worker with its engine's weight version and control state."""
    with ctx.reader() as store:
        upto = seq_at(store, parse_point(at, ctx.now)) if at else store.last_seq()
        fleet, info = restore(store, until_seq=upto)
    engines = fleet.facts()
    rows = [worker_record(w, facts_for(w, engines)) for w in fleet.registry]
    if ctx.json:
        ctx.emit({"at_seq": upto, "snapshot_seq": info.snapshot_seq, "workers": rows})
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
        click.echo(table(rows, cols))


def version_timeline(events: Iterable[tuple[int, float, Any]]) -> Iterator[dict[str, Any]]:
    """Every change of an engine's version facts, folding FleetState over ``(seq, ts, event)``."""
    fleet = FleetState()
    ops: dict[str, tuple[str, list[str]]] = {}  # op id -> (path, engines) while the op is open
    for seq, ts, event in events:
        kind = getattr(event, "TYPE", None)
        candidates: list[str] = []
        if kind == "control.started":
            bases = sorted({strip_rank(t["url"]) for t in event.targets})
            ops[event.op_id] = (event.path, bases)
        elif kind in ("control.outcome", "control.finished", "control.interrupted"):
            candidates = ops.get(event.op_id, ("", []))[1]
        elif kind == "worker.discovered":
            w = fleet.registry.get(event.worker_id)
            candidates = [w.base_url] if w is not None else []
        before = {b: fleet.engines.engines.get(b) for b in candidates}
        fleet.apply(seq, event)
        for base in candidates:
            after = fleet.engines.engines.get(base)
            if after is None or after is before[base]:
                continue
            old = before[base]
            if old is not None and (old.weight_version, version_status(old), old.version_source) == (
                after.weight_version,
                version_status(after),
                after.version_source,
            ):
                continue  # only the control state moved
            path = ops.get(getattr(event, "op_id", ""), ("", []))[0]
            version = after.weight_version
            if version is None:  # not set by a refit yet: the registration label, as discovery shows
                labels = next((w.labels for w in fleet.registry if w.base_url == base), {})
                version = labels.get("weight_version")
            yield {
                "seq": seq,
                "ts": ts,
                "time": fmt_ts(ts),
                "engine": base,
                "weight_version": version,
                "version_source": after.version_source,
                "version_status": version_status(after),
                "control": after.control,
                "op_id": getattr(event, "op_id", None),
                "via": f"/{path.lstrip('/')}" if path else kind,
            }
        if kind in ("control.finished", "control.interrupted"):
            ops.pop(event.op_id, None)


@command("versions")
@click.argument("engine", required=False)
def versions(ctx: Ctx, engine: str | None) -> None:
    """The weight-version timeline of every engine (or of ENGINE: an address, or a worker id)."""
    with ctx.reader() as store:
        rows_in = (
            (seq, ts, decode(type_, schema, payload))
            for seq, ts, _stream, type_, schema, payload in read_types(store, FOLDED_TYPES)
        )
        rows = list(version_timeline(rows_in))
        if engine:
            fleet, _ = restore(store)
            worker = fleet.registry.get(engine)
            wanted = worker.base_url if worker is not None else engine.rstrip("/")
            rows = [r for r in rows if r["engine"] == wanted or (worker is None and wanted in r["engine"])]
    if ctx.json:
        ctx.emit({"changes": rows})
        return
    if not rows:
        click.echo("no weight-version changes recorded" + (f" for {engine}" if engine else ""))
        return
    click.echo(
        table(rows, ("seq", "time", "engine", "weight_version", "version_source", "version_status", "via"))
    )

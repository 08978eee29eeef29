"""``smgrl journal ops`` (per-worker calls and fan-outs) and ``smgrl journal ops show ID``."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from typing import Any

import click

from journal.codec import ControlStarted
from smgrl.cli.journal.group import Ctx, command, last_or_all, refuse_last_with_all
from smgrl.cli.journal.render import ChunkedTable, chunks, json_text, table
from smgrl.history.reading import find_op, recent, stream_ops
from smgrl.history.values import fmt_ms, fmt_ts, parse_time, time_window
from smgrl.state import Op, Operations, OpsFold

LAST_DEFAULT = 50  # operations shown unless --last or --all say otherwise


def _target(op: Op) -> str:
    return f"worker {next(iter(op.targets), '-')}" if op.kind == "call" else op.selector or "(all)"


def _succeeded(op: Op) -> int:
    if op.result in (None, "interrupted"):
        # No control.finished: count the successes among the outcomes that were recorded.
        return sum(1 for span in op.spans() if span.state == "ok" and span.worker_id in op.outcomes)
    return op.succeeded


def op_cells(op: Op) -> dict[str, Any]:
    """The values of ``op_row`` that the table shows (``OPS_COLUMNS``): ``ops --all`` builds
    90,000 of them per million events."""
    succeeded = _succeeded(op)
    return {
        "id": op.op_id,
        "time": fmt_ts(op.start),
        "method": op.method,
        "path": "/" + op.path.lstrip("/"),
        "target": _target(op),
        "done": f"{succeeded}/{op.total}",
        "result": op.result or "open",
        "latency": fmt_ms(op.latency_ms / 1000) if op.latency_ms is not None else "-",
    }


def op_row(op: Op) -> dict[str, Any]:
    target = _target(op)
    succeeded = _succeeded(op)
    return {
        "id": op.op_id,
        "seq": op.seq,
        "ts": op.start,
        "time": fmt_ts(op.start),
        "kind": op.kind,
        "method": op.method,
        "path": "/" + op.path.lstrip("/"),
        "selector": op.selector,
        "target": target,
        "phase": op.phase,
        "version": op.version,
        "total": op.total,
        "succeeded": succeeded,
        "result": op.result or "open",
        "latency_ms": op.latency_ms,
        "done": f"{succeeded}/{op.total}",
        "latency": fmt_ms(op.latency_ms / 1000) if op.latency_ms is not None else "-",
    }


def keep(op: Op, *, path: str | None, result: str | None, worker: str | None, since, until) -> bool:
    """The ``ops`` filters (pure)."""
    if path is not None and not fnmatch.fnmatchcase(op.path.lstrip("/"), path.lstrip("/")):
        return False
    if result is not None and (op.result or "open") != result:
        return False
    if worker is not None and worker not in op.targets:
        return False
    if since is not None and op.start < since:
        return False
    return until is None or op.start < until


@command("ops", cls=click.Group, invoke_without_command=True)
@click.option(
    "--path", default=None, metavar="GLOB", help="Only calls to this engine path (e.g. 'update_weights*')."
)
@click.option(
    "--result",
    default=None,
    help="Only this result (ok, partial, failed, no_match, cancelled, interrupted, open).",
)
@click.option("--worker", default=None, metavar="ID", help="Only operations that targeted this worker.")
@click.option("--since", default=None, metavar="TIME", help="Only operations started at or after TIME.")
@click.option("--until", default=None, metavar="TIME", help="Only operations started before TIME.")
@last_or_all(f"The N most recent (default {LAST_DEFAULT}).", "Every matching operation.")
def ops(ctx: Ctx, path, result, worker, since, until, last, everything) -> None:
    """Per-worker calls and fan-outs: path, selector, totals, result, latency (``ops show ID``: one)."""
    click_ctx = click.get_current_context()
    if click_ctx.invoked_subcommand is not None:
        return
    since_ts = parse_time(since, ctx.now) if since else None
    until_ts = parse_time(until, ctx.now) if until else None
    time_window(since_ts, until_ts)
    refuse_last_with_all(last, everything)

    def matching(fold: OpsFold) -> list[Op]:
        return [
            op
            for op in fold.in_order()
            if keep(op, path=path, result=result, worker=worker, since=since_ts, until=until_ts)
        ]

    with ctx.reader() as store:
        if everything:
            # Streamed in start order, printed per chunk: memory holds the open operations only.
            chosen = stream_ops(store)
            if any(f is not None for f in (path, result, worker, since_ts, until_ts)):
                chosen = (
                    op
                    for op in chosen
                    if keep(op, path=path, result=result, worker=worker, since=since_ts, until=until_ts)
                )
            _print_streamed(ctx, map(op_row if ctx.json else op_cells, chosen))
            return
        # Windowed from the end: the last N matching operations cost what they are, not the journal.
        _fold, chosen = recent(store, last or LAST_DEFAULT, matching, per_item=12)
    rows = [op_row(op) for op in chosen]
    if ctx.json:
        ctx.emit({"operations": [{k: v for k, v in r.items() if k not in _HIDDEN} for r in rows]})
        return
    if not rows:
        click.echo("no operations")
        return
    click.echo(table(rows, OPS_COLUMNS))


OPS_COLUMNS = ("id", "time", "method", "path", "target", "done", "result", "latency")
_HIDDEN = ("done", "latency")  # table-only cells, not in the JSON
CHUNK = 500  # rows per printed chunk


def _print_streamed(ctx: Ctx, rows: Iterator[dict[str, Any]]) -> None:
    """``ops --all``: the same output as the listing, streamed one chunk at a time."""
    shown, layout = 0, ChunkedTable()
    for chunk in chunks(rows, CHUNK):
        if ctx.json:
            head = '{"operations": [' if shown == 0 else ","
            body = ",".join(
                json_text({k: v for k, v in r.items() if k not in _HIDDEN}, lines=True) for r in chunk
            )
            click.echo(head + body, nl=False)
        else:
            click.echo(layout.render(chunk, OPS_COLUMNS))
        shown += len(chunk)
    if ctx.json:
        click.echo('{"operations": []}' if shown == 0 else "]}")
    elif shown == 0:
        click.echo("no operations")


@command("show", group=ops)
@click.argument("op_id")
def show(ctx: Ctx, op_id: str) -> None:
    """One operation with every target's outcome (OP_ID may be a unique prefix)."""
    with ctx.reader() as store:
        full = find_op(store, op_id)
        projection = Operations()
        started = None
        for rec in store.read(0, stream=f"op:{full}"):
            projection.apply(rec.seq, rec.event)
            if isinstance(rec.event, ControlStarted):
                started = rec
    record = projection.get(full)
    assert record is not None and started is not None
    data = record.to_json()
    ev = started.event
    data.update(
        started_at=fmt_ts(started.ts),
        intent=ev.intent,
        principal=ev.principal,
        request_id=ev.request_id,
        body_size=ev.body_size,
        body_sha256=ev.body_sha256,
        body_kept=ev.body is not None,
    )
    if ctx.json:
        ctx.emit(data)
        return
    click.echo(f"operation {full}  ({data['kind']}, started {data['started_at']}, seq {data['started_seq']})")
    click.echo(f"  {ev.method} /{ev.path.lstrip('/')}" + (f"?{ev.query}" if ev.query else ""))
    if ev.selector:
        click.echo(f"  selector: {ev.selector}")
    if ev.intent:
        click.echo("  intent: " + ", ".join(f"{k}={v}" for k, v in ev.intent.items() if v is not None))
    kept = "kept" if ev.body is not None else ("compacted" if ev.body_encoding != "none" else "not kept")
    click.echo(f"  body: {ev.body_size} bytes ({kept}), sha256 {ev.body_sha256[:16]}…")
    click.echo(f"  by: {ev.principal or '-'}  request id: {ev.request_id or '-'}")
    latency = fmt_ms(data["latency_ms"] / 1000) if data["latency_ms"] is not None else "-"
    click.echo(
        f"  result: {data['result'] or 'open'}  http {data['http_status'] or '-'}  "
        f"{data['succeeded']}/{data['total']} succeeded  in {latency}"
    )
    rows = []
    for t in data["targets"]:
        o = t.get("outcome") or {}
        rows.append(
            {
                "worker_id": t["worker_id"],
                "url": t["url"],
                "status": o.get("status") if o else "no outcome",
                "error": o.get("error"),
                "latency_ms": o.get("latency_ms"),
                "answer": o.get("message") or o.get("excerpt"),
            }
        )
    if rows:
        click.echo(
            table(
                rows, ("worker_id", "url", "status", "error", "latency_ms", "answer"), limits={"answer": 80}
            )
        )
    if data["missing_targets"]:
        click.echo(f"  no outcome recorded for: {', '.join(data['missing_targets'])}")

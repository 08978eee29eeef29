"""``smgrl journal verify``, ``replay``, ``stats`` and ``compact``."""

from __future__ import annotations

import collections
import os
import sqlite3
import time
from typing import Any

import click

from journal import JournalError, JournalLock, JournalLocked, SqliteStore, snapshot_hash
from journal.retention import DEFAULT as DEFAULT_RETENTION
from smgrl.cli.journal.group import (
    EXIT_BAD_VALUE,
    EXIT_CHECK,
    EXIT_NOT_JOURNAL,
    CliError,
    Ctx,
    command,
    open_readonly,
)
from smgrl.cli.journal.render import table
from smgrl.history import sqlview
from smgrl.history.checks import diff_paths, payload_problem
from smgrl.history.reading import load_ops
from smgrl.history.replay import replay as replay_fold
from smgrl.history.values import fmt_ts
from smgrl.state import FleetState, group_cycles, snapshot


def check_schemas(store, upto: int) -> tuple[int | None, str | None, list[str]]:
    """(first bad seq, why, notes about events from a newer smgrl) over seq 1..upto."""
    newer: collections.Counter[str] = collections.Counter()
    for seq, _ts, _stream, type_, schema, payload in store.read_raw(0):
        if seq > upto:
            break
        problem = payload_problem(type_, schema, payload)
        if problem is None:
            continue
        kind, why = problem
        if kind == "error":
            return seq, why, []
        newer[why] += 1
    return None, None, [f"{why} ({n} events)" for why, n in sorted(newer.items())]


def check_snapshots(ctx: Ctx, store) -> tuple[int | None, str | None, list[str]]:
    """Every stored snapshot: bound to the chain (hash), loadable, and - for the newest usable
    fleet snapshot - equal to a full replay up to its seq."""
    notes: list[str] = []
    with sqlview.view(ctx.path) as conn:
        rows = sqlview.snapshots(conn)
        for row in rows:
            kind, state, upto, stored = sqlview.snapshot_state(conn, row["id"])
            anchor = sqlview.event_hash(conn, upto) if upto else "0" * 64
            if anchor is None or snapshot_hash(kind, upto, anchor, state) != stored:
                return (
                    upto,
                    f"snapshot {row['id']} (seq {upto}) does not match its hash: edited, or history rewritten",
                    notes,
                )
    newest = store.latest_snapshot(snapshot.KIND)
    if newest is None:
        notes.append("no fleet snapshot stored")
        return None, None, notes
    upto, text = newest
    try:
        stored_state = snapshot.from_json(text)
    except snapshot.SnapshotError as exc:
        notes.append(
            f"fleet snapshot at seq {upto} is not loadable by this smgrl ({exc}); startup replays instead"
        )
        return None, None, notes
    fresh = FleetState()
    replay_fold(store, fresh, 0, until_seq=upto)
    want = snapshot.to_dict(snapshot.capture(fresh))
    got = snapshot.to_dict(snapshot.capture(stored_state))
    if want != got:
        where = ", ".join(diff_paths(want, got))
        return upto, f"fleet snapshot at seq {upto} differs from a full replay at {where}", notes
    notes.append(f"fleet snapshot at seq {upto} equals a full replay")
    return None, None, notes


@command("verify")
@click.option("--no-replay", is_flag=True, help="Skip the snapshot comparison (chain and schemas only).")
def verify(ctx: Ctx, no_replay: bool) -> None:
    """Hash chain, event schemas, and a full replay compared with the stored snapshot.

    Exit status 1 names the first bad sequence number."""
    t0 = time.perf_counter()
    with ctx.reader() as store:
        report = store.verify()
        checks: dict[str, Any] = {"chain": {"ok": report.ok, "checked": report.checked}}
        bad_seq, why = (report.first_bad_seq, report.reason) if not report.ok else (None, None)
        notes: list[str] = []
        if bad_seq is None:
            bad_seq, why, notes = check_schemas(store, report.checked)
            checks["schemas"] = {"ok": bad_seq is None}
        if bad_seq is None:
            # The derived operation index (journal/opindex.py), rebuilt from the events and compared.
            index = store.check_op_index()
            checks["op_index"] = {"ok": index.ok, "operations": index.checked}
            if not index.ok:
                bad_seq = index.first_bad_seq
                why = f"{index.reason}: run `smgrl journal reindex` to rebuild it from the events"
        if bad_seq is None and not no_replay:
            bad_seq, why, more = check_snapshots(ctx, store)
            notes += more
            checks["snapshots"] = {"ok": bad_seq is None}
    ok = bad_seq is None
    out = {
        "ok": ok,
        "first_bad_seq": bad_seq,
        "reason": why,
        "events": report.checked,
        "checks": checks,
        "notes": notes,
    }
    if ctx.json:
        ctx.emit(out)
    else:
        for note in notes:
            click.echo(f"note: {note}")
        if ok:
            click.echo(f"ok: {report.checked} events verified in {time.perf_counter() - t0:.2f} s")
    if not ok:
        raise CliError(f"journal verification failed at seq {bad_seq}: {why}", EXIT_CHECK)


def summary(fleet: FleetState, cycles: list) -> dict[str, Any]:
    workers = collections.Counter(w.status for w in fleet.registry)
    facts = fleet.facts().values()
    return {
        "workers": len(fleet.registry),
        "workers_by_status": dict(sorted(workers.items())),
        "engines": len(facts),
        "engines_by_control": dict(sorted(collections.Counter(f.control for f in facts).items())),
        "engines_by_version_status": dict(
            sorted(
                collections.Counter(
                    "unknown" if not f.version_known else "mixed" if f.mixed else "consistent" for f in facts
                ).items()
            )
        ),
        "open_operations": len(fleet.operations.open),
        "refit_cycles": len(cycles),
        "refit_cycles_by_status": dict(sorted(collections.Counter(c.status for c in cycles).items())),
    }


@command("replay")
@click.option("--snapshot", "save", is_flag=True, help="Store the rebuilt state as a fresh fleet snapshot.")
def replay(ctx: Ctx, save: bool) -> None:
    """Rebuild every projection from scratch (no snapshot) and print a summary."""
    opener = ctx.writer if save else ctx.reader
    with opener() as store:
        t0 = time.perf_counter()
        head = store.last_seq()
        fleet = FleetState()
        folded = replay_fold(store, fleet, 0, until_seq=head)
        elapsed = time.perf_counter() - t0
        cycles = group_cycles(load_ops(store, until_seq=head).in_order())
        out: dict[str, Any] = {
            "events": head,
            "folded": folded,
            "seconds": round(elapsed, 3),
            **summary(fleet, cycles),
        }
        if save:
            if head == 0:
                raise CliError("the journal has no events to snapshot", EXIT_BAD_VALUE)
            text = snapshot.to_json(fleet)
            dropped = store.save_snapshot(snapshot.KIND, head, text)
            out["snapshot"] = {"upto_seq": head, "bytes": len(text), "dropped_by_retention": dropped}
    if ctx.json:
        ctx.emit(out)
        return
    click.echo(f"replayed {head} events ({folded} folded by the projections) in {elapsed:.2f} s")
    for key in (
        "workers_by_status",
        "engines_by_control",
        "engines_by_version_status",
        "refit_cycles_by_status",
    ):
        parts = ", ".join(f"{k} {v}" for k, v in out[key].items()) or "none"
        click.echo(f"  {key.replace('_', ' ')}: {parts}")
    click.echo(f"  open operations: {out['open_operations']}")
    if save:
        click.echo(f"stored a fleet snapshot at seq {head} ({out['snapshot']['bytes']} bytes)")
        dropped = out["snapshot"]["dropped_by_retention"]
        if dropped:
            click.echo(f"retention dropped older snapshots at seq {', '.join(map(str, dropped))}")


def retention_summary(snaps: list[dict[str, Any]], head: int) -> dict[str, Any]:
    """How many snapshots are stored and what the retention policy keeps (journal/retention.py)."""
    policy = DEFAULT_RETENTION
    return {
        "count": len(snaps),
        "bytes": sum(s["bytes"] or 0 for s in snaps),
        "recent": policy.recent,
        "per_level": policy.per_level,
        "max_kept": policy.max_kept(head),
    }


@command("stats")
def stats(ctx: Ctx) -> None:
    """Counts by type, file size, first and last event, snapshots."""
    with ctx.reader() as store:
        meta = store.meta()
    with sqlview.view(ctx.path) as conn:
        counts = sqlview.type_counts(conn)
        bounds = sqlview.bounds(conn)
        snaps = sqlview.snapshots(conn)
    sizes = {} if ctx.url else sqlview.file_sizes(ctx.path)  # PostgreSQL: no file of ours
    public_meta = {
        k: meta.get(k) for k in ("journal_id", "created_at", "format_version", "bodies_compacted_before")
    }
    out = {
        "path": ctx.label,
        "events": sum(counts.values()),
        **bounds,
        "first_time": fmt_ts(bounds["first_ts"]),
        "last_time": fmt_ts(bounds["last_ts"]),
        "types": counts,
        "bytes": sizes,
        "snapshots": [{k: v for k, v in s.items() if k != "hash"} for s in snaps],
        "snapshot_retention": retention_summary(snaps, bounds["last_seq"] or 0),
        "meta": public_meta,
    }
    if ctx.json:
        ctx.emit(out)
        return
    total = sum(sizes.values())
    # One fact per line, so the report fits 80 columns (the path is the caller's own).
    click.echo(f"journal {ctx.label}")
    click.echo(f"  {total / 1e6:.1f} MB: " + ", ".join(f"{k} {v}" for k, v in sizes.items()))
    click.echo(f"  id {public_meta['journal_id']}, format {public_meta['format_version']}")
    click.echo(f"  created {public_meta['created_at']}")
    click.echo(
        f"  {out['events']} events, seq {bounds['first_seq'] or '-'}..{bounds['last_seq'] or '-'}, "
        f"{out['first_time']} .. {out['last_time']}"
    )
    click.echo(f"  request bodies compacted below seq {public_meta['bodies_compacted_before']}")
    if counts:
        click.echo(table([{"type": t, "events": n} for t, n in counts.items()], ("type", "events")))
    if snaps:
        rows = [{**s, "time": fmt_ts(s["ts"])} for s in snaps]
        click.echo(table(rows, ("id", "kind", "upto_seq", "time", "bytes")))
        r = out["snapshot_retention"]
        click.echo(
            f"  {r['count']} snapshots, {r['bytes'] / 1e6:.1f} MB; retention keeps every one within "
            f"{r['recent']:,} events of the head and {r['per_level']} per doubling of age beyond "
            f"(at most {r['max_kept']} at this length)"
        )
    else:
        click.echo("no snapshots")


@command("compact")
@click.option(
    "--before", type=int, required=True, metavar="SEQ", help="Drop request bodies of events with seq < SEQ."
)
def compact(ctx: Ctx, before: int) -> None:
    """Trim the kept request bodies of old control.started events; the chain still verifies."""
    if before < 1:
        raise CliError(f"--before must be >= 1, got {before}", EXIT_BAD_VALUE)
    with ctx.writer() as store:
        count = store.compact_bodies(before)
        mark = store.meta().get("bodies_compacted_before")
    with sqlview.view(ctx.path) as conn:
        kept = len(sqlview.snapshots(conn))
    # Compaction rewrites request bodies only: no projection reads a body, so every snapshot (and
    # what verify and `workers --at` build from them) stays valid. Said, so nobody has to wonder.
    if ctx.json:
        ctx.emit({"compacted": count, "bodies_compacted_before": int(mark or 0), "snapshots_kept": kept})
        return
    click.echo(f"compacted {count} request bodies; bodies are now kept from seq {mark} on")
    click.echo(f"snapshots untouched ({kept} stored): projections never read a request body")


@command("reindex")
def reindex(ctx: Ctx) -> None:
    """Rebuild the derived operation index from the events (or add it to an older journal)."""
    if ctx.url is not None:
        raise CliError(
            "a postgresql:// journal keeps no operation index (each command builds its copy's):"
            " nothing to reindex",
            EXIT_BAD_VALUE,
        )
    if not os.path.isfile(ctx.path):
        open_readonly(ctx.path).close()  # the usual "no journal at PATH" / "is a directory" errors
    try:
        # The rebuild is one write transaction (seconds per million events): a running gateway's
        # appends would wait for it past their lock wait, so refuse while one owns the journal.
        lock = JournalLock.acquire(ctx.path)
    except (JournalLocked, OSError) as exc:
        raise CliError(f"cannot reindex: {exc}; stop the gateway first", EXIT_CHECK) from None
    try:
        t0 = time.perf_counter()
        try:
            with sqlview.view(ctx.path) as conn:
                had_index = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'op_index'"
                ).fetchone()
            # A read-write open refuses what is not a journal untouched and migrates an older one:
            # migration 0003 creates the index and fills it from the events.
            store = SqliteStore.open(ctx.path, busy_timeout_ms=30_000)
        except (JournalError, sqlite3.Error) as exc:
            raise CliError(f"cannot open {ctx.path} for writing: {exc}", EXIT_NOT_JOURNAL) from None
        with store:
            rows = store.rebuild_op_index() if had_index else store.count_op_index()
    finally:
        lock.release()
    what = "rebuilt" if had_index else "created (journal migrated)"
    if ctx.json:
        ctx.emit({"operations": rows, "action": "rebuilt" if had_index else "created"})
        return
    click.echo(f"operation index {what}: {rows} operations in {time.perf_counter() - t0:.2f} s")

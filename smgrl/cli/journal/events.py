"""``smgrl journal events`` (filter, tail) and ``smgrl journal export`` (JSON Lines)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

import click

from journal import SqliteStore
from journal.codec import Recorded, UnknownEvent
from smgrl.cli.journal.group import EXIT_BAD_VALUE, CliError, Ctx, command
from smgrl.cli.journal.remote import follow_gateway
from smgrl.cli.journal.render import EventsLayout, json_text, summarize
from smgrl.core import escape_for_json
from smgrl.history.filters import WorkerFilter, catalogue, expand_types, payload_dict
from smgrl.history.reading import read_events, resolve_worker, worker_filter
from smgrl.history.values import fmt_ts, parse_time, seq_range, time_window

FOLLOW_POLL_SECS = 0.5
LEARN_TYPES = ("control.started", "worker.discovered")


def _type_option(fn):
    return click.option(
        "--type",
        "types",
        multiple=True,
        metavar="TYPE",
        help="Only this event type (repeatable; globs like 'worker.*' or 'control.*').",
    )(fn)


def _range_options(fn):
    fn = click.option("--before", type=int, default=None, metavar="SEQ", help="Only events with seq < SEQ.")(
        fn
    )
    return click.option("--after", type=int, default=None, metavar="SEQ", help="Only events with seq > SEQ.")(
        fn
    )


def type_name(rec: Recorded) -> str:
    ev = rec.event
    return ev.type if isinstance(ev, UnknownEvent) else ev.TYPE


def event_json(rec: Recorded, *, with_hash: bool = False) -> dict:
    ev = rec.event
    out = {
        "seq": rec.seq,
        "ts": rec.ts,
        "time": fmt_ts(rec.ts),
        "stream": rec.stream,
        "type": type_name(rec),
        "schema": ev.schema if isinstance(ev, UnknownEvent) else ev.SCHEMA,
        "payload": payload_dict(rec),
    }
    if with_hash:
        out["hash"] = rec.hash
    return out


def event_row(rec: Recorded) -> dict:
    data = event_json(rec)
    return {**data, "summary": summarize(data["type"], data["payload"])}


class _Scan:
    """One filtered pass over the journal (also the repeated passes of a tail)."""

    def __init__(self, store: SqliteStore, types: list[str] | None, filt: WorkerFilter | None) -> None:
        self.store, self.filt = store, filt
        self.show = None if types is None else frozenset(types)
        self.types = types
        if types is not None and filt is not None:
            # The worker filter learns the worker's operations and DP group from these two.
            self.types = sorted({*types, *LEARN_TYPES})

    def run(self, after: int, **kw) -> Iterator[Recorded]:
        for rec in read_events(self.store, self.types, after=after, **kw):
            type_ = type_name(rec)
            if self.filt is not None:
                p = payload_dict(rec) if rec.stream.startswith(("op:", "worker:")) else None
                if not self.filt.see(rec.stream, type_, p):
                    continue
            if self.show is None or type_ in self.show:
                yield rec


@command("events")
@_type_option
@click.option("--worker", default=None, metavar="ID|URL", help="Only the events of this worker.")
@_range_options
@click.option("--since", default=None, metavar="TIME", help="Only events at or after TIME.")
@click.option("--until", default=None, metavar="TIME", help="Only events before TIME.")
@click.option("--limit", type=click.IntRange(min=1), default=None, metavar="N", help="Stop after N events.")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events (polling) until interrupted.")
# Option declarations shaped like the other commands' (each command its own flag and help).
@click.option(
    "--follow-seconds",
    type=click.FloatRange(min=0),
    default=None,
    metavar="N",
    help="Stop following after N s.",
)
@click.option(
    "--gateway",
    default=None,
    metavar="URL",
    help="With --follow: read a running gateway's journal stream (GET /v1/rl/journal/stream), not the file.",
)
@click.option("--api-key", envvar="SMGRL_API_KEY", default=None, help="With --gateway: a control-plane key.")
def events(
    ctx: Ctx, types, worker, after, before, since, until, limit, follow, follow_seconds, gateway, api_key
) -> None:
    """Events, oldest first, as a table (JSON Lines with --json)."""
    rng = seq_range(after, before)
    since_ts = parse_time(since, ctx.now) if since else None
    until_ts = parse_time(until, ctx.now) if until else None
    time_window(since_ts, until_ts)
    if follow and (before is not None or until is not None):
        raise CliError(
            "--follow reads new events: it cannot be combined with --before or --until", EXIT_BAD_VALUE
        )
    wanted = expand_types(types, catalogue()) if types else None
    if wanted == []:
        raise CliError(f"no event type matches {', '.join(types)}", EXIT_BAD_VALUE)
    if gateway is not None:
        if not follow:
            raise CliError(
                "--gateway follows the live stream: add --follow (or read the file with --journal)"
            )
        if worker is not None or since is not None:
            raise CliError(
                "--gateway takes --type, --after, --limit and --follow-seconds only", EXIT_BAD_VALUE
            )
        _follow_gateway(ctx, gateway, api_key, wanted, after, limit, follow_seconds)
        return
    with ctx.reader() as store:
        head = store.last_seq()
        start = rng.after
        if follow and after is None and since is None:
            start = head  # a tail starts at the end unless told where to start
        filt = worker_filter(store, resolve_worker(store, worker), start) if worker else None
        scan = _Scan(store, wanted, filt)
        printer = _Printer(ctx, head, wanted)
        shown = 0
        for rec in scan.run(start, until_seq=rng.until_seq, since_ts=since_ts, until_ts=until_ts):
            printer.add(rec)
            shown += 1
            if limit is not None and shown >= limit:
                break
        printer.flush()
        if not follow or (limit is not None and shown >= limit):
            return
        _follow(store, scan, printer, max(start, head), limit, shown, follow_seconds)


def _follow(store, scan: _Scan, printer, after: int, limit, shown: int, seconds) -> None:
    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        while deadline is None or time.monotonic() < deadline:  # bounded by --follow-seconds or ^C
            head = store.last_seq()
            for rec in scan.run(after, until_seq=head):
                printer.add(rec)
                shown += 1
                if limit is not None and shown >= limit:
                    printer.flush()
                    return
            printer.flush()
            after = head
            time.sleep(
                FOLLOW_POLL_SECS
                if deadline is None
                else min(FOLLOW_POLL_SECS, max(0.0, deadline - time.monotonic()))
            )
    except KeyboardInterrupt:
        printer.flush()  # ^C ends a tail: that is how it is stopped, not an error


def _follow_gateway(ctx: Ctx, url: str, api_key, wanted, after, limit, seconds) -> None:
    show = None if wanted is None else frozenset(wanted)
    state: dict = {"printer": None, "shown": 0}

    def on_hello(head: int) -> None:
        state["printer"] = _Printer(ctx, head, wanted)

    def on_record(data: dict) -> bool:
        if show is not None and data.get("type") not in show:
            return True
        state["printer"].add_json(data)
        state["printer"].flush()
        state["shown"] += 1
        return limit is None or state["shown"] < limit

    deadline = None if seconds is None else time.monotonic() + seconds
    try:
        follow_gateway(url, api_key, after, on_hello=on_hello, on_record=on_record, deadline=deadline)
    except KeyboardInterrupt:
        pass  # ^C ends a tail: that is how it is stopped, not an error
    finally:
        if state["printer"] is not None:
            state["printer"].flush()


class _Printer:
    """JSON Lines as events arrive; a table printed in chunks whose column widths are fixed
    before the first row (from the journal's head seq and the event types that can show), so
    they never change partway, also while following."""

    CHUNK = 200

    def __init__(self, ctx: Ctx, head: int, types: list[str] | None) -> None:
        self.ctx = ctx
        self.rows: list[dict] = []
        self.header = True
        self.layout = EventsLayout(head, types or catalogue())

    def add(self, rec: Recorded) -> None:
        if self.ctx.json:
            click.echo(json_text(event_json(rec), lines=True))
            return
        self.rows.append(event_row(rec))
        if len(self.rows) >= self.CHUNK:
            self.flush()

    def add_json(self, data: dict) -> None:
        """A record as the gateway's journal routes show it (``seq``, ``ts``, ``stream``,
        ``type``, ``schema``, ``payload``)."""
        data = {**data, "time": fmt_ts(data["ts"])} if data.get("ts") is not None else dict(data)
        if self.ctx.json:
            click.echo(json_text(data, lines=True))
            return
        data.setdefault("time", "")
        self.rows.append({**data, "summary": summarize(data["type"], data.get("payload") or {})})
        if len(self.rows) >= self.CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            click.echo(self.layout.render(self.rows, header=self.header))
            self.header = False
            self.rows = []
        sys.stdout.flush()


@command("export")
@_type_option
@_range_options
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None, help="Write to FILE."
)
def export(ctx: Ctx, types, after, before, output) -> None:
    """Every event as JSON Lines (seq, ts, stream, type, schema, payload, hash). Never the secrets."""
    ctx.json = True  # JSON Lines whatever the flags: the terminal guard must keep it valid JSON
    rng = seq_range(after, before)
    wanted = expand_types(types, catalogue()) if types else None
    with ctx.reader() as store:
        out = open(output, "w", encoding="utf-8") if output else None  # noqa: SIM115 - closed below
        try:
            count = 0
            for rec in read_events(store, wanted, after=rng.after, until_seq=rng.until_seq):
                # Also in a file: C1 and separators as \uXXXX (same JSON), so `cat` is safe too.
                line = escape_for_json(json_text(event_json(rec, with_hash=True), lines=True))
                if out is not None:
                    out.write(line + "\n")
                else:
                    click.echo(line)
                count += 1
        finally:
            if out is not None:
                out.close()
    if output:
        click.echo(f"exported {count} events to {output}", err=True)

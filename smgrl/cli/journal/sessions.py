"""``smgrl journal sessions [SESSION_ID]``: agent sessions, and one session's turns traced to the
weight change (refit operation) that loaded the weights each turn was produced with."""

from __future__ import annotations

from typing import Any

import click

from smgrl.cli.journal.group import Ctx, command
from smgrl.cli.journal.render import table
from smgrl.core import strip_rank
from smgrl.events import decode
from smgrl.history.queries import version_changes
from smgrl.history.replay import read_types
from smgrl.history.values import fmt_ts

SESSION_TYPES = (
    "session.created",
    "session.turn",
    "session.hung",
    "session.continued",
    "session.deleted",
    "session.ended",
)


def fold_sessions(events) -> dict[str, dict[str, Any]]:
    """session id -> summary (state, turns, tokens, versions) from ``(seq, ts, event)``."""
    out: dict[str, dict[str, Any]] = {}
    for seq, ts, ev in events:
        sid = getattr(ev, "session_id", None)
        if sid is None:
            continue
        kind = ev.TYPE
        if kind == "session.created":
            out[sid] = {
                "session_id": sid,
                "seq": seq,
                "created": fmt_ts(ts),
                "api": ev.api,
                "owner": ev.owner,
                "state": "open",
                "turns": 0,
                "tokens": 0,
                "versions": [],
                "turn_list": [],
            }
            continue
        s = out.get(sid)
        if s is None:
            continue
        if kind == "session.turn":
            s["turns"] += 1
            s["tokens"] = max(s["tokens"], ev.prompt_tokens + ev.output_tokens)
            if ev.weight_version is not None and ev.weight_version not in s["versions"]:
                s["versions"].append(ev.weight_version)
            s["turn_list"].append({"seq": seq, "ts": ts, "event": ev})
        elif kind == "session.deleted":
            s["state"] = "deleted"
        elif kind == "session.ended":
            s["state"] = f"ended ({ev.reason})"
        elif kind == "session.hung" and s["state"] == "open":
            s["state"] = "open (hung)"
        elif kind == "session.continued" and s["state"] == "open (hung)":
            s["state"] = "open"
    return out


def refit_of(changes: list, engine_url: str | None, version: str | None, before_seq: int):
    """The last version change (``smgrl.state.version_timeline.Change``) of the turn's engine to
    the turn's version before the turn."""
    if engine_url is None or version is None:
        return None
    base = strip_rank(engine_url)
    found = None
    for change in changes:
        if change.seq >= before_seq:
            break
        if base in change.engines and change.weight_version == version:
            found = change
    return found


@command("sessions")
@click.argument("session_id", required=False)
def sessions(ctx: Ctx, session_id: str | None) -> None:
    """Agent sessions (state, turns, versions); with SESSION_ID its turns and the refit behind each."""
    with ctx.reader() as store:
        rows = [(seq, ts, decode(t, sc, p)) for seq, ts, _s, t, sc, p in read_types(store, SESSION_TYPES)]
        folded = fold_sessions(rows)
        if session_id is None:
            out = [{k: v for k, v in s.items() if k != "turn_list"} for s in folded.values()]
            if ctx.json:
                ctx.emit({"sessions": out})
                return
            if not out:
                click.echo("no sessions recorded")
                return
            for r in out:
                r["versions"] = ", ".join(r["versions"]) or "-"
            click.echo(
                table(out, ("seq", "created", "session_id", "api", "state", "turns", "tokens", "versions"))
            )
            return
        s = folded.get(session_id)
        if s is None:
            raise click.ClickException(f"no session {session_id!r} in the journal")
        last = s["turn_list"][-1]["seq"] if s["turn_list"] else 0
        changes = []
        for change, _via in version_changes(ctx.path):
            if change.seq >= last:
                break
            changes.append(change)
    turns = []
    for t in s["turn_list"]:
        ev = t["event"]
        change = refit_of(changes, ev.engine_url, ev.weight_version, t["seq"])
        turns.append(
            {
                "seq": t["seq"],
                "time": fmt_ts(t["ts"]),
                "turn": ev.turn,
                "trajectory": ev.trajectory_id,
                "prompt": ev.prompt_tokens,
                "output": ev.output_tokens,
                "reused": ev.reused_tokens,
                "prefix": ev.prefix,
                "version": ev.weight_version or "-",
                "engine": ev.engine_url or "-",
                "refit_seq": change.seq if change else None,
                "refit_op": change.op_id if change else None,
            }
        )
    if ctx.json:
        ctx.emit({"session": {k: v for k, v in s.items() if k != "turn_list"}, "turns": turns})
        return
    click.echo(f"session {session_id}: {s['state']}, {s['turns']} turns, created {s['created']}")
    if turns:
        cols = (
            "seq",
            "time",
            "turn",
            "trajectory",
            "prompt",
            "output",
            "reused",
            "prefix",
            "version",
            "engine",
            "refit_seq",
            "refit_op",
        )
        click.echo(table(turns, cols))

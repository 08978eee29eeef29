"""The demo: what a trainer's refit looks like through smgrl, end to end, with real processes.

1. start N fake SGLang engines (one process) and the gateway (``--enable-rl``, a journal file);
2. show the fleet and what one engine generates;
3. refit through ``smgrl.rl``: ``paused()`` fans out ``pause_generation``, then
   ``update_weights_from_disk`` with a new checkpoint and ``weight_version``, then
   ``continue_generation``;
4. show the fleet and the generation again (new version, new text);
5. print what the journal recorded, stop everything it started (by PID), exit 0.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import click

from smgrl.cli.journal.render import Abbrev
from smgrl.demo.procs import free_port, start_fake_engines, start_gateway, wait_for_workers
from smgrl.fake.checkpoint import make_checkpoint
from smgrl.rl import RL, paused

PROMPT = "The capital of France is"


def say(text: str = "", **style) -> None:
    click.secho(text, **style)


def say_wrapped(text: str) -> None:
    """An indented line, wrapped at 78 columns (long words, such as URLs, are never broken)."""
    say(textwrap.fill(text, 78, initial_indent="  ", subsequent_indent="    ", break_long_words=False))


def short(abbrev: Abbrev, value: str) -> str:
    """``value`` cut as ``smgrl journal`` cuts ids (``abbrev`` has seen it, and every id of its
    kind the demo shows)."""
    abbrev.add([value])
    return abbrev.text(value.lower())


class Ids:
    """The demo's ids, cut as ``smgrl journal`` cuts them: the shortest prefix that tells them
    apart, at least 8 characters, so an id copied from the demo works in its commands. Worker ids
    and operation ids are cut apart, each kind to one length: every worker id is known at the
    first fleet table and every operation id at the journal's table, so each table's length is
    final when it is printed (one shared length would grow after the worker tables were printed,
    when the operations came, and leave two lengths on the screen). A command takes a prefix of
    one kind only (``--worker``, ``ops show``), so the two never need telling apart."""

    def __init__(self) -> None:
        self.workers = Abbrev()
        self.ops = Abbrev()


def rows_text(headers: list[str], rows: list[list[str]], indent: int = 2) -> list[str]:
    """Columns as wide as their widest cell, two spaces apart; nothing is cut."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]
    out = []
    for row in [headers, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(row, widths, strict=True)]
        out.append((" " * indent + "  ".join(cells)).rstrip())
    return out


def fleet_table(rl: RL, ids: Ids) -> None:
    rows = rl.workers()
    ids.workers.add(w.id for w in rows)
    cells = [
        [
            short(ids.workers, w.id),
            w.engine,
            str(w.weight_version),
            str((getattr(w, "extra", {}) or {}).get("control", "-")),
            w.url,
        ]
        for w in rows
    ]
    for line in rows_text(["worker", "engine", "weight_version", "control", "url"], cells):
        say(line)


def generate(rl: RL, worker_id: str) -> tuple[str, str]:
    res = rl.call(worker_id, "generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 8}})
    body = res.body if isinstance(res.body, dict) else {}
    return str(body.get("text", "")).strip(), str(body.get("meta_info", {}).get("weight_version"))


def run_demo(engines: int, journal: str, keep_journal: bool) -> int:
    return _in_workdir("smgrl-demo-", lambda work: _run_demo(work, engines, journal, keep_journal))


def _in_workdir(prefix: str, run: Callable[[str], int]) -> int:
    """Run ``run(work)`` in a fresh temporary directory (the checkpoint and the gateway's log):
    removed when it returns 0, kept (and named) when it fails or is interrupted, for a look at
    gateway.log."""
    work = tempfile.mkdtemp(prefix=prefix)
    code = 1
    try:
        code = run(work)
    except (RuntimeError, TimeoutError, OSError) as exc:
        # A child that would not start (its log is in the kept directory): one line, exit 1.
        say(f"demo FAILED: {exc}", fg="red")
    finally:
        if code == 0:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"  kept {work} (the gateway's log is {os.path.join(work, 'gateway.log')})")
    return code


def _run_demo(work: str, engines: int, journal: str, keep_journal: bool) -> int:
    new_ckpt = make_checkpoint(os.path.join(work, "ckpt-step-1"), "demo/Qwen3-0.6B-step-1")
    children = []
    log = open(os.path.join(work, "gateway.log"), "w")  # noqa: SIM115 - the gateway child writes it; closed in finally
    try:
        say(f"[1/5] starting {engines} fake SGLang engines and the gateway", bold=True)
        fakes, urls = start_fake_engines("sglang", engines)
        children.append(fakes)
        ports = ", ".join(u.rsplit(":", 1)[-1] for u in urls)
        say(
            textwrap.fill(
                f"engines: 127.0.0.1, ports {ports} (pid {fakes.pid})",
                78,
                initial_indent="  ",
                subsequent_indent="    ",
            )
        )
        port, prom = free_port(), free_port()
        if os.path.exists(journal) and not keep_journal:
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(journal + suffix):
                    os.remove(journal + suffix)
        gateway_proc = start_gateway(
            [
                "--enable-rl",
                "--worker-urls",
                *urls,
                "--journal",
                journal,
                "--prometheus-port",
                str(prom),
                "--disable-health-check",
            ],
            port=port,
            log=log,
        )
        children.append(gateway_proc)
        base = f"http://127.0.0.1:{port}"
        wait_for_workers(base, engines, child=gateway_proc)
        say_wrapped(f"gateway: {base} (pid {gateway_proc.pid}), journal {journal}")
        rl = RL(base, timeout=60)

        say("[2/5] before the refit", bold=True)
        ids = Ids()
        fleet_table(rl, ids)
        first = rl.workers()[0].id
        text, version = generate(rl, first)
        say_wrapped(f"generate on {short(ids.workers, first)}: weight_version={version!r} text={text!r}")

        say("[3/5] refit: pause -> update_weights_from_disk -> continue (through smgrl.rl)", bold=True)
        t0 = time.monotonic()
        with paused(rl, "engine=sglang") as pause:
            say(f"  paused {pause.succeeded}/{pause.total} engines")
            upd = rl.fanout(
                "update_weights_from_disk",
                {"model_path": str(new_ckpt), "weight_version": "step-1", "flush_cache": True},
                selector="engine=sglang",
            )
            say(f"  update_weights_from_disk: {upd.succeeded}/{upd.total} succeeded")
        say(f"  resumed; refit took {(time.monotonic() - t0) * 1000:.0f} ms")

        say("[4/5] after the refit", bold=True)
        fleet_table(rl, ids)
        new_text, new_version = generate(rl, first)
        say_wrapped(
            f"generate on {short(ids.workers, first)}: weight_version={new_version!r} text={new_text!r}"
        )
        ok = new_version == "step-1" and new_text != text

        say("[5/5] what the journal recorded", bold=True)
        gateway_proc.stop()
        children.remove(gateway_proc)
        summarize_journal(journal, ids)
        next_commands(journal)
        if ok:
            say("demo passed: every engine serves step-1, and the journal has the whole refit", fg="green")
            return 0
        say(f"demo FAILED: expected weight_version 'step-1' and new text, got {new_version!r}", fg="red")
        return 1
    finally:
        for child in reversed(children):
            child.stop()
        log.close()


def summarize_journal(path: str, ids: Ids | None = None) -> None:
    from journal import SqliteStore

    ids = ids or Ids()
    with SqliteStore.open(path, readonly=True) as store:
        kinds: Counter = Counter()
        ops = []
        for rec in store.read():
            kinds[rec.event.TYPE if hasattr(rec.event, "TYPE") else rec.event.type] += 1
            if getattr(rec.event, "TYPE", "") == "control.finished":
                ops.append(rec.event)
        say(f"  {store.count()} events; chain {'verified' if store.verify().ok else 'BROKEN'}")
        for line in rows_text(["event", "count"], [[k, str(n)] for k, n in sorted(kinds.items())], indent=4):
            say(line)
        starts = {rec.event.op_id: rec.event for rec in store.read(types=["control.started"])}
        ids.ops.add(f.op_id for f in ops)
        cells = []
        for f in ops:
            s = starts.get(f.op_id)
            request = f"{s.method} {s.path}" if s else "?"
            selector = (s.selector if s else None) or "-"
            cells.append(
                [
                    short(ids.ops, f.op_id),
                    request,
                    selector,
                    f"{f.result} {f.succeeded}/{f.total}",
                    str(f.latency_ms),
                ]
            )
        say("  operations:")
        for line in rows_text(["op", "request", "selector", "result", "ms"], cells, indent=4):
            say(line)


def next_commands(journal: str) -> None:
    """Commands to look closer, one per line, whole (copy and paste them)."""
    say("  look closer (the gateway has stopped; the journal stays):")
    for args in (["refits"], ["ops"], ["workers"], ["verify"]):
        say("    " + shlex.join(["smgrl", "journal", "--journal", journal, *args]))


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "async_rl_loop.py"


def run_rollouts(engines: int, journal: str, keep_journal: bool, clients: int) -> int:
    """``--rollouts``: examples/async_rl_loop.py against fake engines that generate at a
    realistic pace: rollouts stream through the gateway while the trainer refits."""
    if not EXAMPLE.exists():
        say(f"--rollouts needs the repository's examples/ ({EXAMPLE} not found)", fg="red")
        return 1
    return _in_workdir(
        "smgrl-demo-rollouts-", lambda work: _run_rollouts(work, engines, journal, keep_journal, clients)
    )


def _run_rollouts(work: str, engines: int, journal: str, keep_journal: bool, clients: int) -> int:
    children = []
    log = open(os.path.join(work, "gateway.log"), "w")  # noqa: SIM115 - the gateway child writes it; closed in finally
    try:
        say(f"[1/3] starting {engines} fake SGLang engines (5 ms per token) and the gateway", bold=True)
        fakes, urls = start_fake_engines("sglang", engines, ["--token-latency-ms", "5"])
        children.append(fakes)
        if os.path.exists(journal) and not keep_journal:
            for suffix in ("", "-wal", "-shm"):
                if os.path.exists(journal + suffix):
                    os.remove(journal + suffix)
        port = free_port()
        args = ["--enable-rl", "--worker-urls", *urls, "--journal", journal]
        args += ["--prometheus-port", str(free_port()), "--disable-health-check"]
        gateway_proc = start_gateway(args, port=port, log=log)
        children.append(gateway_proc)
        base = f"http://127.0.0.1:{port}"
        wait_for_workers(base, engines, child=gateway_proc)
        say_wrapped(f"gateway: {base} (pid {gateway_proc.pid}), journal {journal}")
        say("[2/3] rollouts stream through smgrl while the trainer refits every 2 s", bold=True)
        code = subprocess.run(
            [sys.executable, str(EXAMPLE), "--gateway", base, "--clients", str(clients)],
            check=False,
            timeout=600,
        ).returncode
        say("[3/3] what the journal recorded", bold=True)
        gateway_proc.stop()
        children.remove(gateway_proc)
        summarize_journal(journal)
        next_commands(journal)
        if code == 0:
            say(
                "demo passed: rollouts never failed and every sample names the weights that made it",
                fg="green",
            )
        else:
            say("demo FAILED (see above)", fg="red")
        return code
    finally:
        for child in reversed(children):
            child.stop()
        log.close()


@click.command("demo")
@click.option(
    "--engines",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="How many fake SGLang engines.",
)
@click.option(
    "--journal",
    default="./smgrl-demo-journal.db",
    show_default=True,
    help="The journal file the demo's gateway writes (replaced at start).",
)
@click.option("--keep-journal", is_flag=True, help="Append to an existing journal instead of replacing it.")
@click.option(
    "--rollouts",
    is_flag=True,
    help="Run examples/async_rl_loop.py: rollouts stream through smgrl while the trainer refits.",
)
@click.option(
    "--clients", default=32, show_default=True, type=click.IntRange(1, 1024), help="With --rollouts."
)
def demo(engines: int, journal: str, keep_journal: bool, rollouts: bool, clients: int) -> None:
    """Start fake engines and the gateway, refit the fleet, show the journal; exit 0 on success."""
    if rollouts:
        sys.exit(run_rollouts(engines, journal, keep_journal, clients))
    sys.exit(run_demo(engines, journal, keep_journal))

"""Journal benchmarks: append throughput (group commit vs a transaction per event) and replay.

    .venv/bin/python benchmarks/journal.py                       # 100k and 1M events replayed
    .venv/bin/python benchmarks/journal.py --events 100000 --append-events 50000
    .venv/bin/python benchmarks/journal.py --skip-appends --launch  # journal at scale, real launch too

(a) Appends. Many trio tasks call ``await JournalWriter.append`` concurrently (each waits for its
    own durable commit, as a request handler does); the writer batches them. Also one task
    ``append_nowait``-ing everything then ``flush``. For comparison: one transaction per event
    (what a naive store does), and raw ``append_batch`` of 1000 events without trio (the
    ceiling). Both synchronous=NORMAL (default) and FULL.
(b) Replay. A realistic journal (fan-outs over 8 engines: control.started / 8 x control.outcome /
    control.finished / audit, plus worker.* churn) is generated, then read raw, read + decoded,
    folded with ``replay(store, fold)`` (a trivial fold today; the registry projection goes there),
    read with a type filter (what a registry projection needs), and verified. The fan-outs
    rotate through pause_generation / update_weights_from_disk (with a weight version) /
    continue_generation, with their recorded intents, so they form refit cycles.
(d) With --history SIZES: journals written through the store in batches with the
    gateway's snapshot cadence (``generate_with_snapshots``), then `workers --at` (middle and near the head, each
    just below a snapshot: the worst case), `versions`, `refits --all`, `events --type 'worker.*'`
    and `ops --all` run as real commands, three times each: wall time, CPU time and peak RSS.
(c) On the same journals: the registry projection alone; `smgrl journal refits` (the
    whole journal grouped in process; the command for the last 50 cycles and for --all);
    gateway startup (open, restore the projections, load the keys) without a snapshot and with
    one SNAPSHOT_EVERY (25,000) events behind the head (how often the gateway snapshots: the worst
    case), and what taking that snapshot costs; with --launch, a real `smgrl launch` until
    /liveness answers.

Every database lives in a temporary directory that is deleted at the end. Runtime is bounded by
the sizes given (a few minutes for the defaults on a 2-core machine).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import trio

# Run as a script, this file's directory comes first on sys.path, and this file is named
# journal.py: it would shadow the journal package. Put the checkout first and drop this directory.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from journal import Append, ControlStarted, EventStore, JournalWriter, Recorded, SqliteStore
from smgrl.events import (
    AuditControlPlane,
    ControlFinished,
    ControlOutcome,
    SnapshotTaken,
    WorkerDiscovered,
    WorkerHealthChanged,
    WorkerProbeFailed,
    WorkerRegistered,
)

S = TypeVar("S")

ENGINES = 8
WORKER_TYPES = ["worker.registered", "worker.discovered", "worker.probe_failed", "worker.health_changed"]


# -- the replay entry point (the lead plugs the registry projection's fold in here) ---------------


def replay(store: EventStore, fold: Callable[[S, Recorded], S], state: S, *, after_seq: int = 0) -> S:
    """Fold every event after ``after_seq`` into ``state``, in seq order."""
    for rec in store.read(after_seq):
        state = fold(state, rec)
    return state


def count_types(state: collections.Counter[str], rec: Recorded) -> collections.Counter[str]:
    """The trivial fold: count events per type (UnknownEvents included)."""
    state[getattr(rec.event, "TYPE", "unknown")] += 1
    return state


# -- a realistic journal ---------------------------------------------------------------------------


def _body(op: int) -> bytes:
    return f'{{"model_path": "/ckpt/step-{op}", "load_format": "auto", "flush_cache": true}}'.encode()


# Operations rotate through a refit cycle (pause, update from disk with a weight version, resume)
# so that `smgrl journal refits` and the engine projection have real work; the event shapes and
# sizes are those of the journal's first benchmark mix (every op carries the same body).
REFIT = ("pause_generation", "update_weights_from_disk", "continue_generation")


def _intent(path: str, op: int) -> dict[str, str | None]:
    phase = {"pause_generation": "pause", "continue_generation": "resume"}.get(path, "update")
    control = {"pause_generation": "paused", "continue_generation": "active"}.get(path)
    version = f"step-{op // 3}" if phase == "update" else None
    return {"version": version, "control": control, "phase": phase}


def realistic(n: int) -> Iterator[Append]:
    """About n appends: fan-outs to 8 engines, plus a worker registration every 40 operations."""
    made, op = 0, 0
    while made < n:
        op += 1
        batch: list[Append] = []
        if op % 40 == 1:
            wid = f"w{op}"
            stream = f"worker:{wid}"  # the gateway's streams (docs/journal.md#streams)
            batch += [
                Append(
                    stream,
                    WorkerRegistered(
                        worker_id=wid,
                        url=f"http://10.0.0.{op % 250}:30000",
                        base_url=f"http://10.0.0.{op % 250}:30000",
                        source="api",
                        labels={"pool": "rollout", "zone": "a"},
                        has_api_key=True,
                    ),
                    {wid: f"key-{op}"},
                ),
                Append(
                    stream,
                    WorkerProbeFailed(worker_id=wid, attempt=1, error="connect refused", next_retry_s=0.5),
                ),
                Append(
                    stream,
                    WorkerDiscovered(
                        worker_id=wid, runtime="sglang", labels={"tp": "2"}, model_id="qwen3-8b"
                    ),
                ),
                Append(stream, WorkerHealthChanged(worker_id=wid, health="healthy", reason="probe ok")),
            ]
        op_id = f"op-{op:08d}"
        targets = [
            {"worker_id": f"w{i}", "url": f"http://10.0.0.{i}:30000", "control_url": None}
            for i in range(ENGINES)
        ]
        batch.append(
            Append(
                f"op:{op_id}",
                ControlStarted(
                    op_id=op_id,
                    kind="fanout",
                    method="POST",
                    path=REFIT[op % 3],
                    selector="pool=rollout",
                    intent=_intent(REFIT[op % 3], op),
                    targets=targets,
                    content_type="application/json",
                    principal="trainer",
                    request_id=f"req-{op}",
                    **ControlStarted.body_fields(_body(op)),
                ),
            )
        )
        batch += [
            Append(
                f"op:{op_id}",
                ControlOutcome(
                    op_id=op_id,
                    worker_id=f"w{i}",
                    url=f"http://10.0.0.{i}:30000",
                    status=200,
                    latency_ms=40 + i,
                    excerpt='{"success":true,"message":"Succeeded to update model weights."}',
                ),
            )
            for i in range(ENGINES)
        ]
        batch.append(
            Append(
                f"op:{op_id}",
                ControlFinished(
                    op_id=op_id,
                    result="ok",
                    http_status=200,
                    total=ENGINES,
                    succeeded=ENGINES,
                    failed=0,
                    latency_ms=52,
                ),
            )
        )
        batch.append(
            Append(
                "audit",
                AuditControlPlane(
                    principal="trainer",
                    auth_method="bearer",
                    role="admin",
                    method="POST",
                    path="/v1/rl/update_weights_from_disk",
                    outcome="success",
                    status=200,
                    request_id=f"req-{op}",
                ),
            )
        )
        yield from batch[: n - made]
        made += len(batch)


def _outcome(i: int) -> ControlOutcome:
    return ControlOutcome(
        op_id=f"op-{i // ENGINES}",
        worker_id=f"w{i % ENGINES}",
        url=f"http://10.0.0.{i % ENGINES}:30000",
        status=200,
        latency_ms=41,
        excerpt='{"success":true}',
    )


def generate_with_snapshots(
    path: Path, n: int, *, snapshot_every: int | None = None, batch: int = 5000
) -> int:
    """Write ``realistic(n)`` straight through the store in batches, taking a fleet snapshot (and
    its ``snapshot.taken`` marker) every ``snapshot_every`` events as the gateway does, with the
    store's retention policy thinning older ones. Returns the number of snapshots taken.

    The fold runs on the events as appended (no decode), so 5M events take minutes, not hours.
    """
    from smgrl.runtime.snapshots import SNAPSHOT_EVERY
    from smgrl.state import snapshot
    from smgrl.state.fleet import FleetState

    if snapshot_every is None:
        snapshot_every = SNAPSHOT_EVERY  # the gateway's cadence
    store = SqliteStore.open(path)
    fleet = FleetState()
    last_snap, taken = 0, 0
    chunk: list[Append] = []

    def flush() -> None:
        nonlocal last_snap, taken
        recorded = store.append_batch(chunk)
        fleet.apply_records(recorded)
        chunk.clear()
        if snapshot_every and fleet.last_seq - last_snap >= snapshot_every:
            store.save_snapshot(snapshot.KIND, fleet.last_seq, snapshot.to_json(fleet))
            last_snap = fleet.last_seq
            taken += 1
            marker = Append("gateway", SnapshotTaken(kind=snapshot.KIND, upto_seq=fleet.last_seq))
            fleet.apply_records(store.append_batch([marker]))

    # Batches end at snapshot points so snapshots land where the gateway's would (every N events).
    for item in realistic(n):
        chunk.append(item)
        due = snapshot_every and fleet.last_seq + len(chunk) - last_snap >= snapshot_every
        if len(chunk) >= batch or due:
            flush()
            if fleet.last_seq // 4096 != (fleet.last_seq - batch) // 4096:
                store.checkpoint()  # as the gateway's writer does (every 4,096 events)
    if chunk:
        flush()
    store.checkpoint()
    store.close()
    return taken


# -- measurements ----------------------------------------------------------------------------------


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


class Counting:
    """Counts transactions (append_batch calls) on the way to a store."""

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.transactions = 0

    def append_batch(self, items: Any, *, wait: float | None = None) -> list[Recorded]:
        self.transactions += 1
        return self.inner.append_batch(items, wait=wait)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def bench_writer(
    path: Path, n: int, appenders: int, synchronous: str, *, nowait: bool = False
) -> tuple[float, float]:
    """events/s through JournalWriter, and the mean events per transaction.

    ``appenders`` tasks each ``await writer.append(...)`` one event at a time (a request handler's
    pattern), or with ``nowait`` one task ``append_nowait``s everything and flushes at the end.
    """
    store = Counting(SqliteStore.open(path, synchronous=synchronous))
    writer = JournalWriter(store)  # type: ignore[arg-type]
    per_task = n // appenders
    total = per_task * appenders
    events = [_outcome(i) for i in range(total)]

    async def appender(k: int) -> None:
        for i in range(k * per_task, (k + 1) * per_task):
            await writer.append("control", events[i])

    async def producer() -> None:
        for i, event in enumerate(events):
            writer.append_nowait("control", event)
            if i % 1000 == 999:
                await trio.lowlevel.checkpoint()  # let the writer task take what is queued
        await writer.flush()

    async def main() -> float:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            t0 = time.perf_counter()
            if nowait:
                await producer()
            else:
                async with trio.open_nursery() as tasks:
                    for k in range(appenders):
                        tasks.start_soon(appender, k)
            elapsed = time.perf_counter() - t0
            await writer.aclose()
        return elapsed

    elapsed = trio.run(main)
    assert store.inner.count() == total
    assert store.inner.verify().ok
    store.inner.close()
    path.unlink()
    return total / elapsed, total / store.transactions


def bench_per_event(path: Path, n: int, synchronous: str) -> float:
    store = SqliteStore.open(path, synchronous=synchronous)
    items = [Append("control", _outcome(i)) for i in range(n)]
    _, elapsed = _timed(lambda: [store.append_batch([item]) for item in items])
    store.close()
    return n / elapsed


def bench_raw_batches(path: Path, n: int, synchronous: str) -> float:
    store = SqliteStore.open(path, synchronous=synchronous)
    items = [Append("control", _outcome(i)) for i in range(n)]
    _, elapsed = _timed(lambda: [store.append_batch(items[i : i + 1000]) for i in range(0, n, 1000)])
    store.close()
    return n / elapsed


def generate(path: Path, n: int) -> float:
    """Write a journal of n realistic events in batches of 5,000; the seconds it took."""
    store = SqliteStore.open(path)
    gen_t0 = time.perf_counter()
    chunk: list[Append] = []
    for item in realistic(n):
        chunk.append(item)
        if len(chunk) == 5000:
            store.append_batch(chunk)
            chunk = []
    if chunk:
        store.append_batch(chunk)
    elapsed = time.perf_counter() - gen_t0
    store.close()
    return elapsed


def bench_replay(path: Path, n: int) -> list[tuple[str, float, int]]:
    """(what, seconds, events) rows for a journal of n realistic events."""
    rows = [("generate (append_batch x5000)", generate(path, n), n)]

    reader = SqliteStore.open(path, readonly=True)
    _, t = _timed(lambda: sum(1 for _ in reader.read_raw()))
    rows.append(("read_raw (no decode)", t, n))
    _, t = _timed(lambda: sum(1 for _ in reader.read()))
    rows.append(("read + decode", t, n))
    counts, t = _timed(lambda: replay(reader, count_types, collections.Counter()))
    assert sum(counts.values()) == n, counts
    rows.append(("replay(store, count_types)", t, n))
    worker_events, t = _timed(lambda: sum(1 for _ in reader.read(types=WORKER_TYPES)))
    rows.append((f"read worker.* only ({worker_events} events)", t, n))
    report, t = _timed(reader.verify)
    assert report.ok, report
    rows.append(("verify (hash chain)", t, n))
    reader.close()
    return rows


# -- journal at scale: startup from snapshots, `smgrl journal refits`, the registry projection alone ---------

# The gateway snapshots every SNAPSHOT_EVERY events (smgrl/runtime/snapshots.py): the worst case it
# starts from is a snapshot that far behind the head.
from smgrl.runtime.snapshots import SNAPSHOT_EVERY as SNAPSHOT_LAG


def _startup(path: Path, *, checked: bool = True) -> tuple[float, Any]:
    """What `smgrl launch` does before it listens: take the ownership lock, open the journal (its
    identity checks), check the hash chain of what is replayed and restore the projections in one
    pass (``restore_verified``), load the worker keys. In process (interpreter start and imports
    are measured separately). ``checked=False``: the previous startup (``restore``, no chain
    check), for comparison on the same machine at the same time."""
    from journal import JournalLock
    from smgrl.history.replay import restore, restore_verified
    from smgrl.registry.keys import KeyRing

    t0 = time.perf_counter()
    with JournalLock.acquire(str(path)):
        store = SqliteStore.open(path)
        _fleet, info = restore_verified(store) if checked else restore(store)
        KeyRing(store.secrets())
        elapsed = time.perf_counter() - t0
        store.close()
    return elapsed, info


def _chain_check(path: Path, after: int) -> float:
    """The startup chain check alone: the rows after the snapshot."""
    store = SqliteStore.open(path, readonly=True)
    t0 = time.perf_counter()
    report = store.verify(after=after)
    elapsed = time.perf_counter() - t0
    assert report.ok, report
    store.close()
    return elapsed


def _save_snapshot(path: Path, lag: int) -> tuple[int, str, str]:
    """Store a fleet snapshot ``lag`` events behind the head, as the gateway's snapshotter does;
    (its seq, its description, what taking it cost)."""
    from smgrl.history.replay import replay as fleet_replay
    from smgrl.state import snapshot
    from smgrl.state.fleet import FleetState

    store = SqliteStore.open(path)
    upto = max(1, store.last_seq() - lag)
    fleet = FleetState()
    fleet_replay(store, fleet, 0, until_seq=upto)
    t0 = time.perf_counter()
    cap = snapshot.capture(fleet)
    capture_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    text = snapshot.dumps(cap)
    dumps_ms = (time.perf_counter() - t0) * 1000
    store.save_snapshot(snapshot.KIND, upto, text)
    store.close()
    what = f"snapshot of {len(fleet.registry):,} workers, {len(fleet.facts()):,} engines"
    cost = (
        f"capture {capture_ms:.1f} ms (event loop) + encode {dumps_ms:.1f} ms (writer thread), "
        f"{len(text) / 1e6:.2f} MB"
    )
    return upto, what, cost


def bench_startup(path: Path, n: int) -> list[tuple[str, str]]:
    rows = []
    elapsed, info = _startup(path)
    rows.append(
        (f"startup, no snapshot (checks the whole chain, folds {info.replayed:,} events)", f"{elapsed:.2f} s")
    )
    # The previous worst case (a snapshot every 50,000 events) first, then today's: the newest
    # snapshot is the one restored. Best of 3, checked and unchecked interleaved: the machine's
    # load changes from one second to the next.
    for lag in sorted({50_000, SNAPSHOT_LAG}, reverse=True):
        upto, what, cost = _save_snapshot(path, lag)
        if lag == SNAPSHOT_LAG:
            rows.append((what, cost))
        unchecked, checked = [], []
        for _ in range(3):
            unchecked.append(_startup(path, checked=False)[0])
            checked.append(_startup(path))
        elapsed, info = min(checked, key=lambda r: r[0])
        assert info.snapshot_seq == upto, info
        rows.append(
            (
                f"startup, snapshot {lag:,} events behind, unchecked (`restore`, before startup checked the chain)",
                f"{min(unchecked):.2f} s",
            )
        )
        rows.append(
            (
                f"startup, snapshot {lag:,} events behind, chain checked (`restore_verified`, folds {info.replayed:,})",
                f"{elapsed:.2f} s",
            )
        )
        rows.append(
            (
                f"the chain check alone of the {lag:,} rows after the snapshot",
                f"{_chain_check(path, upto):.2f} s",
            )
        )
    return rows


def bench_refits(path: Path) -> list[tuple[str, str]]:
    import subprocess

    from smgrl.history.reading import load_ops
    from smgrl.state.refits import group_cycles

    store = SqliteStore.open(path, readonly=True)
    t0 = time.perf_counter()
    cycles = group_cycles(load_ops(store).in_order())
    elapsed = time.perf_counter() - t0
    store.close()
    rows = [(f"refit grouping of the whole journal, in process ({len(cycles):,} cycles)", f"{elapsed:.2f} s")]
    for args, what in ((["refits"], "last 50 cycles, the default"), (["refits", "--all"], "every cycle")):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "smgrl", "journal", "--journal", str(path), *args],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        rows.append(
            (f"`smgrl journal {' '.join(args)}` as a command ({what})", f"{time.perf_counter() - t0:.2f} s")
        )
    return rows


def bench_registry(path: Path) -> list[tuple[str, str]]:
    from smgrl.events import decode
    from smgrl.history.replay import read_types
    from smgrl.state import registry

    store = SqliteStore.open(path, readonly=True)
    t0 = time.perf_counter()
    state = registry.RegistryState()
    count = 0
    for seq, _ts, _stream, type_, schema, payload in read_types(store, registry.TYPES):
        state.apply(seq, decode(type_, schema, payload))
        count += 1
    elapsed = time.perf_counter() - t0
    store.close()
    return [(f"registry projection alone ({count:,} worker.* events folded)", f"{elapsed:.2f} s")]


def bench_launch(path: Path) -> list[tuple[str, str]]:
    """A real `smgrl launch` on the journal: from process start until /liveness answers."""
    import subprocess
    import urllib.request

    from smgrl.demo.procs import free_port

    port = free_port()
    argv = [sys.executable, "-m", "smgrl", "launch", "--port", str(port), "--journal", str(path),
            "--disable-health-check", "--prometheus-port", str(free_port())]  # fmt: skip
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = t0 + 120
        while time.perf_counter() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/liveness", timeout=1):
                    break
            except OSError:
                time.sleep(0.02)
        elapsed = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(30)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import smgrl.runtime.server"], check=True)
    imports = time.perf_counter() - t0
    return [
        (
            "`smgrl launch` until /liveness answers (real process)",
            f"{elapsed:.2f} s (interpreter + imports alone: {imports:.2f} s)",
        )
    ]


# -- time travel at scale, as real commands --------------------------------------------------


def run_command(args: list[str]) -> tuple[float, float, float]:
    """Run ``smgrl journal ARGS`` as a subprocess (output discarded): (wall seconds, CPU seconds
    (user + system), peak RSS MB). On a busy machine wall time is mostly waiting for a core: the
    CPU time is what the command costs.

    Started through GNU ``time`` when there is one: a child forked from this (large) benchmark
    process would report this process's RSS as its peak (Linux keeps ``ru_maxrss`` across exec),
    one forked from ``time`` reports its own. Without it, the child's ``ru_maxrss`` from
    ``os.wait4``, an upper bound."""
    argv = [sys.executable, "-m", "smgrl", "journal", *args]
    gnu_time = os.path.exists("/usr/bin/time")
    with tempfile.NamedTemporaryFile("r", suffix=".time") as out:
        if gnu_time:
            argv = ["/usr/bin/time", "-f", "%U %S %M", "-o", out.name, *argv]
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _pid, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode() if proc.stderr else ""
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {err[-500:]}")
        if gnu_time:
            user, system, peak_kb = out.read().split()[-3:]
            return elapsed, float(user) + float(system), int(peak_kb) / 1024
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def history_targets(path: Path) -> list[tuple[str, list[str]]]:
    """The time-travel commands on one journal. ``--at`` targets are the worst case of their
    region: the seq just below a stored snapshot, so the whole gap since the previous one replays."""
    import sqlite3

    with sqlite3.connect(path) as conn:
        head = conn.execute("SELECT max(seq) FROM events").fetchone()[0]
        snaps = [r[0] for r in conn.execute("SELECT upto_seq FROM snapshots ORDER BY upto_seq")]
    mid = next((s for s in snaps if s > head // 2), head) - 1
    near = (snaps[-1] - 1) if snaps else head - 10
    j = ["--journal", str(path)]
    return [
        (
            f"`workers --at {mid}` (middle, {mid - max([s for s in snaps if s <= mid], default=0):,} events past a snapshot)",
            [*j, "workers", "--at", str(mid)],
        ),
        (
            f"`workers --at {near}` (near the head, {near - max([s for s in snaps if s <= near], default=0):,} past one)",
            [*j, "workers", "--at", str(near)],
        ),
        ("`versions`", [*j, "versions"]),
        ("`refits --all`", [*j, "refits", "--all"]),
        ("`events --type 'worker.*'` (glob)", [*j, "events", "--type", "worker.*"]),
        ("`ops --all`", [*j, "ops", "--all"]),
        ("`refits --all --html`", [*j, "refits", "--all", "--html", str(path.with_suffix(".html"))]),
    ]


def bench_history(path: Path, runs: int = 3) -> list[tuple[str, str, str, str]]:
    """(what, wall s range, CPU s range, peak MB range) per command, ``runs`` runs each. The
    interpreter and its imports (``smgrl journal --help``) are measured as a baseline."""
    import compileall

    import journal as journal_pkg
    import smgrl

    # Bytecode caches as an installed package has them (a wheel's install compiles them): without
    # them (PYTHONDONTWRITEBYTECODE, a fresh checkout) every run compiles ~60 modules, 0.1-0.2 s.
    for pkg in (smgrl, journal_pkg):
        compileall.compile_dir(os.path.dirname(pkg.__file__), quiet=1)
    rows = []
    for what, args in [("`--help` (interpreter + imports)", ["--help"]), *history_targets(path)]:
        walls, cpus, peaks = zip(*(run_command(args) for _ in range(runs)), strict=True)
        rows.append((what, _span(walls, 2), _span(cpus, 2), _span(peaks, 0)))
        print(
            f"    {what}: {rows[-1][1]} s, cpu {rows[-1][2]} s, {rows[-1][3]} MB", file=sys.stderr, flush=True
        )
    return rows


def bench_index(path: Path, *, verify: bool = True) -> list[tuple[str, str, str, str]]:
    """The operation index's one-off costs, as commands, once each: `reindex` (drop and rebuild),
    the migration of a journal written before it (the table and its migration record removed from
    a copy, then `reindex`, which migrates: what a gateway's first start on it pays too), and
    (``verify``) `verify --no-replay`, which now rebuilds and compares the index too."""
    import sqlite3

    rows = []
    wall, cpu, peak = run_command(["--journal", str(path), "reindex"])
    rows.append(("`reindex` (rebuild the operation index)", f"{wall:.2f}", f"{cpu:.2f}", f"{peak:.0f}"))
    old = path.with_name(path.stem + "-old.db")
    shutil.copyfile(path, old)
    with sqlite3.connect(old) as conn:
        conn.execute("DROP TABLE op_index")
        conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0003_op_index'")
    wall, cpu, peak = run_command(["--journal", str(old), "reindex"])
    rows.append(
        (
            "migration of an older journal (back-fill, via `reindex`)",
            f"{wall:.2f}",
            f"{cpu:.2f}",
            f"{peak:.0f}",
        )
    )
    if verify:
        wall, cpu, peak = run_command(["--journal", str(path), "verify", "--no-replay"])
        rows.append(
            (
                "`verify --no-replay` (chain, schemas, operation index)",
                f"{wall:.2f}",
                f"{cpu:.2f}",
                f"{peak:.0f}",
            )
        )
    for p in path.parent.glob(old.name + "*"):
        p.unlink()
    with sqlite3.connect(path) as conn:
        size = conn.execute("SELECT sum(pgsize) FROM dbstat WHERE name LIKE '%op_index%'").fetchone()[0]
    rows.append(("operation index size (table and indexes)", f"{size / 1e6:.1f} MB", "", ""))
    return rows


def _span(values: tuple[float, ...], digits: int) -> str:
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def _fmt_rate(x: float) -> str:
    return f"{x:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--events", default="100000,1000000", help="journal sizes to replay (comma-separated)"
    )
    parser.add_argument(
        "--append-events", type=int, default=100_000, help="events appended through the writer"
    )
    parser.add_argument("--appenders", type=int, default=256, help="concurrent appending tasks")
    parser.add_argument(
        "--per-event", type=int, default=5_000, help="events for the transaction-per-event baseline"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each JournalWriter measurement (the best is kept)"
    )
    parser.add_argument("--skip-appends", action="store_true", help="skip the append measurements")
    parser.add_argument(
        "--skip-issue4", action="store_true", help="skip startup/snapshot/refits/registry measurements"
    )
    parser.add_argument(
        "--launch", action="store_true", help="also time a real `smgrl launch` on each journal"
    )
    parser.add_argument(
        "--startup-only",
        action="store_true",
        help="generate each journal, then only the startup measurements",
    )
    parser.add_argument(
        "--history",
        default="",
        metavar="SIZES",
        help="time travel: journals of these sizes (e.g. 1000000,5000000) written with the gateway's "
        "snapshot cadence; `workers --at`, `versions`, `refits --all`, `events --type GLOB` as commands",
    )
    parser.add_argument("--history-runs", type=int, default=3, help="runs of each history command")
    parser.add_argument(
        "--history-dir", default=None, help="where the history journals are written (default: a temp dir)"
    )
    parser.add_argument(
        "--history-skip-verify", action="store_true", help="do not time `verify` on the history journals"
    )
    parser.add_argument(
        "--history-keep",
        default=None,
        metavar="DIR",
        help="reuse (or keep) the generated history journals in DIR instead of a temporary directory",
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.events.split(",") if s]

    print(
        f"# Journal benchmark (python {sys.version.split()[0]}, {os.cpu_count()} CPUs, trio {trio.__version__})\n"
    )
    with tempfile.TemporaryDirectory(prefix="smgrl-journal-bench-") as tmp:
        d = Path(tmp)
        print("## Appends (SqliteStore, WAL)\n")
        print("| path | synchronous | events | events/s | events per transaction |")
        print("|---|---|---:|---:|---:|")
        for sync in () if args.skip_appends else ("NORMAL", "FULL"):
            runs = [
                bench_writer(d / f"writer-{sync}.db", args.append_events, args.appenders, sync)
                for _ in range(args.repeat)
            ]
            rate, per_txn = max(runs)
            label = f"JournalWriter, {args.appenders} tasks each `await append` (best of {args.repeat})"
            print(f"| {label} | {sync} | {args.append_events:,} | {_fmt_rate(rate)} | {per_txn:,.1f} |")
            rate, per_txn = max(
                bench_writer(d / f"nowait-{sync}.db", args.append_events, 1, sync, nowait=True)
                for _ in range(args.repeat)
            )
            label = f"JournalWriter, one task `append_nowait` + `flush` (best of {args.repeat})"
            print(f"| {label} | {sync} | {args.append_events:,} | {_fmt_rate(rate)} | {per_txn:,.1f} |")
            rate = bench_per_event(d / f"per-event-{sync}.db", args.per_event, sync)
            print(
                f"| one transaction per event (no trio) | {sync} | {args.per_event:,} | {_fmt_rate(rate)} | 1 |"
            )
            rate = bench_raw_batches(d / f"raw-{sync}.db", args.append_events, sync)
            print(
                f"| `append_batch` of 1000 (no trio) | {sync} | {args.append_events:,} | {_fmt_rate(rate)} | 1000 |"
            )
            sys.stdout.flush()

        issue4: list[tuple[int, str, str]] = []
        print("\n## Replay (realistic mix: fan-outs to 8 engines + worker churn)\n")
        print("| events | step | seconds | events/s |")
        print("|---:|---|---:|---:|")
        for n in sizes:
            path = d / f"replay-{n}.db"
            if args.startup_only:
                print(f"| {n:,} | generate | {generate(path, n):.2f} | |")
                extra = bench_startup(path, n) + (bench_launch(path) if args.launch else [])
                issue4.extend((n, what, value) for what, value in extra)
                for p in d.glob(f"replay-{n}.db*"):
                    p.unlink()
                continue
            for what, seconds, count in bench_replay(path, n):
                print(f"| {n:,} | {what} | {seconds:.2f} | {_fmt_rate(count / seconds)} |")
            size = path.stat().st_size + sum(p.stat().st_size for p in d.glob(f"replay-{n}.db-*"))
            print(f"| {n:,} | file size | {size / 1e6:.1f} MB | {size / n:.0f} B/event |")
            sys.stdout.flush()
            if not args.skip_issue4:
                extra = bench_registry(path) + bench_refits(path) + bench_startup(path, n)
                if args.launch:
                    extra += bench_launch(path)
                issue4.extend((n, what, value) for what, value in extra)
            for p in d.glob(f"replay-{n}.db*"):
                p.unlink()
        if issue4:
            print("\n## Startup, snapshots, `smgrl journal refits`, registry projection (same journals)\n")
            print("| events | what | time |")
            print("|---:|---|---:|")
            for n, what, value in issue4:
                print(f"| {n:,} | {what} | {value} |")
    if args.history:
        bench_history_sizes(
            [int(x) for x in args.history.split(",") if x],
            args.history_runs,
            args.history_dir,
            args.history_keep,
            not args.history_skip_verify,
        )
    print()


def bench_history_sizes(
    sizes: list[int], runs: int, where: str | None, keep: str | None = None, verify: bool = True
) -> None:
    print("\n## Time travel at scale: commands as a user runs them\n")
    print(f"{runs} runs each (ranges); the journals are written with the gateway's snapshot cadence")
    print("(every 25,000 events, thinned by the retention policy).\n")
    print("| events | command | wall s | CPU s | peak MB |")
    print("|---:|---|---:|---:|---:|")
    with contextlib.ExitStack() as stack:
        if keep is None:
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="smgrl-history-", dir=where))
        else:
            tmp = keep
            os.makedirs(tmp, exist_ok=True)
        for n in sizes:
            path = Path(tmp) / f"history-{n}.db"
            if not path.exists():
                t0 = time.perf_counter()
                taken = generate_with_snapshots(path, n)
                print(
                    f"| {n:,} | (generated in {time.perf_counter() - t0:.0f} s, {taken} snapshots taken) | | | |"
                )
            for what, wall, cpu, peak in bench_history(path, runs) + bench_index(path, verify=verify):
                print(f"| {n:,} | {what} | {wall} | {cpu} | {peak} |")
            sys.stdout.flush()
            if keep is None:
                for p in Path(tmp).glob(f"history-{n}.db*"):
                    p.unlink()


if __name__ == "__main__":
    main()

"""Startup replay, projection snapshots, and the bookkeeping of operations cut short.

``restore`` rebuilds the gateway's ``FleetState``: it loads the newest valid ``fleet`` snapshot
(see ``smgrl.state.snapshot``) and folds only the events after it (the same ``apply`` the writer
calls at run time). ``replay`` folds from any point without a snapshot (tests, the CLI, and
``restore`` itself when there is no usable snapshot). Both read only the event types the
projections fold (``FOLDED_TYPES``, through the journal's (type, seq) index) and decode only those.

``Snapshotter`` is the gateway task that stores a new snapshot every ``every`` events.

``record_interrupted`` appends ``control.interrupted`` for every operation the journal shows as
started but never finished: after a crash (``gateway_restart``) or at shutdown (``shutdown``),
naming the targets whose outcomes were recorded and those that were not.
"""

from __future__ import annotations

import heapq
import logging
import os
import time
from collections.abc import Iterator

import attrs

from journal.base import RawRow
from journal.events import decode, decode_parsed
from smgrl.errors import StartupError
from smgrl.journaling import ev
from smgrl.logs import event as log_event
from smgrl.state import engines, registry, routing_loop, sagas, snapshot
from smgrl.state.fleet import FleetState

log = logging.getLogger("smgrl.snapshot")

# Every type some projection of FleetState folds. Other types (audit, gateway, probe failures,
# snapshot markers) change nothing, so replay skips them without decoding them. A test checks
# that FleetState ignores every catalogued type outside this set; extend it with the projections.
CONTROL_TYPES = frozenset({"control.started", "control.outcome", "control.finished", "control.interrupted"})
FOLDED_TYPES = registry.TYPES | engines.TYPES | CONTROL_TYPES | routing_loop.TYPES | sagas.TYPES

# Events between two snapshots taken by the gateway. It bounds what startup replays and
# hash-checks (the worst case is a snapshot this many events behind the head): 25,000 keeps a
# verified startup on a 1M-event journal under a second (docs/benchmarks.md), for a snapshot
# (about 1 MB and 25-90 ms of the writer thread for a 2,000-worker fleet) every 25,000 events.
SNAPSHOT_EVERY = 25_000
SNAPSHOT_EVERY_ENV = "SMGRL_SNAPSHOT_EVERY"  # override (tests, tuning); 0 turns snapshots off


def read_types(store, types, after_seq: int = 0) -> Iterator[RawRow]:
    """``store.read_raw`` rows of several ``types`` in seq order: one index range per type, merged.

    Not ``read_raw(types=[...])``: with several types SQLite sorts every remaining match for each
    page (a temp B-tree for ORDER BY seq), which grows quadratically with the journal. One type
    at a time walks the (type, seq) index in order and costs only the rows it returns.
    """
    return heapq.merge(*(store.read_raw(after_seq, types=[t]) for t in sorted(set(types))))


def replay(store, fleet: FleetState, after_seq: int = 0, *, until_seq: int | None = None) -> int:
    """Fold the events in ``(after_seq, until_seq]`` (to the end when None) into ``fleet``; return
    how many were folded. ``fleet.last_seq`` ends at the last event considered (folded or not)."""
    head = store.last_seq() if until_seq is None else until_seq
    count = 0
    apply = fleet.apply
    # Undecoded rows of the folded types only (the (type, seq) index), decoded one by one here.
    for seq, _ts, _stream, type_, schema, payload in read_types(store, FOLDED_TYPES, after_seq):
        if seq > head:
            break  # past the bound (``until_seq``, or appended while we replay)
        apply(seq, decode(type_, schema, payload))
        count += 1
    fleet.last_seq = max(fleet.last_seq, head)
    return count


@attrs.frozen
class Restored:
    """How ``restore`` rebuilt the state: from which snapshot (0: none) and how many events."""

    snapshot_seq: int
    replayed: int
    head: int
    snapshot_error: str | None = None


def load_snapshot(store, max_seq: int | None = None) -> tuple[int, FleetState, str | None]:
    """The newest usable fleet snapshot at or below ``max_seq``: ``(upto_seq, state, problem)``.

    ``(0, FleetState(), problem)`` when there is none or it cannot be loaded (``problem`` says why).
    """
    found = store.latest_snapshot(snapshot.KIND, max_seq)
    if found is None:
        return 0, FleetState(), None
    upto_seq, text = found
    try:
        fleet = snapshot.from_json(text)
    except snapshot.SnapshotError as exc:
        return 0, FleetState(), f"snapshot at seq {upto_seq} ignored: {exc}"
    if fleet.last_seq != upto_seq:
        return 0, FleetState(), f"snapshot at seq {upto_seq} claims seq {fleet.last_seq}; ignored"
    return upto_seq, fleet, None


def restore(store, *, use_snapshot: bool = True, until_seq: int | None = None) -> tuple[FleetState, Restored]:
    """A FleetState for the journal as it is (or as it was at ``until_seq``): snapshot + the rest."""
    head = store.last_seq() if until_seq is None else min(until_seq, store.last_seq())
    seq, fleet, problem = load_snapshot(store, head) if use_snapshot else (0, FleetState(), None)
    if problem is not None:
        log.warning("%s; replaying from scratch", problem)
    if seq:
        restore_sagas(store, fleet, seq)
    count = replay(store, fleet, seq, until_seq=None if until_seq is None else head)
    return fleet, Restored(snapshot_seq=seq, replayed=count, head=fleet.last_seq, snapshot_error=problem)


def restore_verified(store) -> tuple[FleetState, Restored]:
    """What the gateway serves from: ``restore``, after checking the hash chain of every event it
    folds. StartupError (one line naming the first bad seq) when that part of the chain fails.

    The snapshot's own hash binds the chain hash at its seq, so checking the rows after it is
    enough to trust the whole restored state; older rows are not replayed (``smgrl journal verify``
    checks them all). A snapshot that fails its hash check is not trusted and not dropped silently:
    one warning line, then the previous valid snapshot (or the first event) is the starting point,
    and the chain is checked from there. The check and the fold are one pass over the rows after
    the snapshot (at most ``SNAPSHOT_EVERY`` of them): see docs/benchmarks.md.
    """
    head = store.last_seq()
    seq, fleet, problem = load_snapshot(store, head)
    stored = [s for s in store.snapshot_seqs(snapshot.KIND) if s <= head]
    if problem is None and stored and stored[0] > seq:
        problem = (
            f"the snapshot at seq {stored[0]} fails its hash check (edited, or history rewritten under it)"
        )
    if problem is not None:
        start = f"the snapshot at seq {seq}" if seq else "the first event"
        log.warning("%s; not used: startup replays from %s (run `smgrl journal verify`)", problem, start)
    # One pass: each row after the snapshot is read once, parsed once, hash-checked, and (when a
    # projection folds its type) folded once it passed. Rows that fail never reach the fold, and
    # a failure refuses the whole state anyway.
    if seq:
        restore_sagas(store, fleet, seq)
    folded_upto, count = seq, 0
    apply = fleet.apply

    def fold(row_seq: int, type_: str, schema: int, payload) -> None:
        nonlocal folded_upto, count
        if row_seq <= folded_upto:
            return  # seen in an earlier attempt (verify retries after a concurrent compaction)
        folded_upto = row_seq
        if type_ in FOLDED_TYPES:
            apply(row_seq, decode_parsed(type_, schema, payload))
            count += 1

    report = store.verify(after=seq, on_row=fold)
    if not report.ok:
        where = getattr(store, "path", "the journal")
        raise StartupError(
            f"{where} fails its hash check at seq {report.first_bad_seq} ({report.reason}); not serving"
            " it: run `smgrl journal verify` for details"
        )
    fleet.last_seq = max(fleet.last_seq, folded_upto)
    return fleet, Restored(snapshot_seq=seq, replayed=count, head=fleet.last_seq, snapshot_error=problem)


def restore_sagas(store, fleet: FleetState, upto_seq: int) -> None:
    """Snapshots do not hold refit sagas, quarantines or the version history: fold their
    events up to the snapshot from the file (a type-filtered read; few events)."""
    for rec in store.read(types=sorted(sagas.TYPES), until_seq=upto_seq):
        fleet.sagas.apply(rec.seq, rec.event, rec.ts)


def snapshot_every(environ: dict[str, str] | None = None) -> int:
    """Events between snapshots: ``SMGRL_SNAPSHOT_EVERY`` when set to an integer >= 0, else 25,000."""
    raw = (os.environ if environ is None else environ).get(SNAPSHOT_EVERY_ENV, "").strip()
    if raw.isdigit():
        return int(raw)
    return SNAPSHOT_EVERY


class Snapshotter:
    """Stores a fleet snapshot every ``every`` events, through the journal writer.

    The state is captured on the event loop (between batches, so it is exactly the fold up to
    ``fleet.last_seq``); encoding and the write happen in the writer's thread
    (``JournalWriter.save_snapshot``), never concurrently with a commit. A ``snapshot.taken``
    marker follows each stored snapshot.
    """

    def __init__(self, fleet: FleetState, writer, *, every: int, last_seq: int, poll_secs: float = 1.0):
        self.fleet = fleet
        self.writer = writer
        self.every = every
        self.last_seq = last_seq  # seq of the newest snapshot (0: none)
        self.poll_secs = poll_secs

    def due(self) -> bool:
        return self.every > 0 and self.fleet.last_seq - self.last_seq >= self.every

    async def run(self, *, task_status=None) -> None:
        # trio is imported here, not at the top: the journal CLI imports this module to read.
        import trio

        if task_status is not None:  # nursery.start (start_soon passes none)
            task_status.started()
        if self.every <= 0:
            return
        # Cancelled with the gateway's inner nursery at shutdown. A cancellation during
        # save_snapshot waits for the thread (abandon_on_cancel=False in the writer): the
        # snapshot row is then written or not, never half.
        while True:
            if self.due():
                await self.take()
            await trio.sleep(self.poll_secs)

    async def take(self) -> int | None:
        """Store a snapshot of the current state now; its upto_seq, or None if it failed."""
        t0 = time.perf_counter()
        cap = snapshot.capture(self.fleet)  # on the loop: consistent (no batch applies meanwhile)
        if cap.last_seq <= 0:
            return None
        captured_ms = (time.perf_counter() - t0) * 1000
        try:
            size = await self.writer.save_snapshot(snapshot.KIND, cap.last_seq, lambda: snapshot.dumps(cap))
        except Exception as exc:  # noqa: BLE001 - a snapshot is a cache: log it and carry on
            log.warning("snapshot at seq %d failed: %r", cap.last_seq, exc)
            self.last_seq = cap.last_seq  # do not retry every second; try again after `every`
            return None
        self.last_seq = cap.last_seq
        log_event(
            log,
            "snapshot stored",
            upto_seq=cap.last_seq,
            bytes=size,
            capture_ms=round(captured_ms, 2),
            workers=len(cap.workers),
        )
        try:
            await self.writer.append(
                "gateway", ev("snapshot.taken", kind=snapshot.KIND, upto_seq=cap.last_seq)
            )
        except Exception as exc:  # noqa: BLE001 - the marker is informational
            log.warning("snapshot marker not journaled: %r", exc)
        return cap.last_seq


async def record_interrupted(journal, fleet: FleetState, reason: str) -> list[str]:
    """Journal ``control.interrupted`` for every open operation, in one transaction."""
    items = []
    for op_id, op in list(fleet.operations.open.items()):
        targets = [t["worker_id"] for t in op.targets]
        recorded = [t for t in targets if t in op.outcomes]
        missing = [t for t in targets if t not in op.outcomes]
        items.append(
            (
                f"op:{op_id}",
                ev(
                    "control.interrupted",
                    op_id=op_id,
                    reason=reason,
                    recorded_targets=recorded,
                    missing_targets=missing,
                ),
            )
        )
    if items:
        await journal.append_many(items)
    return [event.op_id for _, event in items]

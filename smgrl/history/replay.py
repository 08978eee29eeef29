"""Startup replay: a FleetState restored from the newest snapshot plus the events after it.

``restore`` rebuilds the gateway's ``FleetState``: it loads the newest valid ``fleet`` snapshot
(see ``smgrl.state.snapshot``) and folds only the events after it (the same ``apply`` the writer
calls at run time). ``replay`` folds from any point without a snapshot (tests, the CLI, and
``restore`` itself when there is no usable snapshot). Both read only the event types the
projections fold (``FOLDED_TYPES``, through the journal's (type, seq) index) and decode only those.

Pure folds over a store the caller opened: no task, no append. The gateway task that stores a
new snapshot every so many events is ``smgrl.runtime.snapshots.Snapshotter``; the journaling of operations
cut short is ``smgrl.telemetry.journaling.record_interrupted``.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterator

import attrs

from journal.base import RawRow
from smgrl.core.errors import StartupError
from smgrl.events import decode, decode_parsed
from smgrl.state import FleetState, engines, group_pins, registry, routing_loop, sagas, snapshot

log = logging.getLogger("smgrl.snapshot")

# Every type some projection of FleetState folds. Other types (audit, gateway, probe failures,
# snapshot markers) change nothing, so replay skips them without decoding them. A test checks
# that FleetState ignores every catalogued type outside this set; extend it with the projections.
CONTROL_TYPES = frozenset({"control.started", "control.outcome", "control.finished", "control.interrupted"})
FOLDED_TYPES = (
    registry.TYPES | engines.TYPES | CONTROL_TYPES | routing_loop.TYPES | sagas.TYPES | group_pins.TYPES
)


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
    the snapshot (at most ``smgrl.runtime.snapshots.SNAPSHOT_EVERY`` of them): see docs/benchmarks.md.
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
        restore_sagas(store, fleet, seq, verified=True)
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
    _refuse_unless_ok(store, report)
    fleet.last_seq = max(fleet.last_seq, folded_upto)
    return fleet, Restored(snapshot_seq=seq, replayed=count, head=fleet.last_seq, snapshot_error=problem)


def restore_sagas(store, fleet: FleetState, upto_seq: int, *, verified: bool = False) -> None:
    """Snapshots do not hold refit sagas, quarantines or the version history: fold their
    events up to the snapshot from the file (a type-filtered read; few events).

    ``verified`` (startup): each of those rows is folded only once the chain checked it and its
    successor: it links to the row before it, its recomputed hash is its stored hash, and the
    next row links to that hash. So an edit of the row, or of the row and its stored hash, is
    refused as an edit after the snapshot is (StartupError naming the seq). Not the whole chain
    below the snapshot (that is `smgrl journal verify`'s O(journal) job): a forger who rewrites
    the hashes of every row up to some later one can still go unseen until a full verify, as
    with any unkeyed chain. A few store calls per saga row; the rows between are not read."""
    records = list(store.read(types=sorted(sagas.TYPES), until_seq=upto_seq))
    if verified:
        for after, upto in _windows([rec.seq for rec in records], upto_seq):
            report = store.verify(after=after, upto=upto)
            _refuse_unless_ok(store, report)
    for rec in records:
        fleet.sagas.apply(rec.seq, rec.event, rec.ts)


def _refuse_unless_ok(store, report) -> None:
    """A failed chain check refuses the whole state: one line naming the first bad seq."""
    if not report.ok:
        where = getattr(store, "path", "the journal")
        raise StartupError(
            f"{where} fails its hash check at seq {report.first_bad_seq} ({report.reason}); not serving"
            " it: run `smgrl journal verify` for details"
        )


def _windows(seqs: list[int], upto_seq: int) -> list[tuple[int, int]]:
    """``(after, upto)`` ranges covering each seq and its successor (not past the snapshot's
    row), overlapping ones merged."""
    out: list[tuple[int, int]] = []
    for s in seqs:
        after, upto = s - 1, min(s + 1, upto_seq)
        if out and after <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], upto))
        else:
            out.append((after, upto))
    return out

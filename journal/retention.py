"""Which projection snapshots to keep (pure): recent ones all, older ones thinner with age.

Snapshots serve two readers: startup restores the newest one, and ``smgrl journal workers --at``
restores the newest one at or below its target and replays from there. The second needs
snapshots spread over the whole history, but keeping every one would grow the file by about a
megabyte per 25,000 events (a 2,000-worker fleet). So, with ``age = head - upto_seq``:

* every snapshot younger than ``recent`` events is kept (the gateway takes one every 25,000
  events, so the newest million events have one every 25,000);
* older ones are kept sparser, level by level: level k (k >= 1) holds the ages in
  ``(recent * 2**(k-1), recent * 2**k]`` and keeps the newest snapshot of each bucket of
  ``recent * 2**(k-1) / per_level`` seqs (buckets aligned to multiples of their width, so a
  coarser bucket is exactly two finer ones and what a level keeps is among what the level below
  kept: thinning never empties a bucket that had a snapshot).

Guarantees (``tests/journal/test_retention.py``, table cases and hypothesis properties):

* **count**: at most ``max_kept(head)`` = ``recent / every + 1`` recent snapshots plus
  ``per_level + 2`` per level, one level per doubling of the history beyond ``recent``
  (defaults: 41 + 10 per doubling: 51 on a 2M-event journal, 71 on 8M);
* **distance**: for any seq ``s`` the newest kept snapshot at or below ``s`` (or the start of
  the journal) is at most ``max(gap, (head - s) / (per_level / 2) + gap)`` below it, where
  ``gap`` is the largest distance between two snapshots the gateway took (its cadence): within
  the recent million events that is one cadence;
* the newest snapshot is always kept (startup and ``verify`` use it).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

__all__ = ["DEFAULT", "Retention"]


@attrs.frozen
class Retention:
    # The gateway's cadence (smgrl.runtime.snapshots.SNAPSHOT_EVERY; journal/ does not import smgrl), only
    # used to state the count bound.
    every: int = 25_000
    recent: int = 1_000_000  # events from the head within which every snapshot is kept
    per_level: int = 8  # buckets per doubling of age beyond ``recent``

    def level(self, age: int) -> int:
        """0 for the recent part, else k with ``recent * 2**(k-1) < age <= recent * 2**k``."""
        if age <= self.recent:
            return 0
        k, span = 1, self.recent
        while age > span * 2:  # bounded: one step per doubling of the journal
            span *= 2
            k += 1
        return k

    def width(self, level: int) -> int:
        """Bucket width (seqs) of a level >= 1."""
        return max(1, int(self.recent * 2 ** (level - 1) // self.per_level))

    def keep(self, seqs: Iterable[int], head: int) -> set[int]:
        """The ``upto_seq`` values to keep among ``seqs`` for a journal whose last seq is ``head``."""
        ordered = sorted(set(seqs), reverse=True)
        kept: set[int] = set()
        seen: set[tuple[int, int]] = set()
        for seq in ordered:  # newest first: the first of a bucket is its newest
            lvl = self.level(max(0, head - seq))
            if lvl == 0:
                kept.add(seq)
                continue
            # A coarser level's bucket contains whole buckets of the finer level (widths double
            # and are aligned), so keying by (level, bucket) never keeps two of one coarse bucket.
            key = (lvl, seq // self.width(lvl))
            if key not in seen:
                seen.add(key)
                kept.add(seq)
        if ordered:
            kept.add(ordered[0])
        return kept

    def drop(self, rows: Iterable[tuple[int, int]], head: int) -> list[tuple[int, int]]:
        """Of stored snapshots ``(id, upto_seq)``, those to delete: the ones ``keep`` does not
        keep, and of two at one seq (a CLI ``replay --snapshot`` and the gateway) the older id.
        Both stores (SQLite and memory) drop by this."""
        rows = list(rows)
        keep = self.keep((seq for _id, seq in rows), head)
        newest_id: dict[int, int] = {}
        for snap_id, seq in rows:
            newest_id[seq] = max(snap_id, newest_id.get(seq, snap_id))
        return [(snap_id, seq) for snap_id, seq in rows if seq not in keep or newest_id[seq] != snap_id]

    def max_kept(self, head: int) -> int:
        """The most snapshots ``keep`` returns for a journal of ``head`` events."""
        levels = self.level(head)
        return self.recent // max(1, self.every) + 1 + levels * (self.per_level + 2)


DEFAULT = Retention()

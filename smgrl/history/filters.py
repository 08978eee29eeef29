"""Which events a filter keeps (pure): type patterns and "the events of one worker"."""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable

import attrs

from journal.codec import Recorded, UnknownEvent
from smgrl.events import encode, event_types

__all__ = ["WorkerFilter", "catalogue", "expand_types", "payload_dict"]


def catalogue() -> list[str]:
    """Every event type this smgrl knows: the registry of ``@event_type`` classes (not the
    package's exports, which missed ``engine.*``)."""
    return event_types()


def expand_types(patterns: Iterable[str], known: Iterable[str]) -> list[str]:
    """Type names for ``--type`` values: exact names (also unknown ones: a newer smgrl may have
    written them) and globs over the catalogue (``worker.*``, ``control.*``)."""
    catalogue = sorted(known)
    out: list[str] = []
    for pattern in patterns:
        if any(ch in pattern for ch in "*?["):
            out += [name for name in catalogue if fnmatch.fnmatchcase(name, pattern)]
        else:
            out.append(pattern)
    return sorted(set(out))


def payload_dict(rec: Recorded) -> object:
    """The event's fields as JSON values (an undecodable payload stays its raw text)."""
    event = rec.event
    if isinstance(event, UnknownEvent) and isinstance(event.payload, str):
        return event.payload
    return json.loads(encode(event)[2])


@attrs.define
class WorkerFilter:
    """The events of one worker: its ``worker:<id>`` stream (and its DP group's), and the
    operations that targeted it (their start, its own outcome, their end).

    Stateful on purpose: fed events in seq order it learns the operations started for the worker
    (``see``), so a tail picks up new operations. ``known_ops`` seeds those started before the
    range being read.
    """

    worker_id: str
    group: str | None = None
    known_ops: set[str] = attrs.Factory(set)

    @property
    def streams(self) -> frozenset[str]:
        return frozenset({f"worker:{self.worker_id}", *([f"worker:{self.group}"] if self.group else [])})

    def see(self, stream: str, type_: str, p: object) -> bool:
        if stream in self.streams:
            return True
        if not isinstance(p, dict):
            return False
        if type_ == "worker.discovered" and self.worker_id in (p.get("dp_rank_ids") or ()):
            self.group = p.get("worker_id")
            return True
        if not stream.startswith("op:"):
            return False
        op_id = stream[3:]
        if type_ == "control.started":
            if any(t.get("worker_id") == self.worker_id for t in p.get("targets") or ()):
                self.known_ops.add(op_id)
                return True
            return False
        if op_id not in self.known_ops:
            return False
        if type_ == "control.outcome":
            return p.get("worker_id") == self.worker_id
        return True

"""Control-plane audit in the journal, bounded (decision D2).

Every control-plane request gets an audit log line (``smgrl/http/routes/guard.py``). In the journal:

- an allowed write (engine routes, version/state writes, ``POST/PUT/PATCH/DELETE /workers``) is one
  ``audit.control_plane`` event, committed with the operation's own records where there are some;
- reads and denials are only counted here, per (principal, route family, outcome, reason), and
  every ``interval`` seconds (and at shutdown) the counts become one ``audit.control_plane_counts``
  event. Every part of the key comes from a closed set (configured key ids or
  ``unauthenticated``/``anonymous``/an auth method, the families below, fixed reasons), so neither
  memory nor the journal grows with what a client sends: 10,000 refused requests with 8 KB paths
  cost one small event per interval (``tests/e2e/test_audit_bounds.py``).
"""

from __future__ import annotations

import logging
import time

import trio

from journal import JournalWriteError
from smgrl.events import AuditControlPlaneCounts

log = logging.getLogger("smgrl.audit")

# Route families, for the counts (and the log lines).
FAMILIES = ("rl.discovery", "rl.engine", "rl.writes", "rl.journal", "workers", "other")

# Defence in depth: the key space is closed (see the module docstring); should it ever stop being
# so, counts beyond this many keys per interval are folded into one "(other)" principal.
MAX_KEYS = 1024


def route_family(path: str) -> str:
    """The route family of a control-plane path (pure)."""
    if path == "/workers" or path.startswith("/workers/"):
        return "workers"
    if not path.startswith("/v1/rl/"):
        return "other"
    parts = path[len("/v1/rl/") :].split("/")
    head = parts[0]
    if head == "engine":
        return "rl.engine"
    if head in ("version", "state"):
        return "rl.writes"
    if head in ("operations", "journal"):
        return "rl.journal"
    if head == "workers":
        if len(parts) >= 3 and parts[2] == "engine":
            return "rl.engine"
        if len(parts) == 3 and parts[2] in ("version", "state"):
            return "rl.writes"
        return "rl.discovery"
    return "other"


class AuditCounts:
    """Counts of audited reads and denials, flushed to the journal as one event per interval."""

    def __init__(self, interval_secs: float = 60.0, clock=time.time) -> None:
        self.interval = interval_secs
        self._clock = clock
        self._counts: dict[tuple[str, str, str, str], int] = {}
        self._since = clock()

    def add(self, principal: str, family: str, outcome: str, reason: str | None) -> None:
        key = (principal, family, outcome, reason or "")
        if key not in self._counts and len(self._counts) >= MAX_KEYS:
            key = ("(other)", family, outcome, reason or "")
        self._counts[key] = self._counts.get(key, 0) + 1

    def __len__(self) -> int:
        return len(self._counts)

    def take(self):
        """The counts so far as one event (and start a new interval), or None when there are none."""
        if not self._counts:
            return None
        now = self._clock()
        rows = [
            {"principal": p, "family": f, "outcome": o, "reason": r or None, "count": n}
            for (p, f, o, r), n in sorted(self._counts.items())
        ]
        event = AuditControlPlaneCounts(since=self._since, until=now, counts=rows)
        self._counts = {}
        self._since = now
        return event

    async def flush(self, journal) -> None:
        """Journal the counts now (awaited: durable when this returns, unless the journal fails)."""
        event = self.take()
        if event is None:
            return
        try:
            await journal.append("audit", event)
        except JournalWriteError as exc:
            # The counts are gone with the batch; the log lines of those requests remain.
            log.warning("audit counts not journaled: %s", exc)

    async def run(self, journal, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Flush every ``interval`` seconds; the last counts are flushed by the caller at shutdown."""
        task_status.started()
        while True:
            await trio.sleep(self.interval)
            await self.flush(journal)

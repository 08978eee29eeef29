"""The recent control calls that aborted requests, per engine: what attributes an engine's
``finish_reason: abort`` to an operation (``smgrl.dataplane.loopback``).

A projection of ``control.started`` events (committed before any engine is called, so by the
time an engine aborts a request the call that made it do so is here) and of their
``control.finished``/``control.interrupted``. A call may have aborted a request when it had not
finished when the request was sent: it started after, or it was still in flight (the gateway may
pick an engine whose pause is on the wire: the engine still says active). Only a window is kept
(the last ``WINDOW`` calls per engine) and it is not snapshotted: it serves requests in flight
in this process, which all started after the gateway did.
"""

from __future__ import annotations

from collections import deque

from smgrl.core import aborts_inflight, strip_rank

WINDOW = 64


class AbortingOps:
    def __init__(self) -> None:
        # engine -> [start seq, op id, end seq (None: in flight)], oldest first
        self._by_engine: dict[str, deque[list]] = {}
        self._open: dict[str, list[list]] = {}  # op id -> its entries, until it ends
        self.ended = 0  # aborting calls ended so far (FleetState wakes waiting requests on it)

    def apply(self, seq: int, event) -> None:
        kind = getattr(event, "TYPE", None)
        if kind in ("control.finished", "control.interrupted"):
            entries = self._open.pop(event.op_id, None)
            if entries is not None:
                self.ended += 1
                for entry in entries:
                    entry[2] = seq
            return
        if kind != "control.started":
            return
        # Folds that read control events partially (``smgrl journal workers --at`` extracts
        # only what the engine projection needs) leave this window empty: it serves live
        # requests only.
        method, body_bytes = getattr(event, "method", None), getattr(event, "body_bytes", None)
        if method is None or body_bytes is None:
            return
        if not aborts_inflight(method, event.path, body_bytes(), event.query):
            return
        entries = []
        for base in dict.fromkeys(strip_rank(t["url"]) for t in event.targets if t.get("url")):
            ops = self._by_engine.setdefault(base, deque(maxlen=WINDOW))
            entry = [seq, event.op_id, None]
            ops.append(entry)
            entries.append(entry)
        if entries:
            self._open[event.op_id] = entries
            if len(self._open) > WINDOW * 4:  # an op that never ends (no finished event): bounded
                self._open.pop(next(iter(self._open)))

    def since(self, base_url: str, seq: int) -> list[str]:
        """The aborting operations on the engine at ``base_url`` not finished at journal
        ``seq`` (when a request was sent to it): they may have aborted that request."""
        return [op for start, op, end in self._by_engine.get(base_url, ()) if end is None or end > seq]

    def pending(self, op_ids) -> bool:
        """Is any of these aborting calls still in flight? A partial-rollout continuation waits
        for the sync that aborted it to finish (the engine is then paused, or on its new
        weights) instead of racing it to an engine that may refuse it or run on old weights."""
        return any(op in self._open for op in op_ids)

"""The recent control calls that aborted requests, per engine: what attributes an engine's
``finish_reason: abort`` to an operation (``smgrl.dataplane.loopback``).

A projection of ``control.started`` events (committed before any engine is called, so by the
time an engine aborts a request the call that made it do so is here) and of their
``control.finished``/``control.interrupted``. A call may have aborted a request when it had not
finished when the request was sent: it started after, or it was still in flight (the gateway may
pick an engine whose pause is on the wire: the engine still says active). Only a window is kept
(the last ``WINDOW`` calls per engine) and it is not snapshotted: it serves requests in flight
in this process, which all started after the gateway did.

The deliberate cancellations made through the gateway (``abort_request`` and vLLM's
``abort_requests``, with the ids they name) are kept the same way, apart: a request with PSRL
routing metadata is looped back on any abort but these (``smgrl.dataplane.loopback.decide``).
"""

from __future__ import annotations

from collections import deque

from smgrl.core import CANCEL_ALL, aborts_inflight, cancelled_requests, strip_rank

WINDOW = 64


class AbortingOps:
    def __init__(self) -> None:
        # engine -> [start seq, op id, end seq (None: in flight)], oldest first
        self._by_engine: dict[str, deque[list]] = {}
        self._open: dict[str, list[list]] = {}  # op id -> its entries, until it ends
        self.ended = 0  # aborting calls ended so far (FleetState wakes waiting requests on it)
        # engine -> [start seq, op id, end seq (None: in flight), the request ids it cancels]:
        # the deliberate cancellations (``abort_request``) made through this gateway.
        self._cancels: dict[str, deque[list]] = {}
        self._open_cancels: dict[str, list[list]] = {}

    def apply(self, seq: int, event) -> None:
        kind = getattr(event, "TYPE", None)
        if kind in ("control.finished", "control.interrupted"):
            for entry in self._open_cancels.pop(event.op_id, ()):
                entry[2] = seq
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
        body = body_bytes()
        cancelled = cancelled_requests(method, event.path, body)
        if cancelled is None and not aborts_inflight(method, event.path, body, event.query):
            return
        window = self._cancels if cancelled is not None else self._by_engine
        entries = []
        for base in dict.fromkeys(strip_rank(t["url"]) for t in event.targets if t.get("url")):
            ops = window.setdefault(base, deque(maxlen=WINDOW))
            entry = [seq, event.op_id, None] if cancelled is None else [seq, event.op_id, None, cancelled]
            ops.append(entry)
            entries.append(entry)
        if entries:
            if cancelled is not None:  # cancellations wake no continuation: only their end matters
                self._open_cancels[event.op_id] = entries
                if len(self._open_cancels) > WINDOW * 4:
                    self._open_cancels.pop(next(iter(self._open_cancels)))
                return
            self._open[event.op_id] = entries
            if len(self._open) > WINDOW * 4:  # an op that never ends (no finished event): bounded
                self._open.pop(next(iter(self._open)))

    def since(self, base_url: str, seq: int) -> list[str]:
        """The aborting operations on the engine at ``base_url`` not finished at journal
        ``seq`` (when a request was sent to it): they may have aborted that request."""
        return [op for start, op, end in self._by_engine.get(base_url, ()) if end is None or end > seq]

    def cancelled(self, base_url: str, seq: int, request_id: str | None) -> bool:
        """Did a deliberate cancellation through this gateway, not finished at journal ``seq``
        (when the request was sent), name ``request_id`` on the engine at ``base_url`` (by a
        prefix of it, as SGLang matches ``rid``), or cancel everything there?"""
        for _start, _op, end, ids in self._cancels.get(base_url, ()):
            if end is not None and end <= seq:
                continue
            if CANCEL_ALL in ids or (request_id is not None and any(request_id.startswith(i) for i in ids)):
                return True
        return False

    def pending(self, op_ids) -> bool:
        """Is any of these aborting calls still in flight? A partial-rollout continuation waits
        for the sync that aborted it to finish (the engine is then paused, or on its new
        weights) instead of racing it to an engine that may refuse it or run on old weights."""
        return any(op in self._open for op in op_ids)

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
from collections.abc import Iterable

import attrs

from smgrl.core import CANCEL_ALL, aborts_inflight, cancelled_requests, strip_rank
from smgrl.events import ControlFinished, ControlInterrupted, ControlStarted

WINDOW = 64


@attrs.define(slots=True)
class _Entry:
    """One aborting call on one engine: its start seq, its op id, its end seq (None: in flight)
    and, for a deliberate cancellation, the request ids it cancels."""

    start: int
    op_id: str
    end: int | None = None
    cancels: frozenset[str] = frozenset()


class AbortingOps:
    def __init__(self) -> None:
        # engine -> its aborting calls, oldest first
        self._by_engine: dict[str, deque[_Entry]] = {}
        self._open: dict[str, list[_Entry]] = {}  # op id -> its entries, until it ends
        self.ended = 0  # aborting calls ended so far (FleetState wakes waiting requests on it)
        # engine -> the deliberate cancellations (``abort_request``) made through this gateway,
        # with the request ids each cancels.
        self._cancels: dict[str, deque[_Entry]] = {}
        self._open_cancels: dict[str, list[_Entry]] = {}

    def apply(self, seq: int, event: object) -> None:
        """Fold one journal record (any type). Folds that read control events partially
        (``smgrl journal workers --at`` extracts only what the engine projection needs, in
        records of its own) leave this window empty: it serves live requests only."""
        if isinstance(event, (ControlFinished, ControlInterrupted)):
            for entry in self._open_cancels.pop(event.op_id, ()):
                entry.end = seq
            ending = self._open.pop(event.op_id, None)
            if ending is not None:
                self.ended += 1
                for entry in ending:
                    entry.end = seq
            return
        if not isinstance(event, ControlStarted):
            return
        method = event.method
        body = event.body_bytes()
        cancelled = cancelled_requests(method, event.path, body)
        if cancelled is None and not aborts_inflight(method, event.path, body, event.query):
            return
        window = self._cancels if cancelled is not None else self._by_engine
        entries: list[_Entry] = []
        for base in dict.fromkeys(strip_rank(url) for t in event.targets if (url := t.get("url"))):
            ops = window.setdefault(base, deque(maxlen=WINDOW))
            entry = (
                _Entry(seq, event.op_id) if cancelled is None else _Entry(seq, event.op_id, cancels=cancelled)
            )
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
        return [e.op_id for e in self._by_engine.get(base_url, ()) if e.end is None or e.end > seq]

    def cancelled(self, base_url: str, seq: int, request_id: str | None) -> bool:
        """Did a deliberate cancellation through this gateway, not finished at journal ``seq``
        (when the request was sent), name ``request_id`` on the engine at ``base_url`` (by a
        prefix of it, as SGLang matches ``rid``), or cancel everything there?"""
        for e in self._cancels.get(base_url, ()):
            if e.end is not None and e.end <= seq:
                continue
            ids = e.cancels
            if CANCEL_ALL in ids or (request_id is not None and any(request_id.startswith(i) for i in ids)):
                return True
        return False

    def pending(self, op_ids: Iterable[str]) -> bool:
        """Is any of these aborting calls still in flight? A partial-rollout continuation waits
        for the sync that aborted it to finish (the engine is then paused, or on its new
        weights) instead of racing it to an engine that may refuse it or run on old weights."""
        return any(op in self._open for op in op_ids)

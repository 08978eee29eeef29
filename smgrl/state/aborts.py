"""The recent control calls that aborted requests, per engine: what attributes an engine's
``finish_reason: abort`` to an operation (``smgrl.dataplane.loopback``).

A projection of ``control.started`` events (committed before any engine is called, so by the
time an engine aborts a request the call that made it do so is here). Only a window is kept
(the last ``WINDOW`` calls per engine) and it is not snapshotted: it serves requests in flight
in this process, which all started after the gateway did.
"""

from __future__ import annotations

from collections import deque

from smgrl.core.aborts import aborts_inflight
from smgrl.core.worker import strip_rank

WINDOW = 64


class AbortingOps:
    def __init__(self) -> None:
        self._by_engine: dict[str, deque[tuple[int, str]]] = {}

    def apply(self, seq: int, event) -> None:
        if getattr(event, "TYPE", None) != "control.started":
            return
        if not aborts_inflight(event.method, event.path, event.body_bytes(), event.query):
            return
        for target in event.targets:
            url = target.get("url")
            if url:
                ops = self._by_engine.setdefault(strip_rank(url), deque(maxlen=WINDOW))
                if not ops or ops[-1][1] != event.op_id:
                    ops.append((seq, event.op_id))

    def since(self, base_url: str, seq: int) -> list[str]:
        """The aborting operations sent to the engine at ``base_url`` after journal ``seq``."""
        return [op for s, op in self._by_engine.get(base_url, ()) if s > seq]

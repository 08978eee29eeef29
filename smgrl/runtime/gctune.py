"""The gateway process's cyclic garbage collector settings (``smgrl serve`` / ``launch`` only).

Why: CPython's defaults (a young collection every 700 net container allocations, a full one when
the objects promoted since the last exceed a quarter of the old ones) cost a running gateway
about 0.6 ms of CPU per 64-engine fan-out, and every few seconds under load a full collection
walks every object the imports, the journal replay and the projections left behind (about
75,000 objects, 35-70 ms with the event loop stopped: every request in flight waits). Those
objects live as long as the process, so scanning them again finds nothing.

* ``tune()``, before ``trio.run``: the young generation collects every ``YOUNG_THRESHOLD``
  allocations, so a request's short-lived objects are mostly freed by reference counting before a
  collection sees (and promotes) them; everything imported so far is frozen (``gc.freeze``: moved
  to a generation no collection scans).
* ``freeze_startup()``, once the gateway listens: the objects startup built (the replayed state,
  the app, the pools) are frozen too. Does nothing unless ``tune()`` ran in this process, so
  in-process servers (the tests) keep the interpreter's settings.

Cycles among new objects are still collected: only the moment changes. A frozen object is still
freed by reference counting when the process drops it; only a cycle among frozen objects stays
(startup state that lives as long as the process).
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_THRESHOLD", "freeze_startup", "tune"]

# 10,000: a 64-engine fan-out allocates about 800 containers that outlive reference counting
# (1.1 young collections each at 700); a burst of 64 concurrent rollouts a few thousand.
YOUNG_THRESHOLD = 10_000

_tuned = False


def tune() -> None:
    global _tuned
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
    gc.freeze()
    _tuned = True


def freeze_startup() -> None:
    if _tuned:
        gc.freeze()

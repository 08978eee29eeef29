"""Leases: which process of several runs a duty that must run once (health checks, discovery,
snapshots, saga recovery). The rules, shared by every store; each store keeps one row per lease
(``leases(name, holder, expires, epoch)``) and applies them inside one write transaction.

* ``take``: a free, released or expired lease goes to the caller; a lease the caller holds is
  renewed; a live lease of another holder is not taken (None).
* ``renew``: only the holder renews (even just past expiry, as long as nobody took it over: then
  nobody else acted on it); anyone else gets :class:`LeaseLost`.
* ``release``: the holder gives it up at once (the next ``take`` by anyone succeeds).
* ``epoch`` grows by one each time the lease changes holder (a fencing token).

Time is the store's clock (SQLite: this host's; PostgreSQL: the server's, so hosts with skewed
clocks agree). A holder renews well within ``ttl`` (the gateway: every ttl/3) and stops its duty
when a renewal fails or when ``ttl`` passed since its last successful renewal, whichever is first.
"""

from __future__ import annotations

import math

from .base import Lease
from .errors import LeaseLost

__all__ = ["check_args", "released", "renewed", "taken"]


def check_args(name: str, holder: str, ttl: float | None = None) -> None:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ValueError("a lease name must be a non-empty string of at most 200 characters")
    if not isinstance(holder, str) or not holder or len(holder) > 200:
        raise ValueError("a lease holder must be a non-empty string of at most 200 characters")
    if ttl is not None and (not isinstance(ttl, int | float) or not math.isfinite(ttl) or ttl <= 0):
        raise ValueError("a lease ttl must be a positive number of seconds")


def taken(current: Lease | None, name: str, holder: str, now: float, ttl: float) -> Lease | None:
    """The lease after ``holder`` asks for it at ``now``; None if another holder keeps it."""
    if current is None:
        return Lease(name, holder, now + ttl, 1)
    if current.holder == holder:
        return Lease(name, holder, now + ttl, current.epoch)
    if current.holder and current.expires > now:
        return None
    return Lease(name, holder, now + ttl, current.epoch + 1)


def renewed(current: Lease | None, name: str, holder: str, now: float, ttl: float) -> Lease:
    if current is None or current.holder != holder:
        who = "nobody" if current is None or not current.holder else "another holder"
        raise LeaseLost(f"lease {name!r} is not held by {holder!r} (held by {who}): stop the duty")
    return Lease(name, holder, now + ttl, current.epoch)


def released(current: Lease | None, holder: str) -> Lease | None:
    """The row after ``holder`` releases (holder '' keeps the epoch counting); None: not held."""
    if current is None or current.holder != holder:
        return None
    return Lease(current.name, "", 0.0, current.epoch)

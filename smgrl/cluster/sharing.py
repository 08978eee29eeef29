"""Several gateway processes on one journal: who this process is, the duties that run once, and
the recovery of what a dead process left open (docs/scale-out.md).

A gateway shares its journal when ``smgrl launch --workers N`` started it (SQLite, one host: the
supervisor hands it the group token and the listening socket, ``smgrl/cluster/supervisor.py``) or when
the journal is PostgreSQL (several hosts). Then:

* every process has an identity, ``host:pid:tag``, and proves it is alive by renewing the lease
  ``gateway:<identity>`` (``presence``): a SIGKILLed process stops renewing, its lease expires;
* a duty that must run once (discovery jobs, health checks, snapshots, recovery) runs
  in :func:`run_leased`: only while this process holds the duty's lease, cancelled as soon as a
  renewal fails or the ttl passed since the last good one, taken over by another process within
  about ``ttl`` (+ one retry period) of the holder's death;
* the ``recovery`` duty records ``control.interrupted`` (reason ``gateway_restart``, as startup
  recovery does for a lone gateway) for every open operation whose process is gone: the
  operation's ``control.started`` names its process (``gateway``); "gone" is decided by the store's
  clock: the recovery holder *can take* that process's presence lease (expired or released).
  Then it releases the prompt-group pins gone processes decided (``dataplane.group_released``,
  reason ``gateway_gone``) and resumes the open refit sagas of gone processes (``refit.started``
  names the process, a ``refit.state`` ``recovering`` the process that resumed it:
  :func:`saga_driver`).

Leases are journal store calls (a write transaction each), run in a thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sqlite3
from collections.abc import Awaitable, Callable

import attrs
import trio

from journal import JournalError, LeaseLost
from smgrl.core.ids import new_tag
from smgrl.dataplane import gone_releases
from smgrl.events import ControlInterrupted
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.sharing")

LEASE_TTL_SECS = 5.0
# What a store call may raise when the store is busy or unreachable (PostgreSQL errors arrive as
# JournalError, scrubbed of the URL's password).
_STORE_ERRORS = (JournalError, sqlite3.Error, OSError)
PRESENCE = "gateway:"  # + identity
ENV_GROUP = "SMGRL_WORKER_GROUP"  # the supervisor's group token (shared SQLite lock)
ENV_FD = "SMGRL_WORKER_FD"  # the listening socket the supervisor bound
ENV_INDEX = "SMGRL_WORKER_INDEX"  # 0..N-1
ENV_READY_FD = "SMGRL_WORKER_READY_FD"  # a pipe: one JSON line once listening
ENV_LIFELINE_FD = "SMGRL_WORKER_LIFELINE_FD"  # a pipe: end-of-file once the supervisor is gone


def new_identity() -> str:
    """``host:pid:tag`` (the tag tells a restarted process with a reused pid apart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{new_tag(8)}"


@attrs.define(eq=False)
class Sharing:
    """This process's part in a group of gateways sharing one journal."""

    identity: str = attrs.Factory(new_identity)
    group: str | None = None  # SQLite --workers: the shared lock's group token
    fd: int | None = None  # SQLite --workers: the inherited listening socket
    index: int = 0
    ready_fd: int | None = None
    lifeline_fd: int | None = None  # reads EOF once the supervisor is gone
    ttl: float = LEASE_TTL_SECS
    # Open operations -> the process running them ('' for a lone gateway's), fed from the commit
    # path: shutdown records only this process's interrupted, never another live process's.
    owners: dict[str, str] = attrs.Factory(dict)
    held: set[str] = attrs.Factory(set)  # the duties' leases this process holds now

    @classmethod
    def from_env(cls, environ=os.environ) -> Sharing | None:
        group = environ.get(ENV_GROUP)
        if not group:
            return None
        fd = environ.get(ENV_FD)
        ready = environ.get(ENV_READY_FD)
        life = environ.get(ENV_LIFELINE_FD)
        return cls(
            group=group,
            fd=int(fd) if fd else None,
            index=int(environ.get(ENV_INDEX, "0")),
            ready_fd=int(ready) if ready else None,
            lifeline_fd=int(life) if life else None,
        )

    def committed(self, records) -> None:
        """From the journal's commit path: who runs which open operation."""
        for rec in records:
            kind = getattr(rec.event, "TYPE", None)
            if kind == "control.started":
                self.owners[rec.event.op_id] = rec.event.gateway or ""
            elif kind in ("control.finished", "control.interrupted"):
                self.owners.pop(rec.event.op_id, None)

    def mine(self, op_id: str) -> bool:
        return self.owners.get(op_id) == self.identity

    def report_ready(self, info: dict) -> None:
        """Tell the supervisor this process listens (one JSON line on its pipe), then close it."""
        if self.ready_fd is None:
            return
        try:
            os.write(self.ready_fd, (json.dumps(info) + "\n").encode())
        except OSError:
            pass  # the supervisor is gone: nothing to tell
        finally:
            os.close(self.ready_fd)
            self.ready_fd = None


async def _store_call(store, fn: Callable, *args):
    # In a thread: a lease is a write transaction, which may wait for another process's write
    # lock (SQLite: up to busy_timeout) or a network round trip (PostgreSQL); the event loop keeps
    # serving meanwhile. A few calls a second at most: the hop costs nothing that matters.
    return await trio.to_thread.run_sync(fn, *args)


async def presence(store, sharing: Sharing, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Renew this process's presence lease every ttl/3 until cancelled, then release it."""
    name = PRESENCE + sharing.identity
    await _store_call(store, store.take_lease, name, sharing.identity, sharing.ttl)
    task_status.started()
    try:
        while True:
            await trio.sleep(sharing.ttl / 3)
            try:
                await _store_call(store, store.take_lease, name, sharing.identity, sharing.ttl)
            except _STORE_ERRORS as exc:  # a busy or unreachable store: the next round retries
                log_event(log, "presence lease renewal failed", logging.WARNING, error=str(exc))
    finally:
        # Shielded and bounded: a clean stop frees the name at once (recovery need not wait ttl).
        with trio.CancelScope(shield=True), trio.move_on_after(2), contextlib.suppress(*_STORE_ERRORS):
            await _store_call(store, store.release_lease, name, sharing.identity)


async def run_leased(
    store,
    sharing: Sharing,
    name: str,
    duty: Callable[[], Awaitable[None]],
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``duty()`` only while this process holds lease ``name``; retry taking it every ttl/3.

    The duty is cancelled when a renewal says the lease was lost, or when ttl passed since the
    last good renewal (the store unreachable: another process may take it over by then)."""
    task_status.started()
    period = sharing.ttl / 3
    while True:
        try:
            lease = await _store_call(store, store.take_lease, name, sharing.identity, sharing.ttl)
        except _STORE_ERRORS as exc:
            log_event(log, "lease unavailable", logging.WARNING, lease=name, error=str(exc))
            lease = None
        if lease is None:
            await trio.sleep(period)
            continue
        log_event(log, "lease taken", lease=name, holder=sharing.identity, epoch=lease.epoch)
        sharing.held.add(name)
        try:
            await _hold(store, sharing, name, duty, period)
        finally:
            sharing.held.discard(name)
        log_event(log, "lease lost", logging.WARNING, lease=name, holder=sharing.identity)


async def _hold(store, sharing: Sharing, name: str, duty, period: float) -> None:
    # One nursery: the duty and its renewer. The renewer cancels the nursery (the duty with it)
    # when the lease is gone; a duty that returns leaves the lease held until the process stops
    # (nobody else must start it again meanwhile).
    async with trio.open_nursery() as nursery:

        async def renew() -> None:
            last_good = trio.current_time()
            while True:
                await trio.sleep(period)
                try:
                    await _store_call(store, store.renew_lease, name, sharing.identity, sharing.ttl)
                    last_good = trio.current_time()
                except LeaseLost:
                    nursery.cancel_scope.cancel()
                    return
                except _STORE_ERRORS as exc:
                    log_event(log, "lease renewal failed", logging.WARNING, lease=name, error=str(exc))
                    if trio.current_time() - last_good >= sharing.ttl:
                        nursery.cancel_scope.cancel()
                        return

        async def run_duty() -> None:
            await duty()
            await trio.sleep_forever()

        nursery.start_soon(renew)
        nursery.start_soon(run_duty)


async def recover_dead(store, writer, fleet, sharing: Sharing, refits=None) -> list[str]:
    """One round of the ``recovery`` duty: ``control.interrupted`` for the open operations whose
    process is gone (its presence lease can be taken: expired or released), then (``refits``, the
    RefitService) the open refit sagas of gone processes are resumed here, as a restart would."""
    dead: dict[str, bool] = {}
    items = []
    for op_id, op in list(fleet.operations.open.items()):
        owner = sharing.owners.get(op_id)
        if owner is None:
            owner = await _store_call(store, owner_from_journal, store, op_id)
        if owner == sharing.identity:
            continue
        if owner not in dead:
            dead[owner] = await _gone(store, sharing, owner)
        if not dead[owner]:
            continue
        targets = [t["worker_id"] for t in op.targets]
        items.append(
            (
                f"op:{op_id}",
                ControlInterrupted(
                    op_id=op_id,
                    reason="gateway_restart",
                    recorded_targets=[t for t in targets if t in op.outcomes],
                    missing_targets=[t for t in targets if t not in op.outcomes],
                ),
            )
        )
    if items:
        await writer.append_many(items)
        log_event(
            log,
            "recorded the operations of a stopped gateway process interrupted",
            logging.WARNING,
            operations=",".join(event.op_id for _, event in items),
        )
    pins = fleet.group_pins.pins
    if pins:
        # Prompt-group pins a gone process decided: their releases died with its requests.
        for owner in {pin.gateway for pin in pins.values()} - {sharing.identity} - dead.keys():
            dead[owner] = await _gone(store, sharing, owner)
        releases = gone_releases(
            dict(pins), lambda owner: owner != sharing.identity and dead.get(owner, False)
        )
        if releases:
            await writer.append_many(releases)
    if refits is not None:
        for refit_id in list(fleet.sagas.open):
            owner = await _store_call(store, saga_driver, store, refit_id)
            if owner == sharing.identity:
                continue
            if owner not in dead:
                dead[owner] = await _gone(store, sharing, owner)
            if dead[owner] and refits.resume(refit_id):
                log_event(
                    log, "resuming the refit of a stopped gateway process", logging.WARNING, refit_id=refit_id
                )
    return [event.op_id for _, event in items]


def owner_from_journal(store, ident: str) -> str:
    """The process recorded in an operation's ``control.started``."""
    for rec in store.read(stream=f"op:{ident}", types=["control.started"], limit=1):
        return getattr(rec.event, "gateway", None) or ""
    return ""


def saga_driver(store, refit_id: str) -> str:
    """The process driving saga ``refit_id`` now: the newest of its ``refit.started`` and of the
    ``refit.state`` events that name a process (``recovering``: a process that resumed the saga
    after its driver died). '' for a lone gateway's saga."""
    driver = ""
    for rec in store.read(stream=f"refit:{refit_id}", types=["refit.started", "refit.state"]):
        gateway = getattr(rec.event, "gateway", None)
        if gateway:
            driver = gateway
    return driver


async def _gone(store, sharing: Sharing, owner: str) -> bool:
    """Whether ``owner`` no longer runs: '' (a lone gateway's operation, from before sharing) or
    a process whose presence lease this one can take (then released again at once)."""
    if not owner:
        return True
    name = PRESENCE + owner
    lease = await _store_call(store, store.take_lease, name, sharing.identity, sharing.ttl)
    if lease is None:
        return False
    await _store_call(store, store.release_lease, name, sharing.identity)
    return True


async def recovery_duty(
    store, writer, fleet, sharing: Sharing, refits=None, *, task_status=trio.TASK_STATUS_IGNORED
) -> None:
    """The ``recovery`` lease's duty: a round every ttl/3 (an operation of a SIGKILLed process is
    recorded within about ttl of its death, plus a round)."""
    task_status.started()
    while True:
        await recover_dead(store, writer, fleet, sharing, refits)
        await trio.sleep(sharing.ttl / 3)

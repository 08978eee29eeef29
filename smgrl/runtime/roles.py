"""A gateway process's part on its journal, one object whatever the deployment (docs/scale-out.md).

``Alone``: the only process on its journal. It holds every lease from the start: each duty
(discovery, snapshots, health) runs at once and is never handed over; every open operation is its
own, so what an earlier process left open is recorded interrupted at startup and its sagas are
resumed; nothing is forwarded to it.

``Shared``: one of several processes on the journal (``smgrl launch --workers N``, or any
PostgreSQL journal; ``smgrl.cluster.sharing``). It follows the others' commits, proves it is alive
(presence), runs a duty only while it holds the duty's lease, recovers what dead processes left
open (the ``recovery`` duty), and listens on a private port the others forward to.

``serve`` asks the role, never whether the journal is shared.
"""

from __future__ import annotations

import socket
from functools import partial

import attrs
import trio
from hypercorn.config import Config as HyperConfig
from hypercorn.config import Sockets

from journal import ChangeWatcher
from smgrl.cluster.forwarding import Forwarder, Peer, owner_key, private_socket
from smgrl.cluster.sharing import Sharing, presence, recovery_duty, run_leased
from smgrl.core.config import Config
from smgrl.core.errors import StartupError
from smgrl.runtime.listeners import bind_http, inherited_http
from smgrl.telemetry.journaling import record_interrupted


@attrs.define(eq=False)
class Alone:
    """The lone gateway: the holder of every lease."""

    resumes_sagas = True  # every open saga is this process's to drive (a restart resumes them)
    lock_group: str | None = None  # an exclusive journal lock

    def http_sockets(self, hc: HyperConfig, cfg: Config) -> Sockets:
        return bind_http(hc, cfg)

    def private_socket(self, cfg: Config, backlog: int):
        return None  # nobody forwards to it

    def prepare(self, writer, restored) -> None:
        pass

    def wire(self, gateway, writer, store, cfg: Config, private) -> None:
        pass

    async def join(self, outer, side: list, writer, store, fleet, gateway) -> list[str]:
        """Startup recovery: every operation the journal shows open is an earlier process's."""
        return await record_interrupted(writer, fleet, "gateway_restart")

    async def announce(self, writer, gateway, store) -> None:
        if gateway.sessions is not None:
            # Sessions live in memory: those an earlier process left open are ended, in the
            # journal, before this one serves (their ids answer 410 session_gone).
            await gateway.sessions.end_previous(store)

    def recovery(self, store, writer, fleet, refits):
        return None  # done at startup (``join``): nobody else's operations to watch for

    async def start_duty(self, nursery, store, name: str, start) -> None:
        await nursery.start(start)

    def registered_elsewhere(self) -> bool:
        """A CLI engine URL refused as registered: no other process could have done it."""
        return False

    def served(self, sockets: Sockets, private) -> Sockets:
        return sockets

    def report_ready(self, info: dict) -> None:
        pass

    def mine(self):
        return None  # every open operation is this process's


@attrs.define(eq=False)
class Shared:
    """One of several processes sharing the journal."""

    sharing: Sharing
    resumes_sagas = False  # an open saga may be another live process's: the recovery duty decides

    @property
    def lock_group(self) -> str | None:
        return self.sharing.group

    def http_sockets(self, hc: HyperConfig, cfg: Config) -> Sockets:
        if self.sharing.fd is not None:
            return inherited_http(self.sharing.fd)
        return bind_http(hc, cfg)

    def private_socket(self, cfg: Config, backlog: int):
        """A private loopback listener, the same app, so that the others can reach THIS process
        (the shared port reaches any): smgrl/cluster/forwarding.py."""
        try:
            # --forward-port pins it: worker i of --workers N takes PORT + i.
            port = cfg.forward_port + self.sharing.index if cfg.forward_port else 0
            return private_socket(backlog, port)
        except OSError as exc:
            where = f"127.0.0.1:{port}" if port else "127.0.0.1"
            raise StartupError(
                f"cannot listen on {where} (the private port other gateway processes forward to"
                f"{', --forward-port' if port else ''}): {exc.strerror or exc}"
            ) from None

    def prepare(self, writer, restored) -> None:
        # Several writers: on_commit gets every process's events, in seq order, from the seq the
        # projections were restored to (docs/journal.md, "Several writers").
        writer.position = restored.head

    def wire(self, gateway, writer, store, cfg: Config, private) -> None:
        sharing = self.sharing
        gateway.control.identity = sharing.identity
        gateway.sharing = sharing
        committed = writer.on_commit

        def on_commit(records) -> None:
            sharing.committed(records)
            committed(records)

        writer.on_commit = on_commit
        if private is not None:
            gateway.forwarder = _forwarder(cfg, store, sharing, private)
            if gateway.sessions is not None:
                # Its session ids name this process, so every other process can find it.
                gateway.sessions.owner = gateway.forwarder.me.owner

    async def join(self, outer, side: list, writer, store, fleet, gateway) -> list[str]:
        """The tail: the other processes' events reach the projections within the watcher's
        interval (woken at once by a local append). Then this process's presence; what a dead
        process left open is the recovery lease's duty (nothing recorded interrupted here)."""
        # The first change_token() of a PostgreSQL store opens its LISTEN connection and waits
        # (up to 10 s) until it has subscribed, so that no commit goes unnoticed: taken in a
        # thread, the event loop never blocks on it (later calls return at once).
        await trio.to_thread.run_sync(store.change_token)
        watcher = ChangeWatcher(store)
        await outer.start(_in_scope, side, writer.follow, watcher)
        if gateway.dataplane.pins is not None:
            # Prompt-group pin releases no pin decision took along (smgrl/dataplane/pins.py).
            await outer.start(_in_scope, side, gateway.dataplane.pins.run)
        await outer.start(_in_scope, side, presence, store, self.sharing)
        return []

    async def announce(self, writer, gateway, store) -> None:
        if gateway.forwarder is not None:
            me = gateway.forwarder.me
            await writer.append(f"peer:{me.owner}", me.event())

    def recovery(self, store, writer, fleet, refits):
        return partial(recovery_duty, store, writer, fleet, self.sharing, refits)

    async def start_duty(self, nursery, store, name: str, start) -> None:
        await nursery.start(run_leased, store, self.sharing, name, _as_duty(start))

    def registered_elsewhere(self) -> bool:
        return True  # another process registered it first (409)

    def served(self, sockets: Sockets, private) -> Sockets:
        if private is None:
            return sockets
        return Sockets(
            secure_sockets=[], insecure_sockets=[*sockets.insecure_sockets, private], quic_sockets=[]
        )

    def report_ready(self, info: dict) -> None:
        self.sharing.report_ready(info)

    def mine(self):
        return self.sharing.mine  # only this process's operations; the others still run


def role_for(sharing: Sharing | None) -> Alone | Shared:
    return Alone() if sharing is None else Shared(sharing)


async def _in_scope(scopes: list, fn, *args, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """Run ``fn`` in a cancel scope appended to ``scopes`` (the caller cancels them all)."""
    with trio.CancelScope() as scope:
        scopes.append(scope)
        await fn(*args, task_status=task_status)


def _as_duty(start):
    """A duty for ``run_leased``: the service's ``run`` (a trio task taking ``task_status``)."""

    async def duty() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(start)

    return duty


def _forwarder(cfg: Config, store, sharing: Sharing, private) -> Forwarder:
    port = private.getsockname()[1]
    owner = owner_key(sharing.identity)
    me = Peer(sharing.identity, owner, socket.gethostname(), f"http://127.0.0.1:{port}", cfg.advertise_url)
    return Forwarder(store, me)

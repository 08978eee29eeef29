"""Requests for another gateway process's session or refit saga, forwarded to that process
(docs/scale-out.md, "Forwarding").

With several gateway processes on one journal (``--workers N``, or gateways on several hosts on
PostgreSQL), an agent session lives in the memory of the process that created it (its turn
state, its in-flight engine calls), and a distributed refit's trainer hand-off (``commit``,
``fail``, ``transfer``) belongs to the process driving the saga. A request for either that lands
on another process is forwarded, whole, to the owner:

* Each process also listens on a private loopback port (``127.0.0.1:0``, the same app as its
  public port: the same keys are checked) and journals ``gateway.peer`` on stream
  ``peer:<owner>`` once at start: its identity, the ``owner`` part of its session ids
  (:func:`owner_key` of the identity), its host, that loopback URL and ``--advertise-url``.
* The owner of a request: a session id names it (``<owner>-<32 hex>``); a client-chosen TITO id
  is looked up in its ``session.created``; a saga's ``refit.started`` names its process. The
  owner's ``gateway.peer`` is read from the store (cached): no projection lags behind here.
* Same host: the owner's loopback URL. Another host: its ``--advertise-url`` (whose process, if
  it is not the owner, forwards once more over loopback: at most two hops, counted in
  ``x-smgrl-forwarded``). The request goes as it came (method, path, query, body, the caller's
  own headers, ``authorization`` included: the owner checks the caller's key again, as for any
  request; the receiving process checked it before forwarding). The answer streams back as the
  owner sends it.
* Nothing here logs a header; secrets are never journaled (``gateway.peer`` holds URLs only,
  ``--advertise-url`` is refused with credentials).
* Only to a process holding its presence lease (``_check_live``): a gone process's port may be
  another program's by now, and the request carries the caller's key.
* The owner gone (its presence lease not held, or its loopback port refuses): :class:`PeerGone`;
  the caller answers 410 ``session_gone`` for a session, 503 ``refit_driver_unavailable`` for a
  refit hand-off (retryable: the recovery lease holder resumes the saga and names itself its
  driver; the hand-off's route bounds a driver that hangs).
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
from collections import OrderedDict
from collections.abc import Iterable

import attrs
import trio

from smgrl.cluster.sharing import PRESENCE, saga_driver
from smgrl.events import GatewayPeer
from smgrl.telemetry.logs import event as log_event
from smgrl.upstream import ConnectError, PoolSet, ReadError

log = logging.getLogger("smgrl.forwarding")

FORWARDED = b"x-smgrl-forwarded"  # hops so far (1: sent by the receiving process)
FORWARDED_TO = b"x-smgrl-forwarded-to"  # the owner the request was meant for
MAX_HOPS = 2
# Headers of one connection, not of the request (RFC 9110 §7.6.1), and those the client sets.
_HOP_BY_HOP = frozenset(
    (
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"host",
        b"content-length",
        FORWARDED,
        FORWARDED_TO,
    )
)
_CACHED = 1024
# How long a peer seen holding its presence lease is trusted to still hold it (capped by the
# lease's own expiry): a forwarded request re-reads the lease at most this often per peer.
LIVE_CHECK_SECS = 1.0
# A presence lease that lapsed this recently still counts for forwarding: an event loop stalled a
# few seconds (a huge prompt tokenized) misses its renewals while the process lives; its port is
# still its own. Past this, or released (a clean stop, or a recovery round found it gone), never.
LAPSED_GRACE_SECS = 30.0


def owner_key(identity: str) -> str:
    """The owner part of a process's session ids (12 hex, as ``sessions.state.new_owner_id``)."""
    return hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()


@attrs.frozen
class Peer:
    gateway: str  # host:pid:tag
    owner: str  # owner_key(gateway)
    host: str
    url: str  # the private loopback listener
    advertise_url: str | None = None

    def event(self):
        return GatewayPeer(
            gateway=self.gateway,
            owner=self.owner,
            host=self.host,
            url=self.url,
            advertise_url=self.advertise_url,
        )


class PeerGone(Exception):
    """The owning process does not answer (gone), or cannot be reached from here."""


class PeerUnreachable(PeerGone):
    """The owning process cannot be reached from here at all (another host without
    ``--advertise-url``, or the hop limit): retrying the request cannot help."""


def private_socket(backlog: int, port: int = 0) -> socket.socket:
    """The private listener: loopback only, ``port`` (0: a free one). Listening at once (unlike
    the public port): its URL is journaled before the server accepts, and a request forwarded in
    between waits in the backlog instead of being refused as if this process were gone."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def hops(headers: Iterable[tuple[bytes, bytes]]) -> int:
    """How many times this request was forwarded already (a value that is not a small number
    counts as the maximum: never forwarded again)."""
    for name, value in headers:
        if name == FORWARDED:
            return int(value) if value.isdigit() and len(value) < 3 else MAX_HOPS
    return 0


def forwarded_to(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The owner a forwarded request was sent for (None: not forwarded, or not named)."""
    for name, value in headers:
        if name == FORWARDED_TO:
            return value.decode("latin-1")
    return None


class Forwarder:
    """This process's peer directory (read from the journal) and its forwarding client."""

    def __init__(self, store, me: Peer, pools: PoolSet | None = None) -> None:
        self.store = store
        self.me = me
        # Own pools: the engines' PoolSet is keyed by engine origin and closed with them.
        self.pools = pools or PoolSet(max_idle=8)
        self._peers: OrderedDict[str, Peer] = OrderedDict()
        self._live: OrderedDict[str, float] = OrderedDict()  # gateway -> trusted live until (time.time)

    async def aclose(self) -> None:
        await self.pools.aclose()

    # -- the directory ------------------------------------------------------------------------

    async def peer(self, owner: str) -> Peer | None:
        """The process whose session ids start with ``owner`` (None: no such process journaled
        its address: a lone gateway's, or an earlier one's)."""
        if owner == self.me.owner:
            return self.me
        found = self._peers.get(owner)
        if found is None:
            found = await trio.to_thread.run_sync(self._read_peer, owner)
            if found is None:
                return None
            self._peers[owner] = found
            while len(self._peers) > _CACHED:
                self._peers.popitem(last=False)
        return found

    def _read_peer(self, owner: str) -> Peer | None:
        for rec in self.store.read(stream=f"peer:{owner}", types=["gateway.peer"], limit=1):
            e = rec.event
            return Peer(e.gateway, e.owner, e.host, e.url, e.advertise_url)
        return None

    async def live_peers(self) -> list[Peer]:
        """The other processes that journaled an address and hold their presence lease now."""
        return await trio.to_thread.run_sync(self._read_live_peers)

    def _read_live_peers(self) -> list[Peer]:
        now = time.time()  # the leases' clock (smgrl/cluster/sharing.py)
        out = []
        for rec in self.store.read(types=["gateway.peer"]):
            e = rec.event
            expires = self._presence(e.gateway) if e.gateway != self.me.gateway else None
            if expires is not None and expires > now:
                out.append(Peer(e.gateway, e.owner, e.host, e.url, e.advertise_url))
        return out

    def _presence(self, gateway: str) -> float | None:
        """When ``gateway``'s presence lease expires (or expired) while that process is its
        holder; None when it released it, or another took it over."""
        lease = self.store.lease(PRESENCE + gateway)
        return lease.expires if lease is not None and lease.holder == gateway else None

    async def _check_live(self, peer: Peer) -> None:
        """PeerGone unless ``peer`` holds its presence lease (or it lapsed within
        LAPSED_GRACE_SECS): a process that is gone (even one of an earlier run, whose
        ``gateway.peer`` stays in the journal) may have left its port to another program, which
        must never get a caller's request (its key)."""
        if peer.gateway == self.me.gateway:
            return
        now = time.time()
        if self._live.get(peer.gateway, 0.0) > now:
            return
        expires = await trio.to_thread.run_sync(self._presence, peer.gateway)
        if expires is None or expires + LAPSED_GRACE_SECS <= now:
            self._live.pop(peer.gateway, None)
            raise PeerGone(
                f"gateway process {peer.gateway} does not answer (it is not running: its presence"
                " lease is not held)"
            )
        self._live[peer.gateway] = now + LIVE_CHECK_SECS
        self._live.move_to_end(peer.gateway)
        while len(self._live) > _CACHED:
            self._live.popitem(last=False)

    async def session_owner(self, sid: str) -> tuple[str | None, int]:
        """The owner of an open session with a client-chosen id (SMG's lazily created TITO
        sessions), from its ``session.*`` events (None when none is open), and the journal
        position it was decided on: a creation decided on it is appended only if no other
        process created the session after it (``Expect``)."""
        return await trio.to_thread.run_sync(self._read_session_owner, sid)

    def _read_session_owner(self, sid: str) -> tuple[str | None, int]:
        position = self.store.last_seq()  # first: every event up to it is in the read below
        owner = None
        kinds = ["session.created", "session.deleted", "session.ended"]
        for rec in self.store.read(stream=f"session:{sid}", types=kinds):
            owner = rec.event.owner if rec.event.TYPE == "session.created" else None
        return owner, position

    async def saga_peer(self, refit_id: str) -> Peer | None:
        """The process driving refit ``refit_id`` (the newest to start or resume it, from the
        store: :func:`smgrl.cluster.sharing.saga_driver`), unless this one."""
        gateway = await trio.to_thread.run_sync(saga_driver, self.store, refit_id)
        if not gateway or gateway == self.me.gateway:
            return None
        return await self.peer(owner_key(gateway))

    def target(self, peer: Peer, hops_so_far: int) -> str:
        """The URL to forward to: the peer's loopback listener on this host, its advertised URL
        from another host; PeerGone when it cannot be reached from here."""
        if hops_so_far >= MAX_HOPS:
            raise PeerUnreachable(f"the request was forwarded {hops_so_far} times already")
        if peer.host == self.me.host:
            return peer.url
        if hops_so_far == 0 and peer.advertise_url:
            return peer.advertise_url
        raise PeerUnreachable(
            f"gateway process {peer.gateway} runs on another host and has no --advertise-url"
            if not peer.advertise_url
            else f"the request was already forwarded to host {self.me.host}"
        )

    # -- forwarding ---------------------------------------------------------------------------

    def _headers(self, headers: Iterable[tuple[bytes, bytes]], peer: Peer, hops_so_far: int):
        out = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP]
        out.append((FORWARDED, b"%d" % (hops_so_far + 1)))
        out.append((FORWARDED_TO, peer.owner.encode()))
        return out

    async def asgi(self, peer: Peer, scope, body: bytes, send, hops_so_far: int) -> None:
        """Forward this ASGI request (its body already read) to ``peer`` and stream the answer
        back. PeerGone before anything was sent when the peer does not answer; a peer that
        breaks off mid-answer ends this answer too (the connection is closed). The caller
        cancels it when its client goes (the owner then sees its connection close, and cancels
        the turn as for a client of its own)."""
        url = self.target(peer, hops_so_far)
        await self._check_live(peer)
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        headers = self._headers(scope["headers"], peer, hops_so_far)
        started = False
        try:
            async with self.pools.get(url).stream(
                scope["method"], target.decode("latin-1"), headers=headers, body=body
            ) as resp:
                out = [(k, v) for k, v in resp.headers if k not in _HOP_BY_HOP]
                await send({"type": "http.response.start", "status": resp.status, "headers": out})
                started = True
                async for chunk in resp.aiter_chunks():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (ConnectError, ReadError) as exc:
            self._gone(peer, exc)
            if not started:
                raise PeerGone(self._why(peer)) from None
            raise  # mid-answer: the server closes the client's connection

    async def request(
        self, peer: Peer, method: str, target: str, headers, body: bytes, hops_so_far: int
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """One whole exchange with ``peer`` (small answers: the refit hand-off)."""
        url = self.target(peer, hops_so_far)
        await self._check_live(peer)
        try:
            resp, data, _ = await self.pools.get(url).request(
                method, target, headers=self._headers(headers, peer, hops_so_far), body=body
            )
        except (ConnectError, ReadError) as exc:
            self._gone(peer, exc)
            raise PeerGone(self._why(peer)) from None
        return resp.status, [(k, v) for k, v in resp.headers if k not in _HOP_BY_HOP], data

    def _gone(self, peer: Peer, exc: Exception) -> None:
        # The error names the peer's address only: never a header of the request.
        log_event(
            log,
            "forwarding failed: the owning process does not answer",
            logging.WARNING,
            gateway=peer.gateway,
            error=str(exc),
        )

    @staticmethod
    def _why(peer: Peer) -> str:
        return f"gateway process {peer.gateway} does not answer (it stopped or was killed)"

"""Many exchanges driven by ONE task: the fan-out's engine calls on kept-alive connections.

A fan-out sends the same small request to N engines. Through ``EnginePool.stream`` each call is
a task of its own with its cancel scope, its context manager, its ``Response`` and its own
readiness wait (two ``epoll_ctl`` calls and a scheduler pass per engine). Profiled, that per-call
machinery was most of a 64-engine fan-out's CPU (docs/benchmarks.md). A ``Batch`` instead writes
every request from the caller's task, registers the sockets in a private epoll, and waits on
that epoll's own fd with one ``trio.lowlevel.wait_readable``: one wait per round of answers,
whatever the number of engines in flight.

Only what is cheap to get right goes in a batch: a plain-TCP connection taken from a pool's idle
stack (``EnginePool.take_idle``). The caller sends everything else (no idle connection, TLS, a
stale connection) through ``EnginePool.stream`` as before. The rules are the pool's:

- ownership: ``start`` takes the connection off the idle stack; it goes back (``give_back``) only
  when the response ended, keep-alive allows it and no byte is left over; every other way out
  closes it (``close`` closes all that are still in flight, synchronously);
- a reused connection that fails before any response byte (write error, EOF, reset) is
  ``stale``: the engine never read the request, so the caller may send it again elsewhere
  (``pool.py`` explains why that is safe);
- each exchange has its own deadline; the caller turns a passed one into its timeout outcome;
- at most ``limit`` body bytes are kept; a longer body stops the read and closes the connection.

Cancellation: ``wait`` is the only checkpoint. When it raises ``trio.Cancelled`` the caller's
``finally`` calls ``close`` (or ``release``, to use the batch again), which closes every
connection still in flight (never pooled: their state is unknown).
"""

from __future__ import annotations

import contextlib
import os
import select
from collections.abc import Hashable

import trio

from smgrl.upstream.connection import RECEIVE_SIZE
from smgrl.upstream.errors import UpstreamError
from smgrl.upstream.http11 import NEED_DATA, Data, EndOfMessage, Head, ResponseParser, simple_response
from smgrl.upstream.pool import EnginePool

__all__ = ["Batch", "Done"]

_IN = select.EPOLLIN
_OUT = select.EPOLLOUT


class Done:
    """One finished exchange of a batch. ``error`` is None (an answer: ``status``, ``data``),
    ``"stale"`` (send it again elsewhere), ``"timeout"`` (the deadline passed; ``got_head`` says
    whether the head had arrived), or ``"read"`` (the connection broke or the answer was not
    HTTP; ``detail`` says how)."""

    __slots__ = ("content_type", "data", "detail", "error", "got_head", "status", "token", "truncated")

    def __init__(self, token: Hashable, error: str | None, got_head: bool = False, detail: str = "") -> None:
        self.token = token
        self.error = error
        self.got_head = got_head
        self.detail = detail
        self.status = 0
        self.content_type: bytes | None = None
        self.data = b""
        self.truncated = False


class _Pending:
    __slots__ = (
        "connection",
        "deadline",
        "fd",
        "head",
        "keep_alive",
        "method",
        "out",
        "parser",
        "pieces",
        "pool",
        "received",
        "size",
        "token",
    )  # fmt: skip

    def __init__(self, token, pool, connection, fd, out, method, deadline, keep_alive) -> None:
        self.token = token
        self.pool = pool
        self.connection = connection
        self.fd = fd
        self.out = out  # request bytes not yet taken by the kernel
        # Made on first need (``_parser``): the usual answer is read whole by ``simple_response``.
        self.parser: ResponseParser | None = None
        self.method = method
        self.deadline = deadline
        self.keep_alive = keep_alive
        self.head: Head | None = None
        self.pieces: list[bytes] = []
        self.size = 0
        self.received = False  # any response byte (a failure after one is not "stale")


def _parser(pending: _Pending) -> ResponseParser:
    if pending.parser is None:
        pending.parser = ResponseParser(pending.method)
    return pending.parser


class Batch:
    """Exchanges in flight on one private epoll. One task uses it: ``start``, ``wait``, then
    ``release`` (kept for the next fan-out, empty) or ``close``."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._epoll = select.epoll()
        # fd -> the connection registered in the epoll under it. A connection handed back to its
        # pool stays registered (EPOLLIN, level-triggered), so that the next exchange on it
        # through this batch needs no ``epoll_ctl`` at all. Registered for the same connection
        # object means registered for the same open socket: the kernel drops a registration
        # when its socket closes, and a closed connection is never taken again. An fd that
        # becomes ready while no exchange of the batch is on it (an idle connection the engine
        # closed, or one another task is using) is unregistered there and then (``wait``).
        self._registered: dict[int, object] = {}
        self._live: dict[int, _Pending] = {}
        # The kept registrations found readable by one ``poll(0)`` of the epoll, taken at the
        # first ``start`` after each wait (None: take it again). Every other kept registration
        # is of a connection silent since: the pool's idle check of it (a poll syscall per
        # connection) is skipped (``_quiet``). ``start`` runs no await, so nothing arrives
        # unseen between this poll and the request's write that the pool's own check, made at
        # the same point, would have seen.
        self._readable: set[int] | None = None

    def __len__(self) -> int:
        return len(self._live)

    def start(
        self,
        token: Hashable,
        pool: EnginePool,
        method: str,
        request: bytes,
        deadline: float,
        *,
        keep_alive: bool = True,
    ) -> Done | bool:
        """Send ``request`` (serialised) on one of ``pool``'s idle plain connections. False when
        the pool has none (send it through ``pool.stream``); a ``Done`` when it failed at once
        (stale); True when it is in flight."""
        if self._readable is None:
            self._readable = {fd for fd, _ in self._epoll.poll(0)} if self._registered else set()
        connection = pool.take_idle(self._quiet)
        if connection is None:
            return False
        fd = connection.fd
        # From here this batch owns the connection: every path below registers it or gives it up.
        try:
            sent = os.write(fd, request)
        except BlockingIOError:
            sent = 0
        except OSError:
            pool.give_back(connection, reusable=False)
            return Done(token, "stale")
        pending = _Pending(token, pool, connection, fd, request[sent:], method, deadline, keep_alive)
        self._watch(fd, connection, _OUT if pending.out else _IN)
        self._live[fd] = pending
        return True

    async def wait(self, scope: trio.CancelScope | None = None) -> list[Done]:
        """The exchanges that finished: answers, failures and passed deadlines; none when the
        readiness it met finished nothing (then it is a checkpoint: the caller waits again).

        ``scope``: a cancel scope of the caller's, around its whole loop of waits, whose deadline
        this brings forward to the soonest exchange's before it waits. When that deadline passes, the
        wait raises ``Cancelled`` into the caller's scope (nothing of the batch changed); the
        caller then opens a new scope and waits again, which reports the passed deadlines. One
        scope per fan-out instead of one per wait: entering and leaving a cancel scope was about
        a tenth of a fan-out's engine-call CPU (docs/benchmarks.md). Without ``scope``, each
        wait opens its own."""
        self._readable = None  # an await follows: the next start polls again
        if not self._live:
            return []
        ready = self._epoll.poll(0)
        if not ready:
            soonest = min(p.deadline for p in self._live.values())
            if scope is None:
                with trio.move_on_at(soonest):
                    await trio.lowlevel.wait_readable(self._epoll.fileno())
            elif soonest > trio.current_time():
                # A deadline already passed is not waited for (the new scope would be cancelled
                # at once, again and again): the sweep below reports it. The scope's deadline
                # only ever moves earlier (setting it is not free): one still set for an
                # exchange that has finished wakes the caller early, which then waits again.
                if scope.deadline > soonest:  # noqa: PLR1730 - min() would set it every time
                    scope.deadline = soonest
                await trio.lowlevel.wait_readable(self._epoll.fileno())
            ready = self._epoll.poll(0)
        done = []
        for fd, events in ready:
            pending = self._live.get(fd)
            if pending is None:
                self._drop(fd)  # a kept registration of a connection the batch is not using
                continue
            result = self._on_ready(pending, events)
            if result is not None:
                done.append(result)
        now = trio.current_time()
        for pending in [p for p in self._live.values() if p.deadline <= now]:
            self._forget(pending, reusable=False)
            done.append(Done(pending.token, "timeout", pending.head is not None))
        if not done:
            # Readiness that finished nothing (part of an answer, or a kept registration dropped
            # above, which a duplicated fd can keep in the kernel's set): the caller waits again
            # at once, so yield here. Such readiness then costs one pass of the loop, never a
            # spin that starves the engines it waits for.
            await trio.lowlevel.checkpoint()
        return done

    def release(self) -> None:
        """Close every connection still in flight (cancelled or abandoned) and keep the epoll,
        empty, for the next use of this batch (``close`` ends it): a fan-out then makes no
        ``epoll_create1``, ``close`` and first registration with trio's own epoll of its own."""
        self._readable = None
        live, self._live = self._live, {}
        for pending in live.values():
            # Out of the epoll before the socket closes: the kernel drops a closed fd's
            # registration only once no duplicate of it is left.
            self._drop(pending.fd)
            pending.pool.give_back(pending.connection, reusable=False)

    def close(self) -> None:
        """Close every connection still in flight (cancelled or abandoned), then the epoll."""
        self.release()
        self._registered.clear()
        self._epoll.close()

    # -- internals -----------------------------------------------------------------------------

    def _quiet(self, connection: object) -> bool:
        """Registered here for this very connection, and not readable at this round's poll."""
        fd = connection.fd  # type: ignore[attr-defined]
        return self._registered.get(fd) is connection and fd not in self._readable  # type: ignore[operator]

    def _watch(self, fd: int, connection: object, events: int) -> None:
        if self._registered.get(fd) is connection:
            if events != _IN:  # kept registrations are EPOLLIN
                self._epoll.modify(fd, events)
            return
        try:
            self._epoll.register(fd, events)
        except FileExistsError:  # pragma: no cover - a registration the kernel did not drop
            self._epoll.modify(fd, events)
        self._registered[fd] = connection

    def _drop(self, fd: int) -> None:
        """Out of the epoll (before its socket closes, or when it is not the batch's)."""
        self._registered.pop(fd, None)
        with contextlib.suppress(OSError, ValueError):  # already gone with its socket
            self._epoll.unregister(fd)

    def _forget(self, pending: _Pending, *, reusable: bool) -> None:
        del self._live[pending.fd]
        if not reusable:
            self._drop(pending.fd)  # closed below; a pooled one stays registered (_registered)
        pending.pool.give_back(pending.connection, reusable=reusable)

    def _on_ready(self, pending: _Pending, events: int) -> Done | None:
        if pending.out:
            try:
                sent = os.write(pending.fd, pending.out)
            except BlockingIOError:
                return None
            except OSError:
                self._forget(pending, reusable=False)
                return Done(pending.token, "stale")
            pending.out = pending.out[sent:]
            if not pending.out:
                self._epoll.modify(pending.fd, _IN)
            return None
        try:
            data = os.read(pending.fd, RECEIVE_SIZE)
        except BlockingIOError:
            return None
        except OSError as exc:
            data = None
            why = f"socket connection broken: {exc}"
        if not data:
            if not pending.received:
                # Nothing of an answer arrived on a reused connection: the engine had closed it.
                self._forget(pending, reusable=False)
                return Done(pending.token, "stale")
            if data is None:
                self._forget(pending, reusable=False)
                return Done(pending.token, "read", pending.head is not None, why)
            _parser(pending).feed_eof()
        else:
            if not pending.received and pending.method != "HEAD":
                whole = simple_response(data)
                if whole is not None:  # the usual answer, read without the parser's events
                    return self._whole(pending, *whole)
            pending.received = True
            _parser(pending).feed(data)
        try:
            return self._parse(pending)
        except UpstreamError as exc:
            self._forget(pending, reusable=False)
            return Done(pending.token, "read", pending.head is not None, str(exc))

    def _parse(self, pending: _Pending) -> Done | None:
        parser = _parser(pending)
        while True:
            event = parser.next_event()
            if event is NEED_DATA:
                return None
            kind = type(event)
            if kind is Head:
                if event.status >= 200:  # type: ignore[union-attr]  (1xx interims are skipped)
                    pending.head = event  # type: ignore[assignment]
            elif kind is Data:
                pending.pieces.append(event.data)  # type: ignore[union-attr]
                pending.size += len(event.data)  # type: ignore[union-attr]
                if pending.size > self._limit:
                    self._forget(pending, reusable=False)  # nothing drained: the body may be huge
                    return self._answer(pending, truncated=True)
            elif kind is EndOfMessage:
                self._forget(pending, reusable=pending.keep_alive and parser.reusable)
                return self._answer(pending, truncated=False)

    def _whole(self, pending: _Pending, status: int, headers: list, data: bytes) -> Done:
        truncated = len(data) > self._limit
        # As ``_parse`` would end it: pooled unless the body is over the limit (then closed).
        self._forget(pending, reusable=pending.keep_alive and not truncated)
        done = Done(pending.token, None, True)
        done.status = status
        for key, value in headers:
            if key == b"content-type":
                done.content_type = value
                break
        done.data = data[: self._limit] if truncated else data
        done.truncated = truncated
        return done

    def _answer(self, pending: _Pending, *, truncated: bool) -> Done:
        head = pending.head
        done = Done(pending.token, None, True)
        done.status = head.status  # type: ignore[union-attr]
        for key, value in head.headers:  # type: ignore[union-attr]
            if key == b"content-type":
                done.content_type = value
                break
        data = pending.pieces[0] if len(pending.pieces) == 1 else b"".join(pending.pieces)
        done.data = data[: self._limit] if truncated else data
        done.truncated = truncated
        return done

"""What a server hands one request's ASGI app: its body and disconnect (``AppQueue``), and the
two scope extensions smgrl's routes use: ``DisconnectHook`` (a scope cancelled when the client
leaves, without a task) and ``AppQueue.get_nowait`` (``smgrl.receive_nowait``). Both smgrl's own
HTTP/1.1 server and the patched hypercorn (its test reference) offer them."""

from __future__ import annotations

from collections import deque

import trio

# The ASGI scope extensions smgrl's servers offer an app: ``DisconnectHook``, and
# ``AppQueue.get_nowait`` (the next message if it is there, else None: no wait, no deadline).
DISCONNECT_EXTENSION = "smgrl.disconnect"
RECEIVE_NOWAIT = "smgrl.receive_nowait"


class DisconnectHook:
    """Cancels a scope when the client leaves before its answer is complete, with no task.

    The only way an ASGI app learns of a disconnect is ``http.disconnect`` from ``receive()``,
    so an app that must stop work when its client leaves (the data plane's engine call) has to
    keep a second task waiting in ``receive()`` for the whole request: a task spawn, a nursery
    and a cancellation per request. The server's connection reader already notices the
    disconnect; through this hook it cancels the app's scope directly. A disconnect that only
    follows a complete answer (the end of every request) is not a client leaving and
    cancels nothing."""

    __slots__ = ("_scope", "gone")

    def __init__(self) -> None:
        self._scope: trio.CancelScope | None = None
        self.gone = False

    def cancel_on_disconnect(self, scope: trio.CancelScope | None) -> None:
        """Cancel ``scope`` when the client leaves (at once if it already has); None detaches."""
        self._scope = scope
        if self.gone and scope is not None:
            scope.cancel()

    def _disconnected(self) -> None:
        self.gone = True
        if self._scope is not None:
            self._scope.cancel()


class AppQueue:
    """What the server's reader hands one request's app (body chunks, then the disconnect): stock
    hypercorn's bounded memory channel, without its scheduler passes.

    Every ``send`` and every ``receive`` of a trio memory channel ends with a schedule point,
    even when the message is already there or the buffer has room: a small ``POST`` cost the
    reader two passes (chunk, end of body) and the app one, and each pass is a trip through
    trio's run loop (3 of a kept-alive rollout request's 6, docs/benchmarks.md). Here ``put`` and ``get``
    return at once when they can, and wait (cancellably) only when they must: ``put`` on a full
    queue (``max_app_queue_size``: the reader stops reading, as in stock), ``get`` on an empty
    one. ``close`` is the disconnect: ``get`` returns what was queued, then ``http.disconnect``
    on every later call; a ``put`` waiting for room, or after the close, drops its message (the
    stream is over). Channel creation also went through a ``typing`` subscript per request
    (trio's ``open_memory_channel``).

    ``get`` joins the body chunks already queued behind the one it takes (ASGI gives chunk
    boundaries no meaning): a small body and its end-of-body message come in one ``receive()``.
    """

    __slots__ = ("_closed", "_getters", "_items", "_max", "_putters")

    def __init__(self, max_size: int) -> None:
        self._items: deque = deque()
        self._max = max(1, max_size)
        self._closed = False
        # Parking lots made on first use: almost no request ever waits on either.
        self._getters: trio.lowlevel.ParkingLot | None = None
        self._putters: trio.lowlevel.ParkingLot | None = None

    async def put(self, message) -> None:
        while len(self._items) >= self._max and not self._closed:
            if self._putters is None:
                self._putters = trio.lowlevel.ParkingLot()
            await self._putters.park()
        if self._closed:
            return  # the client left (or the app's stream ended): nobody will read it
        self._items.append(message)
        if self._getters:
            self._getters.unpark()

    def close(self) -> None:
        self._closed = True
        if self._getters:
            self._getters.unpark_all()
        if self._putters:
            self._putters.unpark_all()

    async def get(self):
        items = self._items
        while not items:
            if self._closed:
                return {"type": "http.disconnect"}
            if self._getters is None:
                self._getters = trio.lowlevel.ParkingLot()
            await self._getters.park()
        return self._take()

    def get_nowait(self):
        """What ``get`` would return without waiting, else None (nothing queued yet)."""
        if self._items:
            return self._take()
        return {"type": "http.disconnect"} if self._closed else None

    def _take(self):
        items = self._items
        message = items.popleft()
        if items and message.get("more_body"):
            message = _merge_queued(message, items)
        if self._putters:
            self._putters.unpark_all()  # room again
        return message


def _merge_queued(message, items: deque):
    """``message`` (an ``http.request`` with ``more_body``) joined with the body chunks queued in
    ``items`` behind it (taken from it); the last one's ``more_body`` is the result's."""
    chunks = [message.get("body", b"")]
    more = True
    while more and items:
        following = items.popleft()
        chunks.append(following.get("body", b""))
        more = following.get("more_body", False)
    body = b"".join(chunks) if any(chunks[1:]) else chunks[0]
    return {"type": "http.request", "body": body, "more_body": more}

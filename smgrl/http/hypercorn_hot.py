"""Two per-request speed-ups of the patched hypercorn (patches 14 and 15 of
``smgrl.http.hypercorn_patches``; docs/hypercorn-patches.md has each one's reason and measurement).

14. ``headers_iter``: h11's ``Headers`` iterated in C. It is a ``Sequence`` without an ``__iter__``
    of its own, so every ``for name, value in headers`` (h11's own Host check, hypercorn's two
    header scans and its ``list(request.headers)``, four per request) went through
    ``Sequence.__iter__`` and a Python ``__getitem__`` per header. The pairs are the same.
15. ``app_send``: a response's last body message over HTTP/1.1 goes to the connection in one
    step: its data, the end of the message and the close of the stream without the three
    hypercorn events (``Body``, ``EndBody``, ``StreamClosed``) and their dispatch, in the order
    and with the writes of patch 5 (one write for the head, the body and a chunked end).
    Anything else is stock ``HTTPStream.app_send``.
"""

from __future__ import annotations

from time import time
from typing import Any

import h11
from hypercorn.protocol import h11 as h11_protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.utils import suppress_body

# The attribute on ``H11Protocol`` holding a response head not yet written (patch 5's
# ``_coalescing_stream_send`` sets it; ``end_of_message`` below writes it with the body).
PENDING_HEAD = "_smgrl_head"
_CLOSED = ASGIHTTPState.CLOSED
_RESPONSE = ASGIHTTPState.RESPONSE
_H11 = h11_protocol.H11Protocol
_RawData = h11_protocol.RawData


def headers_iter(self):
    """``h11._headers.Headers.__iter__``: the (lower-case name, value) pairs of
    ``Headers.__getitem__``, from one list comprehension."""
    return iter([(name, value) for _, name, value in self._full_items])


_stock_app_send = HTTPStream.app_send


async def app_send(self, message: dict[str, Any] | None) -> None:
    if (
        message is not None
        and message["type"] == "http.response.body"
        and self.state is _RESPONSE
        and not message.get("more_body", False)
    ):
        protocol = getattr(self.send, "__self__", None)
        response = self.response
        if type(protocol) is _H11 and not response.get("trailers", False):
            body = message.get("body", b"")
            if body == b"" or suppress_body(self.scope["method"], int(response["status"])):
                body = None
            await end_of_message(protocol, body)
            # Stock ``_send_closed`` from here on (its ``EndBody`` was written above).
            self.state = _CLOSED
            await self.config.log.access(self.scope, response, time() - self.start_time)
            await protocol._maybe_recycle()  # what stock ``stream_send`` does for ``StreamClosed``
            return
    await _stock_app_send(self, message)


async def end_of_message(protocol, body: bytes | None) -> None:
    """Patch 5's ``Body`` (when ``body``) then ``EndBody``, with their bytes in one write: h11
    sees the same events in the same order, and a refusal of either leaves on the wire what the
    two steps would have written."""
    connection = protocol.connection
    data = b"" if body is None else connection.send(h11.Data(data=bytes(body)))
    pending = getattr(protocol, PENDING_HEAD, None)
    if pending is not None:
        setattr(protocol, PENDING_HEAD, None)
        data = pending + data
    try:
        end = connection.send(h11.EndOfMessage())
    except BaseException:
        if data:  # the body step's write, as it would have been made
            await protocol.send(_RawData(data=data))
        raise
    data += end
    if data:
        await protocol.send(_RawData(data=data))

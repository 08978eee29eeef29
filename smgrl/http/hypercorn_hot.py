"""Per-request speed-ups of the patched hypercorn (patches 14 to 16 of
``smgrl.http.hypercorn_patches``; docs/hypercorn-patches.md has each one's reason and measurement).

14. ``headers_iter``: h11's ``Headers`` iterated in C. It is a ``Sequence`` without an ``__iter__``
    of its own, so every ``for name, value in headers`` (h11's own Host check, hypercorn's two
    header scans and its ``list(request.headers)``, four per request) went through
    ``Sequence.__iter__`` and a Python ``__getitem__`` per header. The pairs are the same.
15. ``app_send``: over HTTP/1.1 a response's start and its last body message each go to the
    connection in one step, without hypercorn's events (``Response``, ``Body``, ``EndBody``,
    ``StreamClosed``) and their dispatch, in the order and with the writes of patch 5 (one
    write for the head, the body and a chunked end). The start's headers skip hypercorn's
    ``build_and_validate_headers`` (a ``bytes()`` and a ``strip()`` of every name and value)
    when each is already what that would return: ``bytes``, a name h11 accepted before (a
    token: no colon, no white space) and a value matching h11's pattern (which cannot begin or
    end with white space); anything else goes through it, and its errors, as stock. Any other
    message is stock ``HTTPStream.app_send``.
16. ``check_protocol``: hypercorn's ``_check_protocol`` (is this request an h2c upgrade or an
    HTTP/2 preface?) without a ``decode``, ``strip`` and ``lower`` of every header name: h11's
    names are already lower-case tokens, so the stock sanitising returns them unchanged.
    ``create_stream``: hypercorn's ``_create_stream`` for a request without an ``upgrade``
    header (never a WebSocket, which needs ``upgrade: websocket``): the ``HTTPStream`` at once,
    without the scan that decodes every header for the WebSocket test. With one, stock.
"""

from __future__ import annotations

from itertools import chain
from time import time
from typing import Any

import h11
from hypercorn.protocol import h11 as h11_protocol
from hypercorn.protocol.events import Request, Response
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.utils import build_and_validate_headers, suppress_body

from smgrl.http.hypercorn_headers import FIELD_VALUE, GOOD_NAMES, checked_response

# The attribute on ``H11Protocol`` holding a response head not yet written (patch 5's
# ``_coalescing_stream_send`` sets it; ``end_of_message`` below writes it with the body).
PENDING_HEAD = "_smgrl_head"
_CLOSED = ASGIHTTPState.CLOSED
_REQUEST = ASGIHTTPState.REQUEST
_RESPONSE = ASGIHTTPState.RESPONSE
_H11 = h11_protocol.H11Protocol
_RawData = h11_protocol.RawData


async def check_protocol(self, event: h11.Request) -> None:
    """Stock ``H11Protocol._check_protocol``, its header scan on h11's lower-case names."""
    upgrade_value = ""
    has_body = False
    for _, name, value in event.headers._full_items:
        if name == b"upgrade":
            upgrade_value = value.decode("latin1").strip()
        elif name == b"content-length" or name == b"transfer-encoding":
            has_body = True
    if upgrade_value.lower() == "h2c" and not has_body:
        await self._send_h11_event(
            h11.InformationalResponse(
                status_code=101,
                headers=self.config.response_headers("h11")
                + [(b"connection", b"upgrade"), (b"upgrade", b"h2c")],
            )
        )
        raise h11_protocol.H2CProtocolRequiredError(self.connection.trailing_data[0], event)
    elif event.method == b"PRI" and event.target == b"*" and event.http_version == b"2.0":
        raise h11_protocol.H2ProtocolAssumedError(
            b"PRI * HTTP/2.0\r\n\r\n" + self.connection.trailing_data[0]
        )


_stock_create_stream = h11_protocol.H11Protocol._create_stream


async def create_stream(self, request: h11.Request) -> None:
    items = request.headers._full_items
    for _, name, _ in items:
        if name == b"upgrade":
            await _stock_create_stream(self, request)
            return
    self.stream = HTTPStream(
        self.app,
        self.config,
        self.context,
        self.task_group,
        self.ssl,
        self.client,
        self.server,
        self.stream_send,
        h11_protocol.STREAM_ID,
    )
    if self.config.h11_pass_raw_headers:
        headers = request.headers.raw_items()
    else:
        headers = [(name, value) for _, name, value in items]
    await self.stream.handle(
        Request(
            stream_id=h11_protocol.STREAM_ID,
            headers=headers,
            http_version=request.http_version.decode(),
            method=request.method.decode("ascii").upper(),
            raw_path=request.target,
            state=self.connection_state,
        )
    )
    self.keep_alive_requests += 1
    await self.context.mark_request()


def headers_iter(self):
    """``h11._headers.Headers.__iter__``: the (lower-case name, value) pairs of
    ``Headers.__getitem__``, from one list comprehension."""
    return iter([(name, value) for _, name, value in self._full_items])


_stock_app_send = HTTPStream.app_send


def start_response(protocol, headers, status_code: int) -> None:
    """Patch 5's step for a final response's head (kept to go out with the first body bytes),
    with patch 13's ``connection: close``; ``headers``: as ``build_and_validate_headers`` returns
    them."""
    start_checked(protocol, headers, status_code, 0)


def start_checked(protocol, headers, status_code: int, known: int) -> None:
    """``start_response``; the first ``known`` headers already passed h11's checks."""
    headers = list(chain(headers, protocol.config.response_headers("h11")))
    # An answer that starts before the request body has all arrived (an early 404/401/413)
    # ends the connection: hypercorn closes it after the answer (the body was never read).
    # Say so (RFC 9112 section 9.6), or a client reuses the connection and its next request
    # races our close (patch 13; stock hypercorn and SMG 1.13.0 close without saying so).
    connection = protocol.connection
    if (
        protocol.keep_alive_requests >= protocol.config.keep_alive_max_requests
        or connection.their_state is h11.SEND_BODY
    ):
        headers.append((b"connection", b"close"))
    try:
        setattr(protocol, PENDING_HEAD, connection.send(checked_response(headers, status_code, known)))
    except h11.LocalProtocolError:
        if connection.their_state != h11.ERROR:
            raise


def take_head(protocol) -> bytes | None:
    """The response head patch 5 holds back (None when there is none), taken to go out in the
    same write as what follows it."""
    pending = getattr(protocol, PENDING_HEAD, None)
    if pending is not None:
        setattr(protocol, PENDING_HEAD, None)
    return pending


def _known_good(headers) -> bool:
    """Each header already what ``build_and_validate_headers`` makes of it, and one h11 takes."""
    if FIELD_VALUE is None:
        return False
    good, fullmatch = GOOD_NAMES, FIELD_VALUE.fullmatch
    for name, value in headers:
        if type(name) is not bytes or type(value) is not bytes or name not in good or not fullmatch(value):
            return False
    return True


async def app_send(self, message: dict[str, Any] | None) -> None:
    if (
        message is not None
        and message["type"] == "http.response.start"
        and self.state is _REQUEST
        and type(getattr(self.send, "__self__", None)) is _H11
    ):
        self.response = message
        headers = message.get("headers", [])
        known = type(headers) is list and _known_good(headers)
        if not known:
            headers = build_and_validate_headers(headers)
        status_code = int(message["status"])
        if status_code >= 200:
            start_checked(self.send.__self__, headers, status_code, len(headers) if known else 0)
        else:  # an informational head: stock's event
            await self.send(Response(stream_id=self.stream_id, headers=headers, status_code=status_code))
        self.state = _RESPONSE
        return
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
    pending = take_head(protocol)
    if pending is not None:
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

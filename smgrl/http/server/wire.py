"""An HTTP/1.1 answer's bytes, written as h11 0.16 behind hypercorn 0.18 writes them (pure: no I/O).

smgrl's server puts the same bytes on the wire as the patched hypercorn it replaced, for the same
requests and answers (tests/cli/test_hypercorn_wire.py holds the servers to it): the status line
without a reason phrase, the app's headers in its order and case, then what h11 adds for framing
(``Transfer-Encoding: chunked`` when no length is declared) and for the end of the connection
(``Connection: close``). Headers are checked as h11 checks them (its own patterns); a header h11
would refuse raises its error, an app error, as before."""

from __future__ import annotations

from typing import Any

import h11
from hypercorn.utils import build_and_validate_headers

from smgrl.http.hypercorn_headers import FIELD_VALUE

# Names whose values decide the framing or the connection: never on the fast path, h11 checks them.
_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection", b"host"})
_GOOD_MAX = 4096
# Header names h11 took before (as the app wrote them), none of them a framing name: a few dozen.
_GOOD: set[bytes] = set()

NO_BODY = 0  # HEAD, 1xx, 204, 304: nothing after the head
LENGTH = 1  # Content-Length framing
CHUNKED = 2
UNTIL_CLOSE = 3  # an HTTP/1.0 peer and no length: the body ends with the connection


class AnswerHead:
    """A final answer's head as it goes on the wire, with its framing and whether the connection
    ends after it."""

    __slots__ = ("close", "data", "framing", "length")

    def __init__(self, data: bytes, framing: int, length: int, close: bool) -> None:
        self.data = data
        self.framing = framing
        self.length = length
        self.close = close


def _fast(headers: Any) -> int | None:
    """The declared length (-1: none) when every header is already what hypercorn's
    ``build_and_validate_headers`` makes of it and h11 takes unchanged: bytes, a name h11 took
    before, a value matching h11's pattern, at most one ``content-length`` (digits), no other
    framing or connection header. Else None: h11 checks them (``_checked``)."""
    if type(headers) is not list or FIELD_VALUE is None:
        return None
    good, fullmatch = _GOOD, FIELD_VALUE.fullmatch
    length = -1
    for name, value in headers:
        if type(name) is not bytes or type(value) is not bytes:
            return None
        if name == b"content-length":
            if length >= 0 or not value.isdigit():
                return None
            length = int(value)
        elif name not in good or not fullmatch(value):
            return None
    return length


def _checked(headers: Any, status: int) -> list[tuple[bytes, bytes, bytes]]:
    """(raw name, lower-case name, value) of each header after hypercorn's and h11's checks, with
    h11's normalisation (one ``content-length`` of equal duplicates, ``transfer-encoding`` as
    ``chunked`` only). Raises what they raise for a header they refuse."""
    response = h11.Response(headers=build_and_validate_headers(headers), status_code=status)
    items = list(response.headers._full_items)
    for raw, _, _ in items:
        if len(_GOOD) < _GOOD_MAX and raw not in _GOOD and raw.lower() not in _FRAMING:
            _GOOD.add(raw)
    return items


def response_head(
    status: Any,
    headers: Any,
    *,
    head_request: bool,
    http11: bool,
    keep_alive: bool,
    early: bool,
) -> AnswerHead:
    """The head of a final answer (``status`` >= 200).

    ``head_request``: the request was a ``HEAD`` (headers as for a ``GET``, no body);
    ``http11``: the client speaks HTTP/1.1 (else 1.0: no chunked framing, the connection ends);
    ``keep_alive``: the request allows keep-alive (h11's rule: HTTP/1.1 and no ``close`` token);
    ``early``: the answer starts before the request body has all arrived, so the connection ends
    after it, and says so (RFC 9112 section 9.6)."""
    if type(status) is not int:
        status = int(status)
    fast = _fast(headers)
    if fast is not None:
        length = fast
        items = headers
        te = False
        connection: list[bytes] = []
    else:
        length = -1
        checked = _checked(headers, status)
        items = []
        te = False
        connection = []
        for raw, name, value in checked:
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                te = True
            elif name == b"connection":
                connection.append(value)
            items.append((raw, value))
        # h11 writes a host header first (it has no meaning in an answer, but the bytes match).
        hosts = [(raw, value) for raw, name, value in checked if name == b"host"]
        if hosts:
            items = hosts + [(raw, value) for raw, name, value in checked if name != b"host"]
    if early:
        items = [*items, (b"connection", b"close")]
        connection.append(b"close")
    need_close = False
    if status in (204, 304):
        framing = NO_BODY
        length = 0
    elif te:
        framing = CHUNKED
    elif length >= 0:
        framing = LENGTH
    else:
        # No length declared: chunked to an HTTP/1.1 peer, else the close ends the body.
        framing = CHUNKED if http11 else UNTIL_CLOSE
    if framing in (CHUNKED, UNTIL_CLOSE):
        items = [
            (raw, value)
            for raw, value in items
            if raw.lower() not in (b"content-length", b"transfer-encoding")
        ]
        if http11:
            items.append((b"Transfer-Encoding", b"chunked"))
        elif not head_request:
            need_close = True
    if not keep_alive or need_close:
        tokens = {t.strip().lower() for v in connection for t in v.split(b",") if t.strip()}
        tokens.discard(b"keep-alive")
        tokens.add(b"close")
        items = [(raw, value) for raw, value in items if raw.lower() != b"connection"]
        items.extend((b"Connection", token) for token in sorted(tokens))
    if head_request or 100 <= status < 200:
        framing = NO_BODY  # hypercorn's rule: no body bytes for a HEAD or a 1xx (nor 204, 304)
    parts = [b"HTTP/1.1 %d \r\n" % status]
    parts.extend([b"%s: %s\r\n" % pair for pair in items])
    parts.append(b"\r\n")
    close = early or not keep_alive or need_close or framing == UNTIL_CLOSE
    return AnswerHead(b"".join(parts), framing, length, close)


def error_answer(status: int) -> bytes:
    """What hypercorn sends for a request it cannot parse (400, 431) or an app that ended
    without answering (500): no body, and the connection ends."""
    return b"HTTP/1.1 %d \r\ncontent-length: 0\r\nconnection: close\r\n\r\n" % status


CONTINUE = b"HTTP/1.1 100 \r\n\r\n"
LAST_CHUNK = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


class AnswerFramingError(Exception):
    """An answer's body that breaks its declared Content-Length (h11's LocalProtocolError)."""

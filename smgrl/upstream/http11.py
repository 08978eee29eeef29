"""HTTP/1.1, client side, as pure code: bytes in, events out, no I/O (hypercorn's protocol/ split).

Two halves:

- ``serialize_request`` renders a request, head and body, as ONE buffer so the I/O shell sends
  it with a single ``send`` (one syscall, one TCP segment for a small request).
- ``ResponseParser`` is fed the bytes of one response as they arrive and hands back events:
  ``Head`` (once per 1xx interim response, then once for the final response), ``Data`` (body bytes,
  de-chunked, as soon as they are available), ``EndOfMessage`` (with chunked trailers), or
  ``NEED_DATA``. ``feed_eof`` reports that the connection was closed.

Body framing follows RFC 9112 §6.3, in its order: a response to HEAD and 1xx/204/304 responses
have no body; ``transfer-encoding: chunked`` wins over ``content-length``; then
``content-length``; otherwise the body runs until the engine closes the connection.

This is a hot path (a fan-out does one exchange per engine), so the parser never loops over
bytes in Python: it finds line ends with ``bytes.find`` / compiled regexes, slices the buffer
once per event, and keeps the buffer as an immutable ``bytes`` plus a read position, so a
response that arrives in one ``recv`` is parsed without copying its body at all. The one
quadratic corner (a head or trailer section trickling in a byte per ``recv``) is bounded by the
64 KiB head limit.

Errors: malformed input raises ``ProtocolError``; a connection closed before the response is
complete raises ``ReadError`` (both from ``errors.py``). Invalid *requests* are the caller's bug
and raise ``ValueError`` before anything is sent.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

import attrs

from smgrl.upstream.errors import ProtocolError, ReadError

__all__ = [
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "NEED_DATA",
    "Data",
    "EndOfMessage",
    "Head",
    "NeedData",
    "ResponseParser",
    "request_wants_close",
    "serialize_request",
    "simple_response",
]

# Limits on what an engine may send before we call it broken rather than slow. Engines send a
# handful of short headers; these only stop a confused or hostile peer from growing our memory.
MAX_HEAD_BYTES: Final = 64 * 1024
MAX_HEADERS: Final = 256
# A chunk-size line is a few hex digits plus optional (ignored) extensions.
MAX_CHUNK_LINE: Final = 8 * 1024
# 100 Continue / 103 Early Hints may precede the final response; more than this is a loop.
MAX_INTERIM_RESPONSES: Final = 16

# RFC 9110 §5.6.2 token: header names and methods.
_TOKEN = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_METHOD = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# The target is sent verbatim, already encoded: visible ASCII only, so no space, CR, LF or NUL
# can split the request line (request smuggling) and nothing needs encoding here.
_TARGET = re.compile(r"[!-~]+")
# HTTP/1.x only; a higher minor version is read as 1.1 (RFC 9110 §2.5). The reason phrase is
# free text (CR, LF and NUL are rejected for the whole head before this runs).
_STATUS_LINE = re.compile(rb"HTTP/1\.([0-9]) ([0-9]{3})(?: (.*))?")
# End of a head or trailer section: an empty line. LF alone is accepted as a line end
# (RFC 9112 §2.2 allows it), so the match starts at the LF ending the last field line.
_HEAD_END = re.compile(rb"\n\r?\n")
_LEADING_BLANK_LINES = re.compile(rb"(?:\r?\n)*")
# chunk-size [ BWS ";" chunk-ext ] CRLF. Extensions are allowed and ignored (RFC 9112 §7.1.1).
_CHUNK_LINE = re.compile(rb"([0-9A-Fa-f]{1,16})[ \t]*(?:;[^\r\n\x00]*)?\r?")

# Response fields that decide the body's framing and the connection's persistence.
_FRAMING_FIELDS = frozenset((b"content-length", b"transfer-encoding", b"connection"))
# Headers the client writes itself; a caller-given copy would make the framing ambiguous.
_RESERVED_HEADERS = frozenset((b"host", b"content-length", b"transfer-encoding"))


def serialize_request(
    method: str,
    target: str,
    host: bytes,
    headers: Iterable[tuple[bytes, bytes]] = (),
    body: bytes | None = None,
) -> bytes:
    """Render one HTTP/1.1 request, head and body, as a single buffer.

    Only ``host`` and (when ``body`` is not None) ``content-length`` are added; every other
    header is the caller's, sent in the given order and spelling. ``ValueError`` if the method,
    target or a header could split the request or make its framing ambiguous.
    """
    if _METHOD.fullmatch(method) is None:
        raise ValueError(f"invalid HTTP method {method!r}")
    if _TARGET.fullmatch(target) is None:
        raise ValueError(f"invalid request target {target!r} (must be encoded, visible ASCII)")
    parts = [method.encode("ascii"), b" ", target.encode("ascii"), b" HTTP/1.1\r\nhost: ", host, b"\r\n"]
    for name, value in headers:
        if _TOKEN.fullmatch(name) is None:
            raise ValueError(f"invalid header name {name!r}")
        if b"\r" in value or b"\n" in value or b"\0" in value:
            raise ValueError(f"header {name!r} has a CR, LF or NUL in its value")
        if name.lower() in _RESERVED_HEADERS:
            raise ValueError(f"header {name!r} is set by the client itself")
        parts += (name, b": ", value, b"\r\n")
    if body is None:
        # No content-length at all: a bodyless POST goes out without one (engines accept it,
        # and "content-length: 0" would be a header the caller did not ask for).
        parts.append(b"\r\n")
    else:
        parts += (b"content-length: ", b"%d" % len(body), b"\r\n\r\n", body)
    return b"".join(parts)


def request_wants_close(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """True if the caller's headers include ``connection: close`` (the connection is not reused)."""
    for name, value in headers:
        if name.lower() == b"connection" and b"close" in _tokens(value):
            return True
    return False


@attrs.frozen
class Head:
    """A response head: status line and header fields (names lower-cased, order kept)."""

    status: int
    reason: bytes
    http_version: bytes  # b"1.1" or b"1.0" (a later 1.x minor is kept as sent, read as 1.1)
    headers: list[tuple[bytes, bytes]]


@attrs.frozen
class Data:
    """Body bytes, de-chunked."""

    data: bytes


@attrs.frozen
class EndOfMessage:
    """The body is complete. ``trailers``: chunked trailer fields (empty otherwise)."""

    trailers: list[tuple[bytes, bytes]] = attrs.field(factory=list)


class NeedData:
    """No event can be produced until more bytes are fed (or EOF is reported)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()

Event = Head | Data | EndOfMessage

# Parser states. Ints compared with ``==``: cheaper than an Enum on this path.
_HEAD = 0  # waiting for a status line and headers
_LENGTH = 1  # content-length body, ``_remaining`` bytes to go
_CHUNK_SIZE = 2  # waiting for a chunk-size line
_CHUNK_DATA = 3  # inside a chunk, ``_remaining`` bytes to go
_CHUNK_CRLF = 4  # the CRLF after a chunk's data
_TRAILERS = 5  # after the last chunk: trailer fields, then an empty line
_UNTIL_CLOSE = 6  # body delimited by the connection closing
_END = 7  # body complete, EndOfMessage not yet emitted
_DONE = 8  # EndOfMessage emitted
_BROKEN = 9  # an error was raised; the connection must be dropped


class ResponseParser:
    """Incremental parser for the response(s) to ONE request: 1xx interims, then the final one.

    ``feed(bytes)`` / ``feed_eof()`` put data in; ``next_event()`` takes one event out. After
    ``EndOfMessage``, ``reusable`` says whether the connection may carry another request.
    """

    __slots__ = (
        "_buf",
        "_eof",
        "_interims",
        "_keep_alive",
        "_no_body",
        "_pos",
        "_remaining",
        "_scan",
        "_state",
    )

    def __init__(self, request_method: str = "GET") -> None:
        # Unconsumed bytes are ``_buf[_pos:]``. ``bytes`` rather than ``bytearray`` so a body
        # that arrives whole is handed out by slicing, with no copy into and out of a buffer.
        self._buf = b""
        self._pos = 0
        # Where the next search for the end of the head resumes, so a head arriving in pieces
        # is not rescanned from its start on every feed.
        self._scan = 0
        self._state = _HEAD
        self._remaining = 0
        self._eof = False
        # RFC 9112 §6.3 rule 1: a response to HEAD never has a body, whatever its headers say.
        self._no_body = request_method == "HEAD"
        self._keep_alive = False
        self._interims = 0

    # -- input -------------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Add bytes received from the connection."""
        if self._eof:
            raise RuntimeError("feed() after feed_eof()")
        if not data:
            return
        pos = self._pos
        if pos >= len(self._buf):
            # Everything before was consumed (the usual case): adopt the new bytes as they are.
            # The head scan restarts at them: a resume offset into the old buffer (left by a
            # NEED_DATA after an interim 1xx head) would skip the start of the next head.
            self._buf = bytes(data)
            self._scan = 0
        else:
            # Keep only the unconsumed tail; it is small except while a head is still arriving.
            self._buf = self._buf[pos:] + data
            self._scan = max(0, self._scan - pos)
        self._pos = 0

    def feed_eof(self) -> None:
        """Report that the engine closed the connection (``recv`` returned no bytes)."""
        self._eof = True

    # -- state -------------------------------------------------------------------------------

    @property
    def complete(self) -> bool:
        """True once ``EndOfMessage`` has been emitted."""
        return self._state == _DONE

    @property
    def reusable(self) -> bool:
        """True if the response is complete and the connection may carry another request.

        Needs keep-alive (HTTP/1.1 without ``connection: close``, or HTTP/1.0 with
        ``connection: keep-alive``), a self-delimited body, and NO bytes beyond the response:
        anything extra is garbage or an unsolicited response that would be read as the answer
        to the next request.
        """
        return self._state == _DONE and self._keep_alive and self._pos == len(self._buf) and not self._eof

    # -- output ------------------------------------------------------------------------------

    def next_event(self) -> Event | NeedData:
        """The next event, or ``NEED_DATA``. Raises ``ProtocolError`` / ``ReadError``."""
        while True:
            state = self._state
            if state == _LENGTH or state == _CHUNK_DATA or state == _UNTIL_CLOSE:
                return self._body_data(state)
            if state == _HEAD:
                return self._head()
            if state == _END:
                self._state = _DONE
                return EndOfMessage([])
            if state == _CHUNK_SIZE:
                if not self._chunk_size_line():
                    return NEED_DATA
            elif state == _CHUNK_CRLF:
                if not self._chunk_crlf():
                    return NEED_DATA
            elif state == _TRAILERS:
                return self._trailers()
            elif state == _DONE:
                raise RuntimeError("the response is already complete")
            else:
                raise ProtocolError("the response parser already failed")

    # -- internals ---------------------------------------------------------------------------

    def _fail(self, exc: Exception) -> Exception:
        # Once an error is raised the stream position is meaningless: every later call fails.
        self._state = _BROKEN
        return exc

    def _need_data(self, where: str) -> NeedData:
        if self._eof:
            raise self._fail(ReadError(f"connection closed {where}"))
        return NEED_DATA

    def _head(self) -> Head | NeedData:
        buf = self._buf
        pos = self._pos
        end = len(buf)
        if pos < end and (buf[pos] == 13 or buf[pos] == 10):
            # Robustness (RFC 9112 §2.2): skip stray empty lines before the status line, e.g.
            # a CRLF some servers leave after a body.
            pos = self._pos = _LEADING_BLANK_LINES.match(buf, pos).end()  # type: ignore[union-attr]
        match = _HEAD_END.search(buf, max(pos, self._scan))
        if match is None:
            if end - pos > MAX_HEAD_BYTES:
                raise self._fail(ProtocolError("response head is larger than 64 KiB"))
            # The terminator may straddle this feed and the next: resume 2 bytes back.
            self._scan = max(pos, end - 2)
            return self._need_data("before the end of the response head")  # type: ignore[return-value]
        if match.end() - pos > MAX_HEAD_BYTES:
            raise self._fail(ProtocolError("response head is larger than 64 KiB"))
        try:
            head = self._parse_head(buf[pos : match.start()])
        except ProtocolError as exc:
            raise self._fail(exc) from None
        self._pos = match.end()
        self._scan = 0
        return head

    def _parse_head(self, block: bytes) -> Head:
        lines = _field_lines(block)
        if len(lines) > MAX_HEADERS + 1:
            raise ProtocolError(f"response has more than {MAX_HEADERS} header fields")
        match = _STATUS_LINE.fullmatch(lines[0])
        if match is None:
            raise ProtocolError(f"malformed status line {lines[0][:80]!r}")
        minor, status = match.group(1), int(match.group(2))
        if status < 100:
            raise ProtocolError(f"invalid status code {status}")
        headers, framing = _parse_fields(lines, 1)
        head = Head(status, match.group(3) or b"", b"1." + minor, headers)

        content_length: list[bytes] | None = None
        transfer_encoding: list[bytes] | None = None
        connection: list[bytes] = []
        for index in framing:  # only the fields that decide framing and persistence
            name, value = headers[index]
            if name == b"content-length":
                content_length = [value] if content_length is None else [*content_length, value]
            elif name == b"transfer-encoding":
                transfer_encoding = [value] if transfer_encoding is None else [*transfer_encoding, value]
            elif name == b"connection":
                connection += _tokens(value)
        # Framing fields are checked in EVERY head, also where they decide nothing (1xx, 204,
        # 304, a HEAD response, content-length beside chunked): a peer that spells them wrong
        # is confused about framing, so the response is refused and the connection dropped.
        length = None if content_length is None else _content_length(content_length)
        if transfer_encoding is not None:
            codings = [coding for value in transfer_encoding for coding in _tokens(value)]
            # We send no TE header, so chunked is the only transfer coding an engine may use
            # (RFC 9110 §10.1.4); anything else we could not decode, so it is an error.
            if codings != [b"chunked"]:
                raise ProtocolError(f"unsupported transfer-encoding {b', '.join(transfer_encoding)!r}")

        if status < 200:
            # An interim response: the final one follows on the same connection, so the
            # parser stays in _HEAD. 101 would switch protocols, which we never ask for.
            if status == 101:
                raise ProtocolError("unexpected 101 Switching Protocols (no upgrade was requested)")
            self._interims += 1
            if self._interims > MAX_INTERIM_RESPONSES:
                raise ProtocolError(f"more than {MAX_INTERIM_RESPONSES} interim (1xx) responses")
            return head

        http11 = minor != b"0"
        # Persistence, RFC 9112 §9.3: HTTP/1.1 unless "close"; HTTP/1.0 only with "keep-alive".
        self._keep_alive = (b"close" not in connection) if http11 else (b"keep-alive" in connection)

        if self._no_body or status == 204 or status == 304:
            # Rule 1: no body whatever the headers say (a 304 or a HEAD response carries the
            # content-length the body WOULD have had).
            self._state = _END
        elif transfer_encoding is not None:
            self._state = _CHUNK_SIZE
            if content_length is not None or not http11:
                # Rule 3: chunked overrides content-length, but such a message "ought to be
                # handled as an error" (smuggling); and RFC 9112 §6.1: transfer-encoding in an HTTP/1.0
                # message means faulty framing. Read it, then drop the connection.
                self._keep_alive = False
        elif length is not None:
            self._remaining = length
            self._state = _LENGTH if length else _END
        else:
            # Rule 8: delimited by close, so by definition not reusable.
            self._state = _UNTIL_CLOSE
            self._keep_alive = False
        return head

    def _body_data(self, state: int) -> Data | EndOfMessage | NeedData:
        buf = self._buf
        pos = self._pos
        available = len(buf) - pos
        if available == 0:
            if state == _UNTIL_CLOSE and self._eof:
                self._state = _DONE
                return EndOfMessage([])
            where = "inside a chunked body" if state == _CHUNK_DATA else "before the end of the body"
            if state == _LENGTH:
                where += f" ({self._remaining} bytes missing)"
            return self._need_data(where)
        if state == _UNTIL_CLOSE:
            n = available
        else:
            n = min(available, self._remaining)
            self._remaining -= n
            if self._remaining == 0:
                self._state = _END if state == _LENGTH else _CHUNK_CRLF
        self._pos = pos + n
        # Slicing a whole ``bytes`` returns the object itself: no copy for a body in one recv.
        return Data(buf[pos : pos + n])

    def _chunk_size_line(self) -> bool:
        buf = self._buf
        pos = self._pos
        newline = buf.find(b"\n", pos)
        if newline < 0:
            if len(buf) - pos > MAX_CHUNK_LINE:
                raise self._fail(ProtocolError("chunk-size line is too long"))
            self._need_data("inside a chunked body")
            return False
        if newline - pos > MAX_CHUNK_LINE:
            raise self._fail(ProtocolError("chunk-size line is too long"))
        match = _CHUNK_LINE.fullmatch(buf, pos, newline)
        if match is None:
            raise self._fail(ProtocolError(f"malformed chunk-size line {buf[pos:newline][:80]!r}"))
        size = int(match.group(1), 16)
        self._pos = newline + 1
        if size:
            self._remaining = size
            self._state = _CHUNK_DATA
        else:
            self._state = _TRAILERS
        return True

    def _chunk_crlf(self) -> bool:
        buf = self._buf
        pos = self._pos
        if buf.startswith(b"\r\n", pos):
            self._pos = pos + 2
        elif buf.startswith(b"\n", pos):
            self._pos = pos + 1
        elif len(buf) == pos or buf[pos:] == b"\r":
            self._need_data("inside a chunked body")
            return False
        else:
            raise self._fail(ProtocolError("chunk data is not followed by CRLF"))
        self._state = _CHUNK_SIZE
        return True

    def _trailers(self) -> EndOfMessage | NeedData:
        buf = self._buf
        pos = self._pos
        if buf.startswith(b"\r\n", pos) or buf.startswith(b"\n", pos):
            # No trailers (the usual case): the last chunk is followed by an empty line.
            self._pos = pos + (2 if buf[pos] == 13 else 1)
            self._state = _DONE
            return EndOfMessage([])
        match = None if len(buf) == pos or buf[pos:] == b"\r" else _HEAD_END.search(buf, pos)
        if match is None:
            if len(buf) - pos > MAX_HEAD_BYTES:
                raise self._fail(ProtocolError("trailer section is larger than 64 KiB"))
            return self._need_data("inside the chunked trailers")
        try:
            lines = _field_lines(buf[pos : match.start()])
            if len(lines) > MAX_HEADERS:
                raise ProtocolError(f"response has more than {MAX_HEADERS} trailer fields")
            trailers = _parse_fields(lines, 0)[0]
        except ProtocolError as exc:
            raise self._fail(exc) from None
        self._pos = match.end()
        self._state = _DONE
        return EndOfMessage(trailers)


def _field_lines(block: bytes) -> list[bytes]:
    """Split a head or trailer block (without its final empty line) into lines."""
    text = block.replace(b"\r\n", b"\n")
    if text.endswith(b"\r"):  # the CR of the last line's CRLF (the terminator match starts at LF)
        text = text[:-1]
    # RFC 9110 §5.5: a CR, LF or NUL in a field value is invalid and dangerous; reject the
    # message. (LFs are the line separators by now, so only CR and NUL can remain.)
    if b"\r" in text or b"\0" in text:
        raise ProtocolError("bare CR or NUL byte in the response head")
    return text.split(b"\n")


def _parse_fields(lines: list[bytes], start: int) -> tuple[list[tuple[bytes, bytes]], list[int]]:
    """Field lines -> (fields, indices of the fields that decide framing and persistence)."""
    fields: list[tuple[bytes, bytes]] = []
    framing: list[int] = []
    for index in range(start, len(lines)):
        line = lines[index]
        name, colon, value = line.partition(b":")
        # No whitespace before the colon (RFC 9112 §5.1): a name like b"content-length " is
        # how response smuggling starts, so it is malformed here rather than tolerated.
        if colon and _TOKEN.fullmatch(name) is not None:
            name = name.lower()
            if name in _FRAMING_FIELDS:
                framing.append(len(fields))
            unstripped = value  # kept for an obs-fold: the whitespace before a fold is the value's
            fields.append((name, value.strip(b" \t")))
        elif line.startswith((b" ", b"\t")):
            # obs-fold: a user agent MUST replace it with SP and carry on (RFC 9112 §5.2): the
            # fold (line end and the next line's leading whitespace) becomes one SP; whitespace
            # inside the joined value stays, only its two ends are trimmed (as h11 does).
            if not fields:
                raise ProtocolError("header continuation line before the first header")
            unstripped = unstripped + b" " + line.lstrip(b" \t")
            fields[-1] = (fields[-1][0], unstripped.strip(b" \t"))
        else:
            raise ProtocolError(f"malformed header line {line[:80]!r}")
    return fields, framing


def _tokens(value: bytes) -> list[bytes]:
    """A comma-separated list header as lower-case items (empty items dropped, RFC 9110 §5.6.1)."""
    return [item for item in (part.strip(b" \t").lower() for part in value.split(b",")) if item]


def _content_length(values: list[bytes]) -> int:
    # Several fields, or a list in one field, are allowed only if every value is the same
    # number (RFC 9110 §8.6); anything else means the body's end is ambiguous.
    if len(values) == 1 and values[0].isdigit() and len(values[0]) <= 18:
        return int(values[0])  # the usual case, without the list machinery below
    length: int | None = None
    for value in values:
        for item in value.split(b","):
            item = item.strip(b" \t")
            # bytes.isdigit() is ASCII-only: rejects "+5", "-1", "0x5", " ", "" and "5.0";
            # 18 digits keeps int() cheap and the value far below anything real.
            if not item.isdigit() or len(item) > 18:
                raise ProtocolError(f"invalid content-length {value!r}")
            number = int(item)
            if length is not None and number != length:
                raise ProtocolError(f"conflicting content-length values {b', '.join(values)!r}")
            length = number
    assert length is not None
    return length


def simple_response(data: bytes) -> tuple[int, list[tuple[bytes, bytes]], bytes] | None:
    """``(status, headers, body)`` when ``data`` is exactly one whole, plain response, else None.

    The common answer to a small control call, read at once without the event machinery of
    ``ResponseParser``: HTTP/1.1, CRLF line ends, a final status that has a body (not 1xx, 204
    or 304), one ``content-length`` and no ``transfer-encoding`` or ``connection`` field, the
    whole body and not a byte more. Such a response is reusable. Anything else (including every
    malformed or unusual head) is None, and the caller hands the same bytes to a
    ``ResponseParser``, which accepts or refuses them by the full rules. Never for a response to
    HEAD (its content-length is not followed by a body). ``tests/unit/test_http11.py`` checks that
    every response accepted here reads the same through ``ResponseParser``.

    Engines answer a fan-out with the same head, byte for byte (a ``date`` field changes once a
    second): a head accepted once is kept (``_SIMPLE_HEADS``), so the next identical one costs a
    dictionary lookup instead of the checks below, which were 7% of a 64-engine fan-out's CPU.
    The checks depend on the head's bytes alone, so a kept head is accepted as it was.
    """
    end = data.find(b"\r\n\r\n")
    if end < 0 or end + 4 > MAX_HEAD_BYTES:
        return None
    block = data[:end]
    known = _SIMPLE_HEADS.get(block)
    if known is None:
        known = _simple_head(block)
        if known is None:
            return None
        if len(block) <= _KEPT_HEAD_BYTES:
            if len(_SIMPLE_HEADS) >= _KEPT_HEADS:
                _SIMPLE_HEADS.clear()  # heads that stopped coming (an old date) go with the rest
            _SIMPLE_HEADS[block] = known
    status, headers, length = known
    if len(data) != end + 4 + length:
        return None
    return status, list(headers), data[end + 4 :]


# Heads accepted by ``simple_response``, by their bytes: ``(status, headers, content-length)``.
_SIMPLE_HEADS: dict[bytes, tuple[int, tuple[tuple[bytes, bytes], ...], int]] = {}
_KEPT_HEADS = 256
_KEPT_HEAD_BYTES = 1024  # at most 256 KiB kept


def _simple_head(block: bytes) -> tuple[int, tuple[tuple[bytes, bytes], ...], int] | None:
    """``simple_response``'s checks of a head (without its empty line)."""
    if not block.startswith(b"HTTP/1.1 "):
        return None
    if b"\n" in block.replace(b"\r\n", b"") or b"\r" in block.replace(b"\r\n", b"") or b"\0" in block:
        return None
    lines = block.split(b"\r\n")
    if len(lines) > MAX_HEADERS + 1:
        return None
    match = _STATUS_LINE.fullmatch(lines[0])
    if match is None:
        return None
    status = int(match.group(2))
    if status < 200 or status == 204 or status == 304:
        return None
    headers = []
    length = None
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or _TOKEN.fullmatch(name) is None:
            return None
        name = name.lower()
        value = value.strip(b" \t")
        if name in _FRAMING_FIELDS:
            if name != b"content-length" or length is not None or not value.isdigit() or len(value) > 18:
                return None
            length = int(value)
        headers.append((name, value))
    if length is None:
        return None
    return status, tuple(headers), length

"""The request side of a scripted test engine: read HTTP/1.1 requests off a trio stream.

Tests that need an engine to misbehave in ways the faithful fakes never do (any status, any
content-type, a declared length it never sends, a hang after the head) script the answer by hand.
This is the one place such engines read requests (the trio ones here and in tests, and the threaded
smg-diff engine tests/conformance/raw_engine.py), so they all parse alike: Content-Length bodies,
keep-alive, lower-cased header names; nothing else (no chunked requests: gateways send lengths).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import attrs


@attrs.frozen
class RawRequest:
    method: str
    target: str
    headers: dict[str, str]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]


def split_request(buf: bytes) -> tuple[RawRequest, bytes] | None:
    """The first whole request in ``buf`` and the bytes after it; None until it is complete."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buf[:end].decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    start = end + 4
    length = int(headers.get("content-length", "0"))
    if len(buf) - start < length:
        return None
    return RawRequest(method, target, headers, buf[start : start + length]), buf[start + length :]


class RequestSplitter:
    """Bytes in, whole requests out (the state both readers below share)."""

    def __init__(self) -> None:
        self._buf = b""

    def feed(self, data: bytes) -> list[RawRequest]:
        self._buf += data
        out = []
        while (parsed := split_request(self._buf)) is not None:
            request, self._buf = parsed
            out.append(request)
        return out


async def read_requests(stream) -> AsyncIterator[RawRequest]:
    """Yield requests in order until the peer closes (or closes mid-request): trio servers."""
    splitter = RequestSplitter()
    while data := await stream.receive_some(65536):
        for request in splitter.feed(data):
            yield request


def read_requests_blocking(sock) -> Iterator[RawRequest]:
    """``read_requests`` for a blocking socket (thread-per-connection servers)."""
    splitter = RequestSplitter()
    while data := sock.recv(65536):
        yield from splitter.feed(data)

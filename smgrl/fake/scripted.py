"""The request side of a scripted test engine: read HTTP/1.1 requests off a trio stream.

Tests that need an engine to misbehave in ways the faithful fakes never do (any status, any
content-type, a declared length it never sends, a hang after the head) script the answer by hand.
This is the one place such engines read requests, so they all parse alike: Content-Length bodies,
keep-alive, lower-cased header names; nothing else (no chunked requests: gateways send lengths).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

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


async def read_requests(stream) -> AsyncIterator[RawRequest]:
    """Yield requests in order until the peer closes (or closes mid-request)."""
    buf = b""
    while True:
        while b"\r\n\r\n" not in buf:
            data = await stream.receive_some(65536)
            if not data:
                return
            buf += data
        head, _, buf = buf.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(buf) < length:
            data = await stream.receive_some(65536)
            if not data:
                return
            buf += data
        body, buf = buf[:length], buf[length:]
        yield RawRequest(method, target, headers, body)

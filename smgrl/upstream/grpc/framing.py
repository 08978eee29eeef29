"""gRPC over HTTP/2 as pure code: request headers out, response events in, no I/O.

- Length-prefixed messages: a 1-byte compressed flag, a 4-byte big-endian length, the bytes.
  :class:`MessageDecoder` takes DATA payloads split anywhere and yields whole messages.
- :class:`CallState` follows one call's response through the h2 events of its stream (headers,
  data, trailers, end, reset) and decides its status; the trio shell only moves events here.
- :func:`request_headers` builds the HEADERS of a call (``grpc-timeout`` from the deadline).
"""

from __future__ import annotations

import collections
import math

from smgrl.upstream.grpc.status import (
    StatusCode,
    code_for_http_status,
    code_of,
    decode_message,
)

HEADER = 5
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # grpcio's default receive limit


class FramingError(Exception):
    def __init__(self, code: StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def encode(payload: bytes) -> bytes:
    """One uncompressed length-prefixed message."""
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


class MessageDecoder:
    """Whole messages out of DATA payloads cut at any byte.

    A message over ``max_message_bytes`` is refused from its header alone (RESOURCE_EXHAUSTED,
    as grpcio says it), before its bytes arrive; a compressed one (no encoding was negotiated) is
    INTERNAL.
    """

    __slots__ = ("_buf", "_need", "max_message_bytes")

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self.max_message_bytes = max_message_bytes
        self._buf = bytearray()
        self._need = -1  # the current message's length once its header was read

    @property
    def pending(self) -> int:
        """Bytes held that do not yet make a whole message (0 at a message boundary)."""
        return len(self._buf)

    def feed(self, data: bytes) -> list[bytes]:
        buf = self._buf
        if not buf and self._need < 0 and len(data) >= HEADER:
            # Fast path: a payload that is exactly one whole message (the usual stream chunk).
            size = int.from_bytes(data[1:5], "big")
            if len(data) == HEADER + size and data[0] == 0 and size <= self.max_message_bytes:
                return [data[HEADER:]]
        buf += data
        out: list[bytes] = []
        while True:
            if self._need < 0:
                if len(buf) < HEADER:
                    return out
                flag = buf[0]
                size = int.from_bytes(buf[1:5], "big")
                if flag not in (0, 1):
                    raise FramingError(StatusCode.INTERNAL, f"bad message flag {flag}")
                if flag == 1:
                    raise FramingError(
                        StatusCode.INTERNAL, "compressed message received but no encoding was negotiated"
                    )
                if size > self.max_message_bytes:
                    raise FramingError(
                        StatusCode.RESOURCE_EXHAUSTED,
                        f"Received message larger than max ({size} vs. {self.max_message_bytes})",
                    )
                del buf[:HEADER]
                self._need = size
            if len(buf) < self._need:
                return out
            out.append(bytes(buf[: self._need]))
            del buf[: self._need]
            self._need = -1


def encode_timeout(seconds: float) -> str:
    """``grpc-timeout``: at most 8 digits and a unit; rounded up so the server never sees less."""
    seconds = max(seconds, 0.0)
    for unit, scale in (("n", 1e9), ("u", 1e6), ("m", 1e3), ("S", 1.0), ("M", 1 / 60), ("H", 1 / 3600)):
        value = math.ceil(seconds * scale)
        if value < 100_000_000:
            return f"{value}{unit}"
    return "99999999H"


def request_headers(
    authority: str, path: str, timeout: float | None, metadata: tuple = (), user_agent: str = "smgrl-grpc"
) -> list[tuple[bytes, bytes]]:
    headers = [
        (b":method", b"POST"),
        (b":scheme", b"http"),
        (b":path", path.encode("ascii")),
        (b":authority", authority.encode("ascii")),
        (b"te", b"trailers"),
        (b"content-type", b"application/grpc"),
        (b"user-agent", user_agent.encode("ascii")),
    ]
    if timeout is not None:
        headers.append((b"grpc-timeout", encode_timeout(timeout).encode("ascii")))
    for key, value in metadata:
        k = key.lower().encode("ascii") if isinstance(key, str) else key.lower()
        if k.startswith((b":", b"grpc-")) or k in (b"te", b"content-type", b"user-agent"):
            raise ValueError(f"metadata key {key!r} is reserved")
        v = value if isinstance(value, bytes) else str(value).encode("ascii")
        headers.append((k, v))
    return headers


def _as_pairs(headers) -> list[tuple[str, str]]:
    out = []
    for k, v in headers:
        ks = k.decode("latin-1") if isinstance(k, bytes) else k
        vs = v.decode("latin-1") if isinstance(v, bytes) else v
        out.append((ks, vs))
    return out


# A server answers most calls with the same response headers and the same trailers: what a block
# says (its pairs and their reading) is kept per distinct block, bounded, so a call's headers cost
# one lookup. Keyed by the pairs as bytes (what the HTTP/2 codec decodes); the readings are pure.
_MAX_SEEN = 256
_RESPONSE_SEEN: dict[tuple, tuple] = {}
_TRAILERS_SEEN: dict[tuple, tuple] = {}


def _seen(cache: dict[tuple, tuple], headers, read) -> tuple:
    try:
        key = tuple(headers)
        found = cache.get(key)
    except TypeError:  # unhashable pairs (not from the codec): read every time
        return read(_as_pairs(headers))
    if found is None:
        found = read(_as_pairs(headers))
        if len(cache) >= _MAX_SEEN:
            cache.clear()
        cache[key] = found
    return found


def _read_response(pairs: list[tuple[str, str]]) -> tuple:
    """The first HEADERS of a response: (pairs, None) when the call goes on, (pairs, (code,
    message)) when this block ends it without being trailers, (pairs, "trailers") for a
    trailers-only answer."""
    values = dict(pairs)
    if "grpc-status" in values:
        return tuple(pairs), "trailers"  # trailers-only: the whole answer is this one block
    http_status = values.get(":status")
    if http_status != "200":
        code = code_for_http_status(int(http_status)) if (http_status or "").isdigit() else StatusCode.UNKNOWN
        return tuple(pairs), (code, f"Received http2 header with status: {http_status}")
    ctype = values.get("content-type", "")
    if not ctype.startswith("application/grpc"):
        return tuple(pairs), (StatusCode.UNKNOWN, f"invalid content-type {ctype!r}")
    return tuple(pairs), None


def _read_trailers(pairs: list[tuple[str, str]]) -> tuple:
    """Trailers: (the metadata a caller sees, the status code, its message)."""
    values = dict(pairs)
    trailers = tuple((k, v) for k, v in pairs if not k.startswith((":", "grpc-")) and k != "content-type")
    return trailers, code_of(values.get("grpc-status")), decode_message(values.get("grpc-message"))


class CallState:
    """One call's response, from its stream's h2 events (pure).

    ``messages`` fills as DATA arrives; ``status`` is set once the call is over: ``(code,
    message)`` from the trailers (or a trailers-only response, or the HTTP status when there is
    no grpc-status, or the stream's reset), and stays as first set.
    """

    __slots__ = ("_got_headers", "decoder", "headers", "messages", "refused", "status", "trailers")

    def __init__(self, max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES):
        self.decoder = MessageDecoder(max_message_bytes)
        self.messages: collections.deque[bytes] = collections.deque()
        self.headers: tuple[tuple[str, str], ...] = ()
        self.trailers: tuple[tuple[str, str], ...] = ()
        self.status: tuple[StatusCode, str] | None = None
        self.refused = False  # reset with REFUSED_STREAM before any answer: never processed
        self._got_headers = False

    @property
    def done(self) -> bool:
        return self.status is not None

    def finish(self, code: StatusCode, message: str) -> None:
        if self.status is None:
            self.status = (code, message)

    def on_headers(self, headers) -> None:
        if self.status is not None:
            return
        if self._got_headers:
            self.on_trailers(headers)
            return
        self._got_headers = True
        pairs, verdict = _seen(_RESPONSE_SEEN, headers, _read_response)
        self.headers = pairs
        if verdict == "trailers":
            self._status_from(headers)
        elif verdict is not None:
            self.finish(*verdict)

    def on_data(self, data: bytes) -> None:
        if self.status is not None:
            return
        try:
            self.messages.extend(self.decoder.feed(data))
        except FramingError as exc:
            self.finish(exc.code, exc.message)

    def on_trailers(self, headers) -> None:
        if self.status is None:
            self._status_from(headers)

    def _status_from(self, headers) -> None:
        self.trailers, code, message = _seen(_TRAILERS_SEEN, headers, _read_trailers)
        if code == StatusCode.OK and self.decoder.pending:
            code, message = StatusCode.INTERNAL, "stream ended inside a message"
        self.finish(code, message)

    def on_end(self) -> None:
        """END_STREAM with no status seen: the server broke the protocol."""
        if self.status is None:
            self.finish(StatusCode.INTERNAL, "server closed the stream without sending trailers")

    def on_reset(self, error_code: int) -> None:
        # RST_STREAM codes as grpcio maps them: NO_ERROR/CANCEL -> CANCELLED (its server resets a
        # stream whose call it cancelled), REFUSED_STREAM -> UNAVAILABLE (never started: safe
        # to retry), ENHANCE_YOUR_CALM -> RESOURCE_EXHAUSTED, else INTERNAL.
        if error_code == 0x7:
            code = StatusCode.UNAVAILABLE
            self.refused = self.status is None and not self._got_headers
        elif error_code in (0x0, 0x8):
            code = StatusCode.CANCELLED
        elif error_code == 0xB:
            code = StatusCode.RESOURCE_EXHAUSTED
        elif error_code == 0xC:
            code = StatusCode.PERMISSION_DENIED
        else:
            code = StatusCode.INTERNAL
        self.finish(code, f"Received RST_STREAM with error code {error_code}")

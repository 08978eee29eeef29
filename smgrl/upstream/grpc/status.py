"""gRPC status codes and the one small error tree every failed call raises.

``GrpcError(code, message)`` is the base; ``DeadlineExceeded`` and ``Unavailable`` are the two a
caller most often tells apart (give up vs. try another engine), and every other code is a plain
``GrpcError`` whose ``code`` says which. Connection-level failures (refused, reset, GOAWAY for a
stream the server never started) are ``Unavailable``, as grpcio reports them.
"""

from __future__ import annotations

import enum
from urllib.parse import quote, unquote_to_bytes


class StatusCode(enum.IntEnum):
    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


class GrpcError(Exception):
    """A call that ended with a status other than OK (or never got one)."""

    def __init__(self, code: StatusCode, message: str = "", trailers: tuple = ()):
        super().__init__(f"{code.name}: {message}" if message else code.name)
        self.code = code
        self.message = message
        # The trailing metadata (lower-case str pairs, grpc-* keys removed) when the server sent it.
        self.trailers = trailers


class DeadlineExceeded(GrpcError):
    pass


class Unavailable(GrpcError):
    pass


def error_for(code: StatusCode, message: str = "", trailers: tuple = ()) -> GrpcError:
    if code == StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(code, message, trailers)
    if code == StatusCode.UNAVAILABLE:
        return Unavailable(code, message, trailers)
    return GrpcError(code, message, trailers)


def code_of(value: str | bytes | None) -> StatusCode:
    """``grpc-status``'s value; an absent or unknown one is UNKNOWN (as the spec says)."""
    try:
        return StatusCode(int(value))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return StatusCode.UNKNOWN


# When a response has no grpc-status at all, its HTTP status decides (gRPC's http-grpc mapping).
_HTTP_TO_GRPC = {
    400: StatusCode.INTERNAL,
    401: StatusCode.UNAUTHENTICATED,
    403: StatusCode.PERMISSION_DENIED,
    404: StatusCode.UNIMPLEMENTED,
    429: StatusCode.UNAVAILABLE,
    502: StatusCode.UNAVAILABLE,
    503: StatusCode.UNAVAILABLE,
    504: StatusCode.UNAVAILABLE,
}


def code_for_http_status(status: int) -> StatusCode:
    return _HTTP_TO_GRPC.get(status, StatusCode.UNKNOWN)


def decode_message(value: bytes | str | None) -> str:
    """``grpc-message`` is percent-encoded UTF-8; bad bytes are replaced, never raised on."""
    if not value:
        return ""
    raw = value.encode("latin-1") if isinstance(value, str) else value
    return unquote_to_bytes(raw).decode("utf-8", "replace")


def encode_message(text: str) -> str:
    """The inverse (servers: the fakes' aborts use grpcio's own encoding)."""
    return quote(text, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~")

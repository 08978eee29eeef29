"""Response builders for the envelopes SMG's gateway wraps around every route.

Quirks kept on purpose because clients match on them: unknown URLs and wrong methods answer the
OpenAI-style JSON error with ``x-smg-error-code``; the crate's own errors answer
``{"error": code, "message": ..., ...}``; auth refusals are ``text/plain`` (control-plane keys) or
OpenAI-style JSON (``--api-key``). Every response carries ``x-request-id``.
"""

from __future__ import annotations

import os
import random
import re
from collections.abc import Callable
from typing import Any

from quart import Response

from smgrl.core.wire import json_bytes

JSON = "application/json"
TEXT = "text/plain; charset=utf-8"
# A request id is not a secret: a fast PRNG (seeded from os.urandom) instead of ``secrets``
# (measured: 1-2% of the data plane's CPU per request with 24 ``choice`` calls).
_ids = random.Random()
# A forked child (PSRL forks its gateways' processes after importing smgrl) reseeds: a
# ``random.Random`` of its own is not reseeded by the ``random`` module, so parent and child
# would otherwise generate the same ids in the same order.
os.register_at_fork(after_in_child=_ids.seed)
MAX_REQUEST_ID = 128


# Where SMG 1.13.0 takes a caller's request id from, in order (its RequestIdLayer defaults): the
# first of these headers that is present with a visible-ASCII value; it is echoed as x-request-id.
REQUEST_ID_HEADERS = ("x-request-id", "x-correlation-id", "x-trace-id", "request-id")
_INVISIBLE = re.compile("[^\t\x20-\x7e]")


def caller_request_id(get: Callable[[str], str | None]) -> str | None:
    """The caller's request id by SMG's rule (``get`` reads one header, latin-1), else None."""
    for name in REQUEST_ID_HEADERS:
        value = get(name)
        if value is not None and _INVISIBLE.search(value) is None:
            return value
    return None


def request_id_prefix(path: str) -> str:
    """SMG's prefix for a generated id (OpenAI's, by endpoint)."""
    if path.endswith("/chat/completions"):
        return "chatcmpl-"
    if path.endswith("/completions"):
        return "cmpl-"
    if path.endswith("generate"):
        return "gnt-"
    return "req-"


# Each random byte becomes one of SMG's 62 alphanumerics (the table repeats them to 256 entries:
# a slight bias, about 5.9 bits per character, 142 per id). Measured: 1-2 us per id, where
# base64.b32encode (pure Python in CPython 3.11) took 24 us, a visible share of a rollout request.
_ALNUM = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_TO_ALNUM = bytes(_ALNUM[i % len(_ALNUM)] for i in range(256))


def new_request_id(path: str) -> str:
    """SMG's prefix (``request_id_prefix``) + 24 alphanumerics."""
    return request_id_prefix(path) + _ids.randbytes(24).translate(_TO_ALNUM).decode("ascii")


def request_id_for(header: str | None, path: str) -> tuple[str, bool]:
    """(the response's x-request-id, whether the caller supplied it). A caller id longer than 128
    characters is replaced by a generated one, which is then forwarded to engines."""
    if header and len(header) <= MAX_REQUEST_ID:
        return header, True
    return new_request_id(path), False


def json_response(status: int, obj: Any, headers: dict[str, str] | None = None) -> Response:
    body = b"" if obj is None else json_bytes(obj)
    response = Response(body, status=status, content_type=JSON)
    if headers:
        response.headers.update(headers)
    return response


def text_response(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    response = Response(text.encode("utf-8"), status=status, content_type=TEXT)
    if headers:
        response.headers.update(headers)
    return response


def openai_error(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> Response:
    body = {"error": {"type": "invalid_request_error", "code": code, "message": message, "param": None}}
    return json_response(status, body, {"x-smg-error-code": code, **(headers or {})})


def unknown_url(method: str, path: str) -> Response:
    return openai_error(404, "unknown_url", f"Invalid URL ({method} {path})")


def method_not_allowed(method: str, path: str, allow: str) -> Response:
    return openai_error(405, "method_not_allowed", f"Invalid URL ({method} {path})", {"allow": allow})


# The answer to a bug (never to bad input): Quart's error handler (app.py) and the raw
# engine-route front (rl_front.py) both send it, after logging the traceback.
INTERNAL_ERROR = {"error": "internal_error", "message": "internal error; the gateway log has the details"}

PAYLOAD_TOO_LARGE = "Request body exceeded the payload limit (max_payload_size)"
# What SMG's body extractor answers when a chunked body outgrows the limit while being read.
BODY_BUFFER_TOO_LARGE = "Failed to buffer the request body: length limit exceeded"


def payload_too_large(headers: dict[str, str] | None = None) -> Response:
    return openai_error(413, "request_body_too_large", PAYLOAD_TOO_LARGE, headers)


def empty_404() -> Response:
    """D1: ``/v1/rl/*`` without ``--enable-rl`` is 404 with an empty body."""
    return Response(b"", status=404)


def api_key_error_body(message: str) -> dict:
    """SMG's OpenAI-style body for a refused ``--api-key`` / data-plane key."""
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


def api_key_error(status: int, message: str, www_authenticate: str) -> Response:
    return json_response(status, api_key_error_body(message), {"www-authenticate": www_authenticate})

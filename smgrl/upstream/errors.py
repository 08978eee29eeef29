"""Errors raised by the upstream HTTP client, named after what went wrong with the engine.

The tree (httpx-style)::

    UpstreamError           the root: the gateway catches this one to build an outcome
    ├── ConnectError        no response could start: DNS failure, connection refused or reset,
    │                       TLS handshake failure, a failed write of the request, a closed pool
    └── ReadError           the connection closed or broke while reading the response head or body
        └── ProtocolError   the engine sent bytes that are not a valid HTTP/1.1 response

Timeouts are deliberately absent: the caller bounds every call with a trio cancel scope, and a
cancelled exchange raises ``trio.Cancelled`` like any other trio operation (its connection is
closed, never pooled).

The split matters to the caller: after a ``ConnectError`` the engine has certainly not answered
(it may or may not have seen the request, see the retry note in ``pool.py``); after a
``ReadError`` the engine has started answering, so the request was received and may have acted.
"""

from __future__ import annotations

__all__ = ["ConnectError", "ProtocolError", "ReadError", "UpstreamError"]


class UpstreamError(Exception):
    """Root of the upstream client's errors. ``str()`` is a short human sentence."""


class ConnectError(UpstreamError):
    """The exchange failed before any response byte: connect, TLS handshake or request write."""


class ReadError(UpstreamError):
    """The connection closed or broke while the response head or body was being read."""


class ProtocolError(ReadError):
    """The response is not valid HTTP/1.1 (bad status line, header, or body framing)."""

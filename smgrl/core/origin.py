"""A URL's origin, the key engine connections are pooled and compared by (pure).

``scheme://authority`` as written, cut at the first ``/``, ``?`` or ``#`` after the scheme;
``origin_key`` is its case-insensitive form (RFC 3986 §6.2.2.1: scheme and host compare without
case). No URL parser on purpose: the pool validates the origin it connects to
(``smgrl.upstream.pool``), and these only have to agree with each other.
"""

from __future__ import annotations

import functools
import re

_AUTHORITY_END = re.compile(r"[/?#]")


def _scheme_authority(url: str) -> tuple[str, str]:
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"URL `{url}` has no scheme")
    end = _AUTHORITY_END.search(rest)
    return scheme, rest if end is None else rest[: end.start()]


def hostport(host: str, port: int) -> str:
    """``host:port`` as an authority: an IPv6 address in brackets (``[::1]:8080``)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def authority_of(url: str) -> str:
    """What follows ``scheme://`` up to the path, query or fragment; ValueError without a scheme."""
    return _scheme_authority(url)[1]


def origin_of(url: str) -> str:
    """``scheme://authority`` of ``url``, spelled as given; ValueError without a scheme."""
    scheme, authority = _scheme_authority(url)
    return f"{scheme}://{authority}"


@functools.lru_cache(maxsize=4096)
def origin_key(url: str) -> str:
    """``origin_of`` without case: two URLs reach the same engine iff their keys are equal.
    Cached: the data plane looks up its engine's pool by it on every request, for a few
    engine URLs."""
    return origin_of(url).lower()

"""What a ``--journal`` value is, and how it may be shown (pure: no I/O, no driver import).

The gateway's configuration checks and shows journal URLs without loading a store.
"""

from __future__ import annotations

import urllib.parse

__all__ = ["is_postgres_url", "redact_url"]


def is_postgres_url(value: str) -> bool:
    return isinstance(value, str) and value.startswith(("postgresql://", "postgres://"))


def redact_url(url: str) -> str:
    """The URL with its password (if any) replaced by ``***``: what may be shown anywhere."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "postgresql://***"
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = urllib.parse.quote(urllib.parse.unquote(parts.username or ""), safe="")
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))

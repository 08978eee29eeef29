"""Request headers of a raw ASGI scope, for the fronts that answer before Quart
(smgrl/http/fronts/dataplane.py, smgrl/http/fronts/rl_front.py). Names are lower-case bytes, as servers pass
them; the first occurrence wins, as Quart's ``request.headers.get`` does."""

from __future__ import annotations

from typing import Any


def header(scope: dict[str, Any], name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


def header_text(scope: dict[str, Any], name: bytes) -> str | None:
    """The header decoded as latin-1 (what Quart hands its routes), or None."""
    value = header(scope, name)
    return None if value is None else value.decode("latin-1")

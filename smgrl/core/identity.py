"""An engine's startup identity: the server-info field that changes when the engine restarts (pure).

The recovered-engine rule (docs/refits.md) holds an engine out of routing when this changed: a
restarted engine is back on its initial weights, whatever its address says. Where each kind has
it (docs/engines.md):

- SGLang: ``GET /server_info`` (``/get_server_info`` on 404) -> ``startup_time`` (scheduler init
  info);
- TokenSpeed: the control app's ``GET /get_server_info`` -> ``start_time``;
- vLLM: none (the dev ``/server_info`` holds configuration and environment only, and ``/v1/models``
  stamps ``created`` per request), so only an outage the health checker saw can tell.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from smgrl.core.printable import escape

# kind -> (server-info paths, first that answers; the field that changes on restart)
ROUTES: dict[str, tuple[tuple[str, ...], str]] = {
    "sglang": (("/server_info", "/get_server_info"), "startup_time"),
    "tokenspeed": (("/get_server_info", "/server_info"), "start_time"),
}


def identity_route(kind: str | None) -> tuple[tuple[str, ...], str] | None:
    """Where ``kind`` reports its startup identity, or None when it does not."""
    return ROUTES.get(kind or "")


def startup_identity(kind: str | None, info: Mapping[str, Any] | None) -> str | None:
    """``field=value`` from a server-info document, or None (no such field, or not a scalar).
    Escaped and cut: it is the engine's text, and it reaches events, logs and terminals."""
    route = identity_route(kind)
    if route is None or not isinstance(info, Mapping):
        return None
    field = route[1]
    value = info.get(field)
    if value is None and isinstance(info.get("server_args"), Mapping):
        value = info["server_args"].get(field)
    if value is None or isinstance(value, (bool, dict, list)):
        return None
    return escape(f"{field}={value}"[:200])

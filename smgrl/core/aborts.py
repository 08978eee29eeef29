"""Which control calls abort the requests an engine is running (engines.md). Pure.

A partial-rollout loopback (docs/data-plane.md) continues a rollout only when its engine
aborted it BECAUSE of such a call made through this gateway while the request ran:

- ``pause_generation`` in mode ``abort`` (SGLang's default; TokenSpeed's default ``wait`` does
  not abort, and then nothing is aborted to attribute);
- vLLM's ``pause`` / ``sleep`` with ``mode=abort`` (the query's default);
- ``update_weight_version`` unless ``abort_all_requests`` is false (SGLang aborts by default);
- ``update_weights_from_disk|tensor|distributed`` with ``abort_all_requests: true``.

``abort_request`` / ``abort`` are deliberate cancellations by the trainer: never looped back.
``cancelled_requests`` says which requests such a call names (a request with PSRL routing
metadata is looped back on any other abort: ``smgrl.dataplane.loopback.decide``).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

ALL = "*"  # ``cancelled_requests``: the call cancels every request of the engine
CANCELS = ("abort_request", "abort_requests", "inference/v1/abort_requests")
REFITS = ("update_weights_from_disk", "update_weights_from_tensor", "update_weights_from_distributed")


def _body(body: bytes | None) -> dict[str, Any]:
    if not body:
        return {}
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return {}
    return obj if isinstance(obj, dict) else {}


def aborts_inflight(method: str, path: str, body: bytes | None, query: str | None) -> bool:
    """Does a 2xx answer to this call mean the engine aborted its running requests?"""
    if method != "POST":
        return False
    path = path.strip("/")
    if path == "pause_generation":
        return bool(_body(body).get("mode", "abort") == "abort")
    if path in ("pause", "sleep"):
        modes = parse_qs(query or "").get("mode", ["abort"])
        return modes[-1] == "abort"
    if path == "update_weight_version":
        return _body(body).get("abort_all_requests", True) is not False
    if path in REFITS:
        return _body(body).get("abort_all_requests", False) is True
    return False


def cancelled_requests(method: str, path: str, body: bytes | None) -> frozenset[str] | None:
    """The request ids a deliberate cancellation names (SGLang's ``abort_request`` ``rid``, a
    prefix as SGLang matches it; vLLM's ``request_ids``), ``{ALL}`` for one that cancels
    everything (``abort_all: true``, vLLM's call without ids), None for any other call."""
    path = path.strip("/")
    if method != "POST" or path not in CANCELS:
        return None
    obj = _body(body)
    if path == "abort_request":
        if obj.get("abort_all") is True:
            return frozenset({ALL})
        rid = obj.get("rid")
        return frozenset({rid}) if isinstance(rid, str) and rid else frozenset()
    ids = obj.get("request_ids")
    if ids is None:
        return frozenset({ALL})
    if not isinstance(ids, list):
        return frozenset()
    return frozenset(str(i) for i in ids if isinstance(i, (str, int)) and not isinstance(i, bool))

"""The data plane: rollout traffic through the gateway (docs/data-plane.md).

- ``request``: what a rollout request says (model, stream, prompt prefix), pure.
- ``table``: the fleet's routable instances per model and why each is held out, pure.
- ``stamp``: the version headers and ``system_fingerprint``, pure.
- ``breaker`` (pure), ``admission``: per-engine circuit breakers, the concurrency limit.
- ``service``: ``DataPlane``, the I/O shell: pick (waiting for an eligible engine), forward
  with retries, account.
- ``dispatch_queue``: the routing loop's queues (one per model) and each request's turn.
- ``metrics``: the data plane's Prometheus families.
- ``errors``: its error codes.
- ``testing``: helpers for tests (a gateway on loopback, a scripted engine).

The HTTP side is ``smgrl.http.fronts.dataplane`` (raw ASGI in front of Quart); the routing rules are
``smgrl.routing``.
"""

# The face: its users' import lists name the same things (`duplicates` pairs them), nothing to share.
from smgrl.dataplane.affinity import Routed
from smgrl.dataplane.dispatch_queue import DispatchQueues, Turn
from smgrl.dataplane.hook import HookError, resolve
from smgrl.dataplane.instance_stats import InstanceStats, StatsRejected, parse_snapshot
from smgrl.dataplane.pins import PinJournal, gone_releases
from smgrl.dataplane.psrl_select import PsrlCommitFailed, PsrlCommitRejected, RequestAbortedByPsManager
from smgrl.dataplane.request import CHAT, COMPLETIONS, GENERATE, ROUTING_TEXT_LIMIT, RolloutRequest, from_obj
from smgrl.dataplane.service import DataPlane
from smgrl.dataplane.stamp import (
    FingerprintEvents,
    Stamp,
    TokenTail,
    first_event_version,
    stamp_generate,
    stamp_openai,
    stream_version,
    version_tag,
)
from smgrl.dataplane.table import Entry

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "GENERATE",
    "ROUTING_TEXT_LIMIT",
    "DataPlane",
    "DispatchQueues",
    "Entry",
    "FingerprintEvents",
    "HookError",
    "InstanceStats",
    "PinJournal",
    "PsrlCommitFailed",
    "PsrlCommitRejected",
    "RequestAbortedByPsManager",
    "RolloutRequest",
    "Routed",
    "Stamp",
    "StatsRejected",
    "TokenTail",
    "Turn",
    "first_event_version",
    "from_obj",
    "gone_releases",
    "parse_snapshot",
    "resolve",
    "stamp_generate",
    "stamp_openai",
    "stream_version",
    "version_tag",
]

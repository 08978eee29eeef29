"""The admission hook (``--admission-hook module:object``): a framework's own capacity logic.

PSRL asks its PSManager whether an instance may take a request; smgrl asks a small Python
object instead, so a framework plugs its capacity logic in without forking the gateway::

    class MyHook:
        async def reserve(self, instance, request):   # -> a reservation, or a Refusal / None
            ...
        async def release(self, reservation):          # the request ended (any way)
            ...

``instance`` is an :class:`~smgrl.routing.metadata.InstanceId` (worker, DP rank) plus the
instance's model and version in ``request``'s sibling arguments (:class:`HookRequest`). A refused
instance is skipped by the selection; when every instance refuses, the request waits like any
request with no eligible engine (woken by the next fleet change or the next release). A hook that
raises counts as a refusal (logged). ``release`` gets every reservation back exactly once: when
the request ends (answered, failed, cancelled) or when a later selection of the same request
(a retry, a loopback) replaces it.

Distinct from ``smgrl.dataplane.admission`` (``--max-concurrent-requests``: how many requests
the gateway serves at once); this one is per instance and runs inside the selection. The
default (no flag) admits everything and costs nothing: no call is made.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from typing import Any, Protocol

import attrs

from smgrl.routing import InstanceId

log = logging.getLogger("smgrl.dataplane")


@attrs.frozen
class Refusal:
    reason: str = "refused"


@attrs.frozen(slots=True)
class HookRequest:
    """What the hook learns about a request (its routing metadata and the selection)."""

    request_id: str | None
    prompt_id: str | None
    version_tag: str | None  # the floor (None: unversioned)
    is_validate: bool
    model: str
    route: str
    version: str | None  # the candidate instance's version (None: unversioned)
    loopback: int  # 0 for the first dispatch, n for the n-th partial-rollout loopback
    # PSRL's ``x-response-token-count``: tokens the request's earlier legs generated (what a
    # loopback continues from; 0 for the first dispatch), for admit-time token estimates.
    response_tokens: int = 0
    # The candidate's last snapshot pushed through POST /workers/update_stats (running, waiting,
    # KV usage, per-request tokens), and its requests in flight through this gateway.
    engine_stats: Any = None
    in_flight: int = 0


class AdmissionHook(Protocol):
    async def reserve(self, instance: InstanceId, request: HookRequest) -> Any: ...

    async def release(self, reservation: Any) -> None: ...


class HookError(ValueError):
    """``--admission-hook`` cannot be loaded (one line, exit 1 at startup)."""


def resolve(spec: str) -> Any:
    """The object ``module:object`` names (a class is instantiated with no arguments)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise HookError(f"Invalid --admission-hook `{spec}` (expected module:object)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is a startup error, said in one line
        raise HookError(f"Invalid --admission-hook `{spec}`: cannot import {module_name}: {exc}") from None
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise HookError(f"Invalid --admission-hook `{spec}`: {module_name} has no `{attr}`")
    if inspect.isclass(obj):
        obj = obj()
    for name in ("reserve", "release"):
        if not inspect.iscoroutinefunction(getattr(obj, name, None)):
            raise HookError(f"Invalid --admission-hook `{spec}`: `{name}` must be an async method")
    return obj


def refused(result: Any) -> bool:
    return result is None or isinstance(result, Refusal)


async def reserve(hook: AdmissionHook, instance: InstanceId, request: HookRequest) -> Any:
    """The hook's answer; an exception is a refusal (the gateway keeps serving)."""
    try:
        return await hook.reserve(instance, request)
    except Exception as exc:  # noqa: BLE001 - a framework's bug must not take the data plane down
        log.warning("admission hook reserve failed for %r: %r", instance, exc)
        return Refusal("hook_error")


async def release(hook: AdmissionHook, reservation: Any) -> None:
    try:
        await hook.release(reservation)
    except Exception as exc:  # noqa: BLE001 - same: logged, never raised into a request's answer
        log.warning("admission hook release failed: %r", exc)

"""The steps around a pick: the admission hook's answer for a chosen instance (and giving its
reservations back), the commit of a selection and the request's end (leaving its prompt group).
Functions over the ``DataPlane`` (``smgrl/dataplane/service.py``). A prompt group's pin decided
once across gateway processes sharing a journal is ``smgrl.dataplane.pins``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import trio

from smgrl.core import Version
from smgrl.dataplane import hook as admission_hook
from smgrl.routing import InstanceId, staged

if TYPE_CHECKING:
    from smgrl.dataplane.affinity import Routed
    from smgrl.dataplane.request import RolloutRequest
    from smgrl.dataplane.service import DataPlane
    from smgrl.dataplane.table import Entry


async def ask_hook(dp: DataPlane, routed: Routed, req: RolloutRequest, model: str, entry: Entry) -> bool:
    """Ask the admission hook for ``entry``; a refusal marks it refused for this request."""
    assert dp.hook is not None
    ident = staged.identity(entry.instance)
    meta = routed.meta
    request = admission_hook.HookRequest(
        request_id=meta.request_id,
        prompt_id=meta.prompt_id,
        version_tag=routed.pinned if routed.staged else meta.version_tag,
        is_validate=meta.is_validate,
        model=model,
        route=req.route,
        version=entry.version,
        loopback=routed.loopbacks,
        response_tokens=routed.kept,
        engine_stats=dp.instance_stats.get(*ident),
        in_flight=dp.loads.get(entry.instance.worker_id, 0),
    )
    result = await admission_hook.reserve(dp.hook, InstanceId(*ident), request)
    if admission_hook.refused(result):
        routed.refused.add(ident)
        return False
    await release_hook(dp, routed)  # a retry's or loopback's earlier reservation
    routed.reservations.append(result)
    return True


async def release_hook(dp: DataPlane, routed: Routed) -> None:
    hook = dp.hook
    if hook is None or not routed.reservations:
        return
    while routed.reservations:
        await admission_hook.release(hook, routed.reservations.pop())
    # A released reservation may let a waiting request in: wake the waiters.
    dp.fleet_changed()


def commit(dp: DataPlane, routed: Routed, entry: Entry) -> None:
    """Record a selection: the first pins an unversioned staged request's version (so its
    loopbacks and echo carry it) and joins the request to its prompt group, writing the
    group's pin once when no hint was honoured."""
    hinted = routed.staged and routed.hint() is not None  # before the count: force-pin-once
    routed.selections += 1
    dp.dispatched[entry.instance.worker_id] += 1
    if not routed.staged:
        return
    if routed.pinned is None and entry.version is not None:
        routed.pinned = entry.version
        routed.floor = Version.parse(entry.version)
    prompt = routed.meta.prompt_id if dp.group_sticky else None
    if prompt is not None and routed.joined is None:
        dp.groups.join(prompt, None if hinted else InstanceId(*staged.identity(entry.instance)))
        routed.joined = prompt
        if dp.pins is not None:
            dp.pins.rejoined(prompt)


async def finish(dp: DataPlane, routed: Routed) -> None:
    """The request ended (answered, failed or cancelled): leave its prompt group and give
    the admission hook its reservation back."""
    if routed.joined is not None:
        pins = dp.pins
        release = dp.groups.leave(routed.joined, pins.identity if pins is not None else None)
        if release is not None and pins is not None:
            pins.release(routed.joined, release)
        routed.joined = None
    if routed.reservations:
        # Shielded and bounded: this runs while the request is being cancelled (client
        # gone, timeout), and a reservation never given back would leak the framework's
        # capacity for good; a hook stuck for 5 s is abandoned (logged by the hook module).
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            await release_hook(dp, routed)

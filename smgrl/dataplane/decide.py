"""The steps around a pick: the admission hook's answer for a chosen instance (and giving its
reservations back), a prompt group's pin decided once across gateway processes sharing a
journal (``smgrl.dataplane.pins``), the commit of a selection and the request's end (leaving
its prompt group). Functions over the ``DataPlane`` (``smgrl/dataplane/service.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio

from smgrl.core import Version
from smgrl.dataplane import hook as admission_hook
from smgrl.dataplane.pins import DECIDE_ROUNDS
from smgrl.routing import InstanceId, staged

if TYPE_CHECKING:
    from smgrl.dataplane.affinity import Routed
    from smgrl.dataplane.request import RolloutRequest
    from smgrl.dataplane.service import DataPlane
    from smgrl.dataplane.table import Entry

log = logging.getLogger("smgrl.dataplane")


def unpinned(dp: DataPlane, routed: Routed) -> bool:
    """A shared journal: is this the first selection of a request whose group has no pin
    anywhere in view (so its pick must be decided once, ``pin_group``)?"""
    prompt = routed.meta.prompt_id
    return (
        dp.group_sticky
        and prompt is not None
        and routed.joined is None
        and routed.staged
        and routed.hint() is None
        and dp.groups.pin(prompt) is None
    )


async def decision_in_the_air(dp: DataPlane, routed: Routed) -> None:
    """Another request of this process is deciding this request's group (``pin_group``):
    wait for its pin before picking, so this one picks once, under it."""
    prompt = routed.meta.prompt_id
    deciding = dp._deciding.get(prompt) if prompt is not None else None
    if deciding is not None and unpinned(dp, routed):
        await deciding.wait()


async def pin_group(
    dp: DataPlane, routed: Routed, entry: Entry, pick: Callable[[], Awaitable[Entry]]
) -> Entry:
    """Make ``entry`` the group's pin across processes, or select again under the pin
    another process (or another request of this one) decided first."""
    assert dp.pins is not None
    prompt = routed.meta.prompt_id
    assert prompt is not None
    for _ in range(DECIDE_ROUNDS):
        deciding = dp._deciding.get(prompt)
        if deciding is not None:
            # Another request of this process is deciding this group: wait for its pin
            # rather than race it with a second conditional append that must lose.
            await deciding.wait()
        else:
            done = dp._deciding[prompt] = trio.Event()
            try:
                # Shielded: once enqueued the pin is written whatever happens to this
                # request, and the request must then join it (``commit``, next, with no
                # checkpoint between) so that its end releases it. Bounded by the writer's
                # --journal-lock-wait-secs.
                with trio.CancelScope(shield=True):
                    won = await dp.pins.decide(prompt, InstanceId(*staged.identity(entry.instance)))
            finally:
                del dp._deciding[prompt]
                done.set()
            if won:
                return entry
        entry = await pick()  # under the winner's pin, now in view
        if not unpinned(dp, routed):
            return entry
    log.warning("prompt group %r kept changing while pinning it; routed unpinned", prompt)
    return entry


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

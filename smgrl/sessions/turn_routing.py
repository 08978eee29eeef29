"""A session turn's routing metadata: the session's defaults, overridden per turn. Pure.

PSRL's SessionRouter creates its sessions with no headers (``POST /tito/sessions``) and sends the
routing headers with every turn (``x-version-tag``, ``x-base-worker-id``/``x-target-dp-rank``,
``x-is-sticky``, ``x-force-pin-once``, besides ``x-request-id``/``x-prompt-id``). A turn's own
routing headers win over the session's defaults (the allow-listed headers of ``POST /sessions``);
then:

- **floor**: the higher of the turn's ``x-version-tag`` and the session's floor (the version
  the first turn pinned): a session never goes back to older weights;
- **hint**: honoured by the rule of the data plane (docs/data-plane.md, "When is a hint
  honoured"): a ``/control/continue`` pin for this turn, else the turn's (or the defaults')
  ``x-base-worker-id``/``x-target-dp-rank`` when it opts in (``x-is-sticky`` or
  ``x-force-pin-once``), else the last turn's instance when the session is sticky. A recorded
  echo re-sent without opting in is ignored.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from smgrl.routing import InstanceId, InvalidVersionPolicy, RoutingMeta, metadata, parse_floor


def merged_headers(defaults: Mapping[str, str], turn: Mapping[str, str]) -> dict[str, str]:
    """The session's default routing headers with the turn's own routing headers over them
    (an instance hint is taken whole: both parts from the turn, or both from the defaults)."""
    out = {k: v for k, v in defaults.items() if k in metadata.HEADERS}
    own = {k: turn[k] for k in metadata.HEADERS if turn.get(k) is not None}
    if "x-base-worker-id" in own or "x-target-dp-rank" in own:
        out.pop("x-base-worker-id", None)
        out.pop("x-target-dp-rank", None)
    out.update(own)
    return out


def _higher(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def turn_meta(
    headers: Mapping[str, str],
    *,
    session_floor: str | None,
    session_sticky: bool,
    last_instance: tuple[str, int] | None,
    pin: tuple[str, int] | None,
    rid: str,
) -> tuple[RoutingMeta, bool]:
    """The turn's metadata (``headers``: ``merged_headers``), and whether it carries PSRL
    routing metadata (a client-given request id and prompt id: ``smgrl.dataplane.loopback.decide``).
    Raises ``metadata.InvalidRoutingMetadata`` / ``InvalidVersionPolicy`` on a malformed value."""
    meta = metadata.parse(headers.get)
    psrl = meta.request_id is not None and meta.prompt_id is not None
    floor = meta.floor
    if session_floor is not None:
        try:
            floor = _higher(floor, parse_floor(session_floor))
        except InvalidVersionPolicy:
            pass
    opted = meta.hint is not None and (meta.is_sticky or meta.force_pin_once)
    if pin is not None:
        target, sticky, once = InstanceId(*pin), False, True
    elif opted:
        target, sticky, once = meta.hint, meta.is_sticky, meta.force_pin_once and not meta.is_sticky
    elif last_instance is not None and (session_sticky or meta.is_sticky):
        target, sticky, once = InstanceId(*last_instance), True, False
    else:
        target, sticky, once = None, False, False
    meta = attrs.evolve(
        meta,
        request_id=meta.request_id or rid,
        version_tag=floor.raw if floor is not None else None,
        floor=floor,
        is_sticky=sticky,
        hint=target,
        force_pin_once=once,
    )
    return meta, psrl

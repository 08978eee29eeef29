"""PSRL coordinator controls of the rollout routing loop (docs/data-plane.md).

The routes PSRL's coordinator calls, backed by the journal's projections (no second version
table, no state outside the journal but run-time counters)::

    POST /routing_loop/pause[?wait=true]   new rollout requests wait in the gateway; in-flight
                                           ones finish (``dataplane.dispatch_set``); ``wait``:
                                           answer once they have (``timeout``, 504 past it)
    POST /routing_loop/resume              dispatch again (the waiting requests go out)
    GET  /routing_loop/status              paused, epoch, waiting and running requests
    GET  /routing_loop/filter?version_tag=N  the waiting requests whose version tag is <= N
    GET  /workers/stats                    per instance: in flight, queued, dispatched, generated
                                           tokens, version, state
    POST /workers/update_weight_version    per-instance version writes (``engine.version_set``)
    POST /workers/pause | /workers/resume  hold instances out of routing / back in
                                           (``engine.state_set``; no engine is called)

Writes need the ``write`` (admin) role and are audited like every control-plane write; reads
need ``read``.
"""

from __future__ import annotations

import json
from typing import Any

import trio
from quart import Response, request

from smgrl.cluster.forwarding import PeerGone, hops
from smgrl.core import MalformedVersion, Version, validate_version
from smgrl.core.auth import READ, WRITE
from smgrl.core.errors import InvalidBody, InvalidQuery, PauseWaitTimeout
from smgrl.dataplane import StatsRejected, loopback, parse_snapshot
from smgrl.http.bodies import envelopes as env
from smgrl.http.routes.guard import Guard, who
from smgrl.http.routes.routing_loop_api import DRAIN
from smgrl.routing import (
    FALSE,
    TRUE,
    InstanceId,
    InvalidVersionPolicy,
    identity,
    matches,
    parse_floor,
    parse_version,
)

MAX_ITEMS = 4096
DEFAULT_WAIT_SECS = 30.0  # POST /routing_loop/pause?wait=true without ``timeout``
MAX_WAIT_SECS = 3600.0
SHARE_PUSH_SECS = 2.0  # how long a stats push waits for the other processes to take it


class RoutingLoopRoutes:
    def __init__(self, gateway, dataplane) -> None:
        self.gateway = gateway
        self.dataplane = dataplane
        self.guard = Guard(gateway)

    def register(self, app) -> None:
        routes = {
            "/routing_loop/pause": ("POST", self._pause),
            "/routing_loop/resume": ("POST", self._resume),
            "/routing_loop/status": ("GET", self._status),
            "/routing_loop/filter": ("GET", self._filter),
            "/routing_loop/waiting": ("GET", self._waiting),
            "/workers/update_stats": ("POST", self._push_stats),
            "/workers/pause": ("POST", self._pause_workers),
            "/workers/resume": ("POST", self._resume_workers),
            "/workers/stats": ("GET", self._stats),
            "/workers/update_weight_version": ("POST", self._versions),
        }
        for path, (method, handler) in routes.items():
            methods = ["GET", "HEAD"] if method == "GET" else [method]
            app.add_url_rule(
                path, "psrl" + path.replace("/", "_"), self._route(method, handler), methods=methods
            )

    def _route(self, method: str, handler):
        async def route() -> Response:
            shown = (request.scope.get("raw_path") or request.path.encode()).decode("latin-1")
            action = READ if method == "GET" else WRITE
            return await self.guard.answer(action, shown, lambda check: handler(check.principal))

        return route

    async def _set(self, paused: bool, principal) -> bool:
        """Switch dispatch; True when it changed (journaled)."""
        return await self.gateway.writes.set_dispatch(paused, *who(principal))

    def _switched(self, paused: bool, changed: bool, **extra) -> Response:
        body = {"action": "pause" if paused else "resume", "changed": changed, **extra, **self._status_body()}
        return env.json_response(200, body)

    async def _pause(self, principal) -> Response:
        wait = request.args.get("wait", "false").strip().lower()
        if wait not in TRUE | FALSE | {DRAIN}:
            raise InvalidQuery("`wait` must be true, false or drain")
        timeout = _seconds(request.args.get("timeout"))
        changed = await self._set(True, principal)
        if wait != DRAIN:
            # ``wait=true`` (PSRL's fork): answer once in-progress selection has drained. A
            # selection here is one synchronous step, so none is ever half-done: at once.
            return self._switched(True, changed)
        # In-flight requests finish on their own (a pause never aborts anything); the answer
        # says they have, or, past ``timeout``, how many are still running (dispatch stays
        # paused either way: the journal has it).
        if not await self.dataplane.wait_idle(trio.current_time() + timeout):
            raise PauseWaitTimeout(
                f"dispatch is paused, but {self.dataplane.in_flight} requests were still in flight after "
                f"{timeout:g}s (wait again, or resume)",
                running_request_num=self.dataplane.in_flight,
            )
        return self._switched(True, changed, drained=True)

    async def _resume(self, principal) -> Response:
        return self._switched(False, await self._set(False, principal))

    def _status_body(self) -> dict[str, Any]:
        dataplane = self.dataplane
        loop = self.gateway.fleet.routing
        running = sum(dataplane.loads.values())
        return {
            "enabled": True,
            "paused": loop.paused,
            "routing": not loop.paused,
            # PSRL's fork counts decisions in progress and hand-offs to dispatch; a selection
            # here never spans an await, so neither is ever in progress when this is read.
            "selecting": False,
            "active_dispatch_handoffs": 0,
            "routing_epoch": loop.revision,
            "queue_len": dataplane.waiting,
            "pending_request_num": dataplane.waiting,
            "running_tasks": running,
            "running_request_num": running,
            "max_running_dispatch_tasks": None,
            **_partitions(dataplane),
            "prompt_groups": len(dataplane.groups),
        }

    async def _status(self, principal) -> Response:
        return env.json_response(200, self._status_body())

    async def _stats(self, principal) -> Response:
        dataplane = self.dataplane
        rows = []
        hints = [
            (hint, n) for hint, n in dataplane.queued.items() if n
        ]  # few: one per waiting pinned request
        for model_id, slot in sorted(dataplane.table().models.items()):
            for entry in slot.entries:
                inst = entry.instance
                base, rank = identity(inst)
                rows.append(
                    {
                        "worker_id": inst.worker_id,
                        "base_worker_id": base,
                        "dp_rank": rank,
                        "url": inst.url,
                        "model": model_id,
                        "weight_version": entry.version,
                        "control": entry.control,
                        "held": entry.hold,
                        "in_flight": dataplane.loads.get(inst.worker_id, 0),
                        "queued": sum(n for hint, n in hints if matches(inst, hint)),
                        "dispatched": dataplane.dispatched.get(inst.worker_id, 0),
                        "tokens": dataplane.tokens.get(inst.worker_id, 0),
                        # PSRL's fork's fields: the version as a number (-1: none) and the
                        # requests running on the instance.
                        "version_tag": _number(entry.version) if entry.version is not None else -1,
                        "running_requests": dataplane.loads.get(inst.worker_id, 0),
                        "engine_stats": _engine_stats(dataplane, base, rank),
                    }
                )
        return env.json_response(200, {"workers": rows, "total": len(rows), "waiting": dataplane.waiting})

    async def _filter(self, principal) -> Response:
        """PSRL's fork: a list of ``{request_id, prompt_id, version_tag, is_validate}``, the
        waiting requests with routing metadata whose version tag is at most ``version_tag``."""
        _, bound = _version_tag_bound()
        rows = []
        for facts in list(self.dataplane.waiting_requests.values()):
            routed = facts.get("routed")
            if not loopback.carries_metadata(routed):
                continue
            tag = facts["version_tag"]
            if tag is None or (bound is not None and parse_version(tag) <= bound):
                meta = routed.meta
                rows.append(
                    {
                        "request_id": _number(meta.request_id),
                        "prompt_id": _number(meta.prompt_id),
                        "version_tag": _number(tag) if tag is not None else -1,
                        "is_validate": meta.is_validate,
                    }
                )
        return env.json_response(200, rows)

    async def _waiting(self, principal) -> Response:
        raw, bound = _version_tag_bound()
        rows = []
        now = trio.current_time()
        for facts in list(self.dataplane.waiting_requests.values()):
            tag = facts["version_tag"]
            # Unversioned requests (-1) are below every bound; -1 as the bound keeps only them.
            if tag is None or (bound is not None and parse_version(tag) <= bound):
                rows.append(
                    {
                        **{k: v for k, v in facts.items() if k not in ("waiting_since", "routed")},
                        "version_tag": tag if tag is not None else "-1",
                        "waiting_secs": round(now - facts["waiting_since"], 3),
                    }
                )
        body = {"version_tag": raw.strip(), "requests": rows, "total": len(rows)}
        return env.json_response(200, body)

    async def _push_stats(self, principal) -> Response:
        """PSRL's ``POST /workers/update_stats``: the newest engine snapshot per instance, kept
        in this process's memory (``smgrl.dataplane.instance_stats``), never journaled."""
        data = await request.get_data(cache=False)
        items = _stats_items(data)
        results = [self._push_one(item) for item in items]
        await self._share_push(data)
        counts = {k: sum(r["status"] == k for r in results) for k in ("updated", "stale_ignored", "rejected")}
        return env.json_response(200, {"total": len(results), **counts, "results": results})

    async def _share_push(self, data: bytes) -> None:
        """Several processes (``--workers N``, shared journal): the push reached this one; the
        others get it too (one hop, ``x-smgrl-forwarded``), so every process routes with the same
        snapshots. Bounded (a peer that does not answer within the bound misses this push, and
        gets the next), never an error for the caller."""
        fwd = self.gateway.forwarder
        headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in request.headers.items()]
        if fwd is None or hops(headers):
            return

        async def one(peer) -> None:
            try:
                await fwd.request(peer, "POST", "/workers/update_stats", headers, data, 0)
            except (PeerGone, OSError):
                pass  # gone or unreachable: its next push comes at the next interval

        # The peers are asked at once, each bounded: this nursery ends within SHARE_PUSH_SECS.
        with trio.move_on_after(SHARE_PUSH_SECS):
            peers = await fwd.live_peers()
            async with trio.open_nursery() as nursery:
                for peer in peers:
                    nursery.start_soon(one, peer)

    def _push_one(self, item: dict[str, Any]) -> dict[str, Any]:
        worker_id, rank = item.get("worker_id"), item.get("dp_rank")
        out: dict[str, Any] = {"status": "rejected", "worker_id": worker_id, "url": "", "applied": False}
        if rank is not None:
            out["dp_rank"] = rank
        found = self._instance(worker_id, rank)
        if found is None:
            return {**out, "stale_reason": f"no instance ({worker_id}, {rank if rank is not None else 0})"}
        (base, at), url = found
        try:
            stats = parse_snapshot(item)
        except StatsRejected as exc:
            return {**out, "worker_id": base, "url": url, "stale_reason": str(exc)}
        kept = self.dataplane.instance_stats.put(base, at, stats)
        status = "updated" if kept else "stale_ignored"
        out.update(status=status, worker_id=base, url=url, applied=kept)
        if not kept:
            out["stale_reason"] = "older than the snapshot kept for this instance"
        return out

    def _instance(self, worker_id: Any, rank: Any) -> tuple[tuple[str, int], str] | None:
        """The routable instance an item names: the registry id (or URL) of the engine's rank-0
        record with ``dp_rank``, or a rank's own record without one."""
        if not isinstance(worker_id, str) or (rank is not None and (type(rank) is not int or rank < 0)):
            return None
        hint = InstanceId(worker_id, rank if rank is not None else 0)
        for slot in self.dataplane.table().models.values():
            for entry in slot.entries:
                inst = entry.instance
                if matches(inst, hint) or (rank is None and worker_id in (inst.worker_id, inst.url)):
                    return identity(inst), inst.url
        return None

    async def _pause_workers(self, principal) -> Response:
        return await self._hold(True, principal)

    async def _resume_workers(self, principal) -> Response:
        return await self._hold(False, principal)

    async def _hold(self, paused: bool, principal) -> Response:
        """PSRL's /workers/pause|resume: hold instances out of routing (or back in), as the
        state write ``POST /v1/rl/workers/{id}/state`` does (``ControlWrites.set_held``)."""
        items = _hold_items(await request.get_data(cache=False))
        results = await self.gateway.writes.set_held(items, paused, *who(principal))
        updated = sum(r["status"] != "rejected" for r in results)
        body = {
            "action": "pause" if paused else "resume",
            "total": len(results),
            "updated": updated,
            "rejected": len(results) - updated,
            "results": results,
        }
        return env.json_response(200, body)

    async def _versions(self, principal) -> Response:
        items = _items(await request.get_data(cache=False))
        results = await self.gateway.writes.set_versions(items, *who(principal))
        updated = sum(r["status"] == "updated" for r in results)
        body = {
            "total": len(results),
            "updated": updated,
            "rejected": len(results) - updated,
            "results": results,
        }
        return env.json_response(200, body)


def _partitions(dataplane) -> dict[str, Any]:
    """The fork's ``queue_keys`` and ``partition_queue_lens``: with the routing loop, its queue's
    partitions (by version tag with ``routing_loop_multi_priority_queue``, else key 0); without
    it, every waiting request under key 0."""
    queues = dataplane.queues
    if queues is None:
        n = dataplane.waiting
        parts: dict[Any, int] = {0: n} if n else {}
    else:
        parts = queues.partitions()
    keys = sorted(parts, key=lambda k: (isinstance(k, str), k))
    return {"queue_keys": keys, "partition_queue_lens": {str(k): parts[k] for k in keys}}


def _number(value: str | None):
    """An id or version as PSRL's fork answers it: a number when it is a decimal integer."""
    if value is not None and value.lstrip("-").isdigit() and value.isascii():
        return int(value)
    return value


def _engine_stats(dataplane, base: str, rank: int) -> dict[str, Any] | None:
    stats = dataplane.instance_stats.get(base, rank)
    return stats.to_json() if stats is not None else None


def _version_tag_bound() -> tuple[str, Version | None]:
    """The required ``version_tag`` query of the fork's waiting lists: the raw text and its
    bound (None for -1: only unversioned requests), 400 ``invalid_query`` otherwise."""
    raw = request.args.get("version_tag")
    if raw is None:
        raise InvalidQuery("`version_tag` is required (a version, or -1)")
    try:
        return raw, parse_floor(raw)
    except InvalidVersionPolicy as exc:
        raise InvalidQuery(str(exc)) from None


def _json_list(data: bytes, least: int, item: str) -> list[Any]:
    """A JSON list body of ``least`` to ``MAX_ITEMS`` entries (400 ``invalid_body``); its items
    are checked by the caller."""
    try:
        items = json.loads(data) if data else None
    except (ValueError, UnicodeDecodeError):
        raise InvalidBody("the body is not valid JSON") from None
    if not isinstance(items, list) or len(items) < least or len(items) > MAX_ITEMS:
        raise InvalidBody(_list_shape(least, item))
    return items


def _list_shape(least: int, item: str) -> str:
    count = f"at most {MAX_ITEMS}" if least == 0 else f"{least}-{MAX_ITEMS}"
    return f"expected a list of {count} {item} objects"


def _stats_items(data: bytes) -> list[dict[str, Any]]:
    """PSRL's ``[{worker_id, dp_rank?, timestamp?, scheduler_stats?}]`` (400 ``invalid_body``
    for anything but a list of objects whose fields have their types; an item that names no
    instance is rejected in the results, the others are still taken)."""
    items = _json_list(data, 0, "{worker_id, dp_rank?, scheduler_stats}")
    if not all(isinstance(i, dict) for i in items):
        raise InvalidBody(_list_shape(0, "{worker_id, dp_rank?, scheduler_stats}"))
    for n, item in enumerate(items):
        for name, kinds in _STATS_FIELDS:
            value = item.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
                raise InvalidBody(f"item {n}: `{name}` must be {_KIND_NAMES[kinds]}")
    return items


# The types of a stats push item's fields (any other field is ignored).
_STATS_FIELDS = (("worker_id", str), ("dp_rank", int), ("timestamp", str), ("scheduler_stats", dict))
_KIND_NAMES = {str: "a string", int: "an integer", dict: "an object"}


def _items(data: bytes) -> list[dict[str, Any]]:
    """``[{"worker_id", "dp_rank"?, "weight_version"}]``, checked (400 ``invalid_body``)."""
    items = _json_list(data, 1, "{worker_id, dp_rank?, weight_version}")
    out = []
    for n, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("worker_id"), str):
            raise InvalidBody(f"item {n}: expected an object with a string `worker_id`")
        rank = item.get("dp_rank")
        if rank is not None and (type(rank) is not int or rank < 0):
            raise InvalidBody(f"item {n}: `dp_rank` must be a non-negative integer")
        raw = item.get("weight_version")
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            raise InvalidBody(f"item {n}: `weight_version` must be a string or an integer")
        try:
            version = validate_version(str(raw))
        except MalformedVersion as exc:
            raise InvalidBody(f"item {n}: {exc}") from None
        out.append({"worker_id": item["worker_id"], "dp_rank": rank, "weight_version": version})
    return out


def _seconds(raw: str | None) -> float:
    """``timeout`` of a waiting pause: seconds, 0 < t <= MAX_WAIT_SECS (400 ``invalid_query``)."""
    if raw is None:
        return DEFAULT_WAIT_SECS
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_WAIT_SECS:  # NaN fails too
        raise InvalidQuery(f"`timeout` must be a number of seconds in (0, {MAX_WAIT_SECS:g}]")
    return value


def _hold_items(data: bytes) -> list[tuple[str, set[int] | None]]:
    """PSRL's ``[{"worker_id"? | "base_worker_id"?, "dp_rank"?: int | [int]}]`` as (worker,
    ranks or None for all), checked (400 ``invalid_body``)."""
    items = _json_list(data, 1, "{worker_id, dp_rank?}")
    out = []
    for n, item in enumerate(items):
        if not isinstance(item, dict):
            raise InvalidBody(f"item {n}: expected an object with a string `worker_id` (or `base_worker_id`)")
        # Each name that is present must be a non-empty string (null included: the schema says
        # string), and the two must agree when both are sent.
        named = [item[key] for key in ("worker_id", "base_worker_id") if key in item]
        if not named or not all(isinstance(w, str) and w for w in named) or len(set(named)) > 1:
            raise InvalidBody(f"item {n}: expected an object with a string `worker_id` (or `base_worker_id`)")
        wid = named[0]
        if "dp_rank" in item and item["dp_rank"] is None:
            raise InvalidBody(f"item {n}: `dp_rank` must be a non-negative integer or a list of them")
        rank = item.get("dp_rank")
        ranks = [rank] if type(rank) is int else rank
        if rank is not None and (
            not isinstance(ranks, list) or not ranks or not all(type(r) is int and r >= 0 for r in ranks)
        ):
            raise InvalidBody(f"item {n}: `dp_rank` must be a non-negative integer or a list of them")
        out.append((wid, None if rank is None else set(ranks)))
    return out

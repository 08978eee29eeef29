"""Refit and quarantine routes (docs/refits.md): parse, authorize, call ``RefitService``, render.

POST   /v1/rl/refits                      (admin) start a refit saga -> 202 {refit_id, ...}
GET    /v1/rl/refits/{id}                 the plan and each engine's phase
GET    /v1/rl/refits/{id}/events          server-sent events: the same record on every change
POST   /v1/rl/refits/{id}/commit          (admin) the trainer's transfer is done
POST   /v1/rl/refits/{id}/fail            (admin) the trainer's transfer failed
POST   /v1/rl/refits/{id}/transfer        (admin) one broadcast chunk's engine side
POST   /v1/rl/workers/{id}/quarantine     (admin) hold an engine out of routing, by hand
DELETE /v1/rl/workers/{id}/quarantine     (admin) release it
"""

from __future__ import annotations

import json

import trio
from quart import Response, g, request

from smgrl.api import envelopes as env
from smgrl.api.guard import Guard
from smgrl.auth import READ, WRITE
from smgrl.errors import InvalidBody, WorkerNotFound
from smgrl.refit.request import parse_refit

SSE_KEEPALIVE_SECS = 15.0
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
# The methods each endpoint serves (the rest answer 405 with this ``allow``); the OpenAPI test
# reads it.
ALLOW = {
    "refit_create": "POST",
    "refit_show": "GET,HEAD",
    "refit_events": "GET",
    "refit_commit": "POST",
    "refit_fail": "POST",
    "refit_transfer": "POST",
    "refit_quarantine": "POST,DELETE",
}


def _small_json(data: bytes, fields: dict[str, type]) -> dict:
    """An optional JSON object body with a few known fields (empty body = {})."""
    if not data.strip():
        return {}
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InvalidBody("the body is not JSON") from None
    if not isinstance(body, dict):
        raise InvalidBody("the body must be a JSON object")
    for key, value in body.items():
        if key not in fields:
            raise InvalidBody(f"unknown field `{key}`")
        if value is not None and not isinstance(value, fields[key]):
            raise InvalidBody(f"`{key}` has the wrong type")
    return body


class RefitsApi:
    def __init__(self, gateway) -> None:
        self.gw = gateway
        self.guard = Guard(gateway)

    @property
    def service(self):
        return self.gw.refits

    def register(self, app) -> None:
        # Every method is routed here so that the others answer 405 (with ``allow``), not 404.
        app.add_url_rule("/v1/rl/refits", "refit_create", self.refits, methods=METHODS)
        app.add_url_rule("/v1/rl/refits/<refit_id>", "refit_show", self.refit, methods=METHODS)
        app.add_url_rule("/v1/rl/refits/<refit_id>/events", "refit_events", self.events, methods=METHODS)
        for action in ("commit", "fail", "transfer"):
            app.add_url_rule(
                f"/v1/rl/refits/<refit_id>/{action}",
                f"refit_{action}",
                self._action_view(action),
                methods=METHODS,
            )
        app.add_url_rule(
            "/v1/rl/workers/<worker_id>/quarantine", "refit_quarantine", self.quarantine, methods=METHODS
        )

    def _action_view(self, action: str):
        async def view(refit_id: str) -> Response:
            return await self.action(refit_id, action)

        return view

    async def _guarded(self, action: str, allow: str, handler) -> Response:
        raw = request.scope.get("raw_path") or request.path.encode()
        shown = raw.decode("latin-1")
        if request.method not in allow.split(","):
            return env.method_not_allowed(request.method, shown, allow)

        async def call(check) -> Response:
            return await handler(check.principal.label if check.principal is not None else None)

        return await self.guard.answer(action, shown, call)

    async def refits(self) -> Response:
        async def start(principal):
            req = parse_refit(await request.get_data(cache=False))
            refit_id = await self.service.start(req, principal, getattr(g, "request_id", None))
            body = self.service.view(self.service.get(refit_id))
            return env.json_response(202, body, {"location": f"/v1/rl/refits/{refit_id}"})

        return await self._guarded(WRITE, "POST", start)

    async def refit(self, refit_id: str) -> Response:
        async def show(_principal):
            return env.json_response(200, self.service.view(self.service.get(refit_id)))

        return await self._guarded(READ, "GET,HEAD", show)

    async def events(self, refit_id: str) -> Response:
        async def stream(_principal):
            self.service.get(refit_id)  # 404 before the stream starts
            return Response(
                self._sse(refit_id),
                status=200,
                content_type="text/event-stream",
                headers={"cache-control": "no-store"},
            )

        return await self._guarded(READ, "GET", stream)

    async def _sse(self, refit_id: str):
        """The refit's record on every change, until it finishes (then one last record)."""
        last = None
        while True:
            # Take the change event BEFORE reading the record: a change while this generator is
            # suspended at a yield then still wakes it.
            changed = self.service.change_event()
            saga = self.service.fleet.sagas.get(refit_id)
            if saga is None:
                return
            body = self.service.view(saga)
            if body["last_seq"] != last:
                last = body["last_seq"]
                data = json.dumps(body, separators=(",", ":"))
                yield f"event: refit\nid: {last}\ndata: {data}\n\n".encode()
            if not saga.is_open:
                return
            with trio.move_on_after(SSE_KEEPALIVE_SECS) as scope:
                await changed.wait()
            if scope.cancelled_caught:
                yield b": keepalive\n\n"

    async def action(self, refit_id: str, action: str) -> Response:
        async def run(_principal):
            data = await request.get_data(cache=False)
            if action == "commit":
                _small_json(data, {})
                await self.service.commit(refit_id)
            elif action == "fail":
                body = _small_json(data, {"reason": str})
                await self.service.fail(refit_id, body.get("reason"))
            else:
                body = _small_json(data, {"names": list, "dtypes": list, "shapes": list})
                if any(not isinstance(body.get(k), list) for k in ("names", "dtypes", "shapes")):
                    raise InvalidBody("`names`, `dtypes` and `shapes` are required lists")
                if not len(body["names"]) == len(body["dtypes"]) == len(body["shapes"]):
                    raise InvalidBody("`names`, `dtypes` and `shapes` must have the same length")
                out = await self.service.transfer_chunk(
                    refit_id, body["names"], body["dtypes"], body["shapes"]
                )
                return env.json_response(200, out)
            return env.json_response(202, self.service.view(self.service.get(refit_id)))

        return await self._guarded(WRITE, "POST", run)

    async def quarantine(self, worker_id: str) -> Response:
        async def run(principal):
            data = await request.get_data(cache=False)
            body = _small_json(data, {"reason": str})
            worker = self.gw.fleet.registry.get(worker_id)
            if worker is None or not worker.is_visible:
                raise WorkerNotFound(worker_id)
            reason = (
                body.get("reason")
                or ("quarantined by hand" if request.method == "POST" else "released by hand")
            )[:500]
            if request.method == "POST":
                await self.service.quarantine(worker, reason, principal)
            else:
                await self.service.release(worker, reason, principal)
            facts = self.gw.fleet.engines.get(worker.base_url)
            return env.json_response(
                200,
                {
                    "worker_id": worker.id,
                    "quarantined": facts is not None and facts.quarantined is not None,
                    "reason": facts.quarantined if facts is not None else None,
                },
            )

        return await self._guarded(WRITE, "POST,DELETE", run)

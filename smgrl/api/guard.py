"""Per-request auth and audit for control-plane routes (``/v1/rl/*`` and ``/workers*``).

``Guard.check(action, path)`` decides with ``smgrl.auth`` and, on leaving, appends one
``audit.control_plane`` event (decision D2: on by default, allowed AND denied requests;
``--disable-audit-logging`` turns it off). Audit events are queued, not awaited: the operation's
own awaited records flush them, and the writer drains its queue at shutdown.
"""

from __future__ import annotations

import contextlib
import logging

import attrs
from quart import Response, g, request

from smgrl.api import envelopes as env
from smgrl.auth import Denied, Principal
from smgrl.journaling import ev
from smgrl.logs import event as log_event

log = logging.getLogger("smgrl.audit")


@attrs.define
class Check:
    principal: Principal | None = None
    denied: Response | None = None
    status: int = 0


class Guard:
    def __init__(self, gateway) -> None:
        self.gw = gateway

    @contextlib.asynccontextmanager
    async def check(self, action: str, path: str):
        decision = self.gw.auth.check(request.headers.get("authorization"), action)
        check = Check()
        reason = None
        if isinstance(decision, Denied):
            reason = decision.reason
            self.gw.metrics.auth_denied.labels(status=str(decision.status)).inc()
            if decision.json:
                check.denied = env.api_key_error(decision.status, decision.message, decision.www_authenticate)
            else:
                headers = (
                    {"www-authenticate": decision.www_authenticate} if decision.www_authenticate else None
                )
                check.denied = env.text_response(decision.status, decision.message, headers)
            check.status = decision.status
            principal = decision.principal
        else:
            check.principal = principal = decision
        try:
            yield check
        finally:
            self._audit(principal, path, check, reason)

    def _audit(self, principal: Principal, path: str, check: Check, reason: str | None) -> None:
        if not self.gw.cfg.audit:
            return
        outcome = "denied" if check.denied is not None else "success"
        fields = {
            "principal": principal.label,
            "auth_method": principal.auth_method,
            "role": principal.role,
            "method": request.method,
            "path": path,
            "resource": path.split("/")[3] if path.count("/") >= 3 else None,
            "outcome": outcome,
            "status": check.status,
            "request_id": getattr(g, "request_id", None),
            "reason": reason,
        }
        self.gw.journal.append_nowait("audit", ev("audit.control_plane", **fields))
        log_event(log, "control_plane_audit", **fields)

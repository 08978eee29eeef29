"""Per-request auth and audit for control-plane routes (``/v1/rl/*`` and ``/workers*``).

``Guard.check(action, path)`` decides with ``smgrl.core.auth``; on leaving, every request, allowed or
denied, gets one ``control_plane_audit`` log line (decision D2; the path cut to ``LOG_PATH_CAP``
characters). In the journal (``smgrl/telemetry/audit.py``): an allowed write is one ``audit.control_plane``
event - committed by the operation itself with its final records when the service took it
(``Check.audit_event``), else queued here - while reads and denials are only counted and
journaled as ``audit.control_plane_counts`` once per interval. ``--disable-audit-logging`` turns
all of it off. With no control-plane auth configured, the log lines of allowed reads are at DEBUG
(every caller is the same anonymous admin: one INFO line per discovery poll says nothing).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import attrs
from quart import Response, g, request
from werkzeug.exceptions import RequestEntityTooLarge

from journal import JournalWriteError
from smgrl.core.auth import READ, Denied, Principal
from smgrl.core.errors import RlError
from smgrl.events import AuditControlPlane
from smgrl.http.bodies import envelopes as env
from smgrl.telemetry.audit import route_family
from smgrl.telemetry.logs import event as log_event

log = logging.getLogger("smgrl.audit")

# Characters of a path kept in an audit log line or event; the rest is replaced by a marker with
# the full length. A path is whatever a client sent (up to the server's 16 KiB head).
LOG_PATH_CAP = 512


def short_path(path: str) -> str:
    if len(path) <= LOG_PATH_CAP:
        return path
    return f"{path[:LOG_PATH_CAP]}...({len(path)} chars)"


@attrs.frozen
class Envelope:
    """How a route family answers: which exceptions are answers (``errors``), how one of them
    renders (``render``), and the answer to a chunked body that outgrew --max-payload-size
    (``too_large``; a declared Content-Length over it is refused before routing, in app.py)."""

    errors: tuple[type[BaseException], ...]
    render: Callable[[BaseException], Response]
    too_large: Callable[[], Response]


# SMG's RL envelope (the /v1/rl routes, the refit and routing-loop routes); axum's text 413.
RL_ENVELOPE = Envelope(
    errors=(RlError,),
    render=lambda exc: env.json_response(exc.status, exc.body()),
    too_large=lambda: env.text_response(413, env.BODY_BUFFER_TOO_LARGE),
)


@attrs.define
class Check:
    principal: Principal | None = None
    denied: Response | None = None
    status: int = 0
    fields: dict = attrs.Factory(dict)
    journaled: bool = False  # the service committed the audit event with its own records

    def audit_event(self, status: int):
        """This request's ``audit.control_plane`` event for ``status``, for a service that commits
        it in its own final transaction (smgrl/control/service.py); the guard then does not
        append it again."""
        self.journaled = True
        return AuditControlPlane(**self.fields, outcome="success", status=status)


class Guard:
    def __init__(self, gateway) -> None:
        self.gateway = gateway

    @contextlib.asynccontextmanager
    async def check(self, action: str, path: str):
        decision = self.gateway.auth.check(request.headers.get("authorization"), action)
        check = self.begin(decision, action, request.method, path, getattr(g, "request_id", None))
        # Services that journal their own records take the audit event from here (rl_routes.py
        # passes it on in the CallContext).
        g.audit_check = self.audit_check(check, action)
        try:
            yield check
        finally:
            self._audit(action, path, check)

    async def answer(self, action: str, path: str, call, envelope: Envelope = RL_ENVELOPE) -> Response:
        """The guarded-request path every Quart control-plane route shares (rl_routes.py,
        rl_writes.py, refits.py, routing_loop.py, stream.py, workers.py): auth and audit through
        ``check``, then ``await call(check)``; an error of the route family becomes its answer in
        the family's ``envelope`` (a too-large chunked body included), and the answer's status is
        recorded for the audit. (The raw-ASGI engine front, rl_front.py, answers bytes outside
        Quart's request context: it uses ``begin``/``end``.)"""
        async with self.check(action, path) as check:
            if check.denied is not None:
                return check.denied
            try:
                response = await call(check)
            except RequestEntityTooLarge:
                response = envelope.too_large()
            except envelope.errors as exc:
                response = envelope.render(exc)
            check.status = response.status_code
            return response

    def begin(self, decision, action: str, method: str, path: str, request_id: str | None) -> Check:
        """The request's ``Check`` for an auth decision (a denial gets its answer and its count);
        also used by the raw engine-route front (smgrl/http/fronts/rl_front.py), which calls ``end``."""
        check = Check()
        reason = None
        if isinstance(decision, Denied):
            reason = decision.reason
            self.gateway.metrics.auth_denied.labels(status=str(decision.status)).inc()
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
        check.fields = _fields(principal, method, path, request_id, reason)
        return check

    def audit_check(self, check: Check, action: str) -> Check | None:
        """The check whose audit event the operation commits itself, or None (reads, denials,
        audit off)."""
        return check if self.gateway.cfg.audit and check.denied is None and action != READ else None

    def end(self, action: str, path: str, check: Check) -> None:
        """The audit (count, event, log line) of a request checked with ``begin``."""
        self._audit(action, path, check)

    def allowed_read(self, principal: Principal, method: str, path: str, request_id: str) -> None:
        """The audit of an allowed read answered outside Quart (smgrl/http/fronts/rl_front.py): the same
        count and log line as ``check`` gives it."""
        check = Check(
            principal=principal, status=200, fields=_fields(principal, method, path, request_id, None)
        )
        self._audit(READ, path, check)

    def _audit(self, action: str, path: str, check: Check) -> None:
        if not self.gateway.cfg.audit:
            return
        denied = check.denied is not None
        outcome = "denied" if denied else "success"
        fields = {**check.fields, "outcome": outcome, "status": check.status}
        if denied or action == READ:
            self.gateway.audit.add(fields["principal"], route_family(path), outcome, fields["reason"])
        elif not check.journaled:
            try:
                self.gateway.journal.append_nowait("audit", AuditControlPlane(**fields))
            except JournalWriteError as exc:  # queue full or writer closing: the log line remains
                log.warning("audit event not journaled: %s", exc)
        quiet = not denied and action == READ and not self.gateway.auth.configured
        log_event(log, "control_plane_audit", logging.DEBUG if quiet else logging.INFO, **fields)


def who(principal: Principal | None) -> tuple[str | None, str | None]:
    """(principal label, request id) that a journaled write records (smgrl/control/writes.py)."""
    return (principal.label if principal else None, getattr(g, "request_id", None))


def _fields(principal: Principal, method: str, path: str, request_id: str | None, reason: str | None) -> dict:
    shown = short_path(path)
    return {
        "principal": principal.label,
        "auth_method": principal.auth_method,
        "role": principal.role,
        "method": method,
        "path": shown,
        "resource": shown.split("/")[3] if shown.count("/") >= 3 else None,
        "request_id": request_id,
        "reason": reason,
    }

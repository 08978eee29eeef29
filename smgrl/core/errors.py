"""Every error smgrl answers with, its stable machine code, and the envelopes that render it.

Clients branch on the code, never on the message, so codes never change once shipped. The RL codes
and their HTTP statuses are SMG 1.13.0's (docs/rl-control-plane.md, "Errors"); the data plane's are SMG's
OpenAI-style codes (``x-smg-error-code``)::

    SmgrlError
    ├── ConfigError                 startup flag validation; ``smgrl launch`` exits 1 with its text
    ├── StartupError                the gateway cannot start (port in use, journal owned by another
    │                               gateway, missing directory, foreign/newer/tampered journal):
    │                               ``smgrl launch`` prints its one line and exits 1
    ├── ApiError                    an answer: ``code``, ``status``, ``message``, ``context``
    │   ├── RlError                 rendered by ``rl_body``: ``{"error": code, "message": ..., **context}``
    │   │   ├── InvalidEnginePath       invalid_engine_path      400
    │   │   ├── SelectorRequired        selector_required        400
    │   │   ├── InvalidSelector         invalid_selector         400  + offset
    │   │   ├── NoWorkersMatch          no_workers_match         400  + selector
    │   │   ├── InvalidBody             invalid_body             400
    │   │   ├── InvalidVersion          invalid_version          400
    │   │   ├── InvalidVersionPolicyHeader invalid_version_policy 400  (a rollout's header: the RL
    │   │   │                                                          crate's envelope, as SMG answers it)
    │   │   ├── WorkerNotFound          worker_not_found         404  + id
    │   │   ├── OperationNotFound       operation_not_found      404  + id
    │   │   ├── InvalidQuery            invalid_query            400  a journal route's query (after, limit, type, ...)
    │   │   ├── (smgrl/refit/errors.py) refit_unsupported 409 · version_left 409 · refit_in_progress 409
    │   │   │                           refit_not_found 404 · refit_state 409 (the refit routes)
    │   │   │                           refit_driver_unavailable 503 (retry: its driver died, being resumed)
    │   │   ├── NoControlEndpoint       no_control_endpoint      422  + worker_id, url, connection_mode
    │   │   ├── UpstreamTimeout         upstream_timeout         504  + worker_id, url
    │   │   ├── JournalUnavailable      journal_unavailable      503  (the journal cannot take the record)
    │   │   ├── TooManyStreams          too_many_streams         429  --max-event-streams event streams open
    │   │   └── UpstreamUnreachable ┐   upstream_unreachable     502  + worker_id (+ url): a control call's
    │   └── DataPlaneError          │                                 outcome, or a rollout's retries exhausted
    │       ├── UpstreamUnreachable ┘   (one class in both families; retryable for a rollout)
    │       │   rendered by ``openai_body``: ``{"error": {type, code, message, param, ...}}``
    │       ├── InvalidRequest          SMG's codes              400  the body refused as SMG refuses it:
    │       │                                                         invalid_json, invalid_type, invalid_value,
    │       │                                                         missing_required_parameter, empty_array,
    │       │                                                         prompt_empty, integer_below_min_value,
    │       │                                                         unknown_parameter, json_parse_error
    │       │                                                         (422 for a /generate body of the wrong shape)
    │       ├── InvalidRoutingMetadataHeader invalid_routing_metadata 400  a malformed PSRL routing header or field
    │       ├── ModelRequired           model_required           400  several models served, none named
    │       ├── ModelNotFound           model_not_found          404
    │       ├── QueueFull               too_many_requests        429  --max-concurrent-requests + queue full
    │       ├── QueueTimeout            queue_timeout            429  waited --queue-timeout-secs for a slot
    │       ├── NoAvailableWorkers      no_available_workers     503  no routable worker serves the model
    │       ├── NoEligibleWorkers       no_eligible_workers      503  retryable: every worker held out
    │       ├── LoopbackLimitExceeded   loopback_limit_exceeded  503  retryable: aborted by syncs too often
    │       ├── MemoryBudgetExceeded    memory_budget_exceeded   503  retryable: --dataplane-memory-budget in use
    │       ├── RequestTimeout          request_timeout          504  --request-timeout-secs passed
    │       ├── RequestBodyStalled      request_body_stalled     408  no body bytes for
    │       │                                                         --stream-body-stall-timeout-secs, or
    │       │                                                         not all within --dataplane-body-timeout-secs
    │       └── (smgrl/sessions/errors.py) session_not_found 404 · session_gone 410 · session_closing 409 ·
    │                                   too_many_sessions 429 · sessions_disabled 503 · invalid_turn 400 ·
    │                                   chat_template_error · engine_refused 400 · engine_answer_invalid ·
    │                                   turn_aborted (sessions.md)
    └── WorkerApiError              body ``{"error": message, "code": CODE}`` (the /workers surface)
            BAD_REQUEST 400 · WORKER_NOT_FOUND 404 · WORKER_ALREADY_EXISTS 409

The envelope belongs to the route family, not to the error: ``rl_body`` renders SMG's RL
envelope (the /v1/rl routes), ``openai_body`` and ``openai_headers`` the OpenAI one (the rollout
routes). ``RlError.body()`` and ``DataPlaneError.body()`` are their family's renderer; a route
that can meet an error of both families (``UpstreamUnreachable``) names the renderer itself.

``upstream_error`` is not an exception: it only labels a non-2xx engine answer inside a fan-out's
``failed[]``. The upstream HTTP client's own transport errors are ``smgrl.upstream.errors``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from smgrl.core.version import Version


class SmgrlError(Exception):
    """Root of every error smgrl raises on purpose."""


class ConfigError(SmgrlError):
    """A launch flag has a value smgrl refuses. The message is the one line printed on exit."""


class StartupError(SmgrlError):
    """The gateway cannot start. The message is the one line ``smgrl launch`` prints (it names the
    port or the path, and what to do); nothing is served."""


class ApiError(SmgrlError):
    """An error answered to a client: a stable ``code``, an HTTP ``status``, a ``message`` and
    ``context`` fields; ``rl_body`` or ``openai_body`` renders it."""

    # Class-level defaults; InvalidRequest sets its own per instance (SMG's codes vary per body).
    code: str = "internal_error"
    status: int = 500
    retryable: ClassVar[bool] = False  # said in the OpenAI envelope (and a retry-after header)

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context


def rl_body(err: ApiError) -> dict[str, Any]:
    """SMG's RL envelope: ``{"error": code, "message": ..., **context}``."""
    # Field order on the wire: error, message, then context (SMG serialises it so).
    return {"error": err.code, "message": err.message, **err.context}


def openai_body(err: ApiError) -> dict[str, Any]:
    """The OpenAI-style envelope of the rollout routes: ``{"error": {type, code, message, param,
    [retryable], **context}}``."""
    error: dict[str, Any] = {
        "type": "invalid_request_error" if err.status < 500 else "service_unavailable_error",
        "code": err.code,
        "message": err.message,
        "param": None,
    }
    if err.retryable:
        error["retryable"] = True
    error.update(err.context)
    return {"error": error}


def openai_headers(err: ApiError) -> list[tuple[bytes, bytes]]:
    """The headers that go with ``openai_body``: the code, and ``retry-after`` when retryable."""
    out = [(b"x-smg-error-code", err.code.encode())]
    if err.retryable:
        out.append((b"retry-after", b"1"))
    return out


class RlError(ApiError):
    """The /v1/rl family: SMG's RL envelope."""

    def body(self) -> dict[str, Any]:
        return rl_body(self)


# One class per code, all of one shape (also smgrl/refit/errors.py, smgrl/sessions/errors.py): the code
# and status are each class's contract; the behaviour is shared through ApiError.
class InvalidEnginePath(RlError):
    code, status = "invalid_engine_path", 400


class SelectorRequired(RlError):
    code, status = "selector_required", 400

    def __init__(self) -> None:
        super().__init__("a non-empty `selector` query parameter is required")


class InvalidSelector(RlError):
    code, status = "invalid_selector", 400


class NoWorkersMatch(RlError):
    code, status = "no_workers_match", 400

    def __init__(self, selector: str) -> None:
        super().__init__(f"no workers match selector `{selector}`", selector=selector)


class InvalidBody(RlError):
    code, status = "invalid_body", 400


class InvalidVersion(RlError):
    code, status = "invalid_version", 400


class WorkerNotFound(RlError):
    code, status = "worker_not_found", 404

    def __init__(self, worker_id: str) -> None:
        super().__init__(f"worker `{worker_id}` not found", id=worker_id)


class OperationNotFound(RlError):
    code, status = "operation_not_found", 404

    def __init__(self, op_id: str) -> None:
        super().__init__(f"operation `{op_id}` not found", id=op_id)


class InvalidQuery(RlError):
    code, status = "invalid_query", 400


class NoControlEndpoint(RlError):
    code, status = "no_control_endpoint", 422


class UpstreamTimeout(RlError):
    code, status = "upstream_timeout", 504


class JournalUnavailable(RlError):
    code, status = "journal_unavailable", 503


class PauseWaitTimeout(RlError):
    """``POST /routing_loop/pause?wait=true``: dispatch is paused, but requests were still in
    flight when the wait's ``timeout`` ran out."""

    code, status = "pause_wait_timeout", 504


class TooManyStreams(RlError):
    """--max-event-streams server-sent event streams are open (smgrl/http/routes/event_streams.py)."""

    code, status = "too_many_streams", 429


class InvalidVersionPolicyHeader(RlError):
    """A rollout's ``x-smg-version-policy`` header refused: the RL crate's envelope, as SMG's
    middleware answers it."""

    code, status = "invalid_version_policy", 400


# -- the data plane (rollout routes) ----------------------------------------------------------


class DataPlaneError(ApiError):
    """The rollout routes' family: the OpenAI-style envelope and ``x-smg-error-code``."""

    def body(self) -> dict[str, Any]:
        return openai_body(self)

    def headers(self) -> list[tuple[bytes, bytes]]:
        return openai_headers(self)


class UpstreamUnreachable(RlError, DataPlaneError):
    """The engine could not be reached: a control call's outcome (/v1/rl, RL envelope through
    ``RlError.body``) or a rollout whose retries are exhausted (``openai_body``, retryable)."""

    code, status, retryable = "upstream_unreachable", 502, True


# SMG's codes for a refused body (``smgrl.http.bodies.dataplane_body``), each answered as InvalidRequest.
INVALID_REQUEST_CODES = (
    "invalid_json",
    "invalid_type",
    "invalid_value",
    "missing_required_parameter",
    "unknown_parameter",
    "integer_below_min_value",
    "empty_array",
    "prompt_empty",
    "json_parse_error",
)


class InvalidRequest(DataPlaneError):
    """Code and ``param`` vary as SMG's do (``smgrl.http.bodies.dataplane_body``)."""

    def __init__(self, message: str, code: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message, param=param)
        self.code = code
        self.status = status


class InvalidRoutingMetadataHeader(DataPlaneError):
    code, status = "invalid_routing_metadata", 400


class ModelRequired(DataPlaneError):
    code, status = "model_required", 400


class ModelNotFound(DataPlaneError):
    code, status = "model_not_found", 404


class QueueFull(DataPlaneError):
    code, status, retryable = "too_many_requests", 429, True


class QueueTimeout(DataPlaneError):
    code, status, retryable = "queue_timeout", 429, True


class NoAvailableWorkers(DataPlaneError):
    code, status, retryable = "no_available_workers", 503, True


class NoEligibleWorkers(DataPlaneError):
    code, status, retryable = "no_eligible_workers", 503, True

    @classmethod
    def because(
        cls,
        reasons: Mapping[str, int],
        waited: float,
        floor: Version | None = None,
        versions: Sequence[str] = (),
        engines: Sequence[Mapping[str, Any]] = (),
    ) -> NoEligibleWorkers:
        """``engines``: each instance with why it was held out (``{worker_id, url, reason,
        version}``), named in the message too (the first few)."""
        named = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        message = f"no eligible worker after waiting {waited:g}s ({named})"
        if floor is not None:
            message += f"; x-version-tag {floor.raw} asks for that version or newer"
        if versions:
            message += "; the fleet has versions " + ", ".join(versions)
        if engines:
            shown = ", ".join(f"{e['url']}: {e['reason']}" for e in engines[:8])
            message += f"; held out: {shown}" + (f" (+{len(engines) - 8} more)" if len(engines) > 8 else "")
        return cls(
            message, reasons=dict(sorted(reasons.items())), versions=list(versions), engines=list(engines)
        )


class VersionFloorUnmet(NoEligibleWorkers):
    """A version floor (``x-version-tag``) above every engine's version while no sync is in
    progress (no refit, no paused engine, no version-setting call running): nothing will bring
    the fleet there, so the request is answered at once instead of waiting."""

    code, status, retryable = "version_floor_unmet", 503, True

    @classmethod
    def at(
        cls, floor: Version, versions: Sequence[str], engines: Sequence[Mapping[str, Any]]
    ) -> VersionFloorUnmet:
        message = (
            f"x-version-tag {floor.raw} asks for that version or newer, no engine has it (the fleet "
            f"has versions {', '.join(versions) or 'none'}) and no refit or weight sync is in progress"
        )
        reasons: dict[str, int] = {}
        for e in engines:
            reasons[e["reason"]] = reasons.get(e["reason"], 0) + 1
        return cls(
            message, reasons=dict(sorted(reasons.items())), versions=list(versions), engines=list(engines)
        )


class MemoryBudgetExceeded(DataPlaneError):
    code, status, retryable = "memory_budget_exceeded", 503, True


class LoopbackLimitExceeded(DataPlaneError):
    """A rollout aborted by syncs more than --max-loopbacks times (smgrl.dataplane.loopback)."""

    code, status, retryable = "loopback_limit_exceeded", 503, True


class RequestTimeout(DataPlaneError):
    code, status = "request_timeout", 504


class RequestBodyStalled(DataPlaneError):
    """SMG's 408 for a request body that stopped arriving (--stream-body-stall-timeout-secs), and
    smgrl's for one that did not arrive whole within --dataplane-body-timeout-secs: a client (even
    one with the key) must not hold the memory budget with a body that never comes."""

    code, status = "request_body_stalled", 408


# -- the /workers surface ----------------------------------------------------------------------


class WorkerApiError(SmgrlError):
    """Errors of the SMG-compatible ``/workers`` API, which uses ``{"error": text, "code": CODE}``."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": self.message, "code": self.code}


def bad_request(message: str) -> WorkerApiError:
    return WorkerApiError(400, "BAD_REQUEST", message)

"""The data plane's errors and their stable codes (OpenAI-style envelope, ``x-smg-error-code``).

::

    DataPlaneError
    ├── InvalidRequest          SMG's codes              400  the body refused as SMG refuses it:
    │                                                         invalid_json, invalid_type, invalid_value,
    │                                                         missing_required_parameter, empty_array,
    │                                                         prompt_empty, integer_below_min_value,
    │                                                         unknown_parameter, json_parse_error
    │                                                         (422 for a /generate body of the wrong shape)
    ├── InvalidRoutingMetadata  invalid_routing_metadata 400  a malformed PSRL routing header/field
    ├── ModelRequired           model_required           400  several models served, none named
    ├── ModelNotFound           model_not_found          404
    ├── QueueFull               too_many_requests        429  --max-concurrent-requests + queue full
    ├── QueueTimeout            queue_timeout            429  waited --queue-timeout-secs for a slot
    ├── UpstreamUnreachable     upstream_unreachable     502  retries exhausted (connect / 5xx)
    ├── NoAvailableWorkers      no_available_workers     503  no routable worker serves the model
    ├── NoEligibleWorkers       no_eligible_workers      503  retryable: every worker held out
    ├── LoopbackLimitExceeded   loopback_limit_exceeded  503  retryable: aborted by syncs too often
    ├── MemoryBudgetExceeded    memory_budget_exceeded   503  retryable: --dataplane-memory-budget in use
    └── RequestTimeout          request_timeout          504  --request-timeout-secs passed

``invalid_version_policy`` (400) is the RL crate's error and keeps the crate's envelope
(``{"error": code, "message": ...}``), as SMG's middleware answers it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar


class DataPlaneError(Exception):
    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.message = message
        self.extra = extra

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "type": "invalid_request_error" if self.status < 500 else "service_unavailable_error",
            "code": self.code,
            "message": self.message,
            "param": None,
        }
        if self.retryable:
            error["retryable"] = True
        error.update(self.extra)
        return {"error": error}

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = [(b"x-smg-error-code", self.code.encode())]
        if self.retryable:
            out.append((b"retry-after", b"1"))
        return out


# SMG's codes for a refused body (``smgrl.api.dataplane_body``), each answered as InvalidRequest.
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
    """Code and ``param`` vary as SMG's do (``smgrl.api.dataplane_body``)."""

    def __init__(self, message: str, code: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message, param=param)
        self.code = code
        self.status = status


class InvalidRoutingMetadata(DataPlaneError):
    code, status = "invalid_routing_metadata", 400


class ModelRequired(DataPlaneError):
    code, status = "model_required", 400


class ModelNotFound(DataPlaneError):
    code, status = "model_not_found", 404


class QueueFull(DataPlaneError):
    code, status, retryable = "too_many_requests", 429, True


class QueueTimeout(DataPlaneError):
    code, status, retryable = "queue_timeout", 429, True


class UpstreamUnreachable(DataPlaneError):
    code, status, retryable = "upstream_unreachable", 502, True


class NoAvailableWorkers(DataPlaneError):
    code, status, retryable = "no_available_workers", 503, True


class NoEligibleWorkers(DataPlaneError):
    code, status, retryable = "no_eligible_workers", 503, True

    @classmethod
    def because(
        cls, reasons: Mapping[str, int], waited: float, floor=None, versions: Sequence[str] = ()
    ) -> NoEligibleWorkers:
        named = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        message = f"no eligible worker after waiting {waited:g}s ({named})"
        if floor is not None:
            message += f"; x-version-tag {floor.raw} asks for that version or newer"
        if versions:
            message += "; the fleet has versions " + ", ".join(versions)
        return cls(message, reasons=dict(sorted(reasons.items())), versions=list(versions))


class MemoryBudgetExceeded(DataPlaneError):
    code, status, retryable = "memory_budget_exceeded", 503, True


class LoopbackLimitExceeded(DataPlaneError):
    """A rollout aborted by syncs more than --max-loopbacks times (smgrl.dataplane.loopback)."""

    code, status, retryable = "loopback_limit_exceeded", 503, True


class RequestTimeout(DataPlaneError):
    code, status = "request_timeout", 504


class InvalidVersionPolicyHeader(Exception):
    """Answered with the RL crate's envelope: ``{"error": "invalid_version_policy", ...}``."""

    code = "invalid_version_policy"
    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": self.code, "message": self.message}

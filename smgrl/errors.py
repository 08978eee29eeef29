"""Every error smgrl answers with, and its stable machine code.

Clients branch on the code, never on the message, so codes never change once shipped. The RL codes
and their HTTP statuses are SMG 1.13.0's (``rl-control-plane.md`` §2)::

    SmgrlError
    ├── ConfigError                 startup flag validation; ``smgrl launch`` exits 1 with its text
    ├── StartupError                the gateway cannot start (port in use, journal owned by another
    │                               gateway, missing directory, foreign/newer/tampered journal):
    │                               ``smgrl launch`` prints its one line and exits 1
    ├── RlError                     body ``{"error": code, "message": ..., **context}``
    │   ├── InvalidEnginePath       invalid_engine_path      400
    │   ├── SelectorRequired        selector_required        400
    │   ├── InvalidSelector         invalid_selector         400  + offset
    │   ├── NoWorkersMatch          no_workers_match         400  + selector
    │   ├── InvalidBody             invalid_body             400
    │   ├── InvalidVersion          invalid_version          400
    │   ├── WorkerNotFound          worker_not_found         404  + id
    │   ├── OperationNotFound       operation_not_found      404  + id
    │   ├── NoControlEndpoint       no_control_endpoint      422  + worker_id, url, connection_mode
    │   ├── UpstreamUnreachable     upstream_unreachable     502  + worker_id, url
    │   ├── UpstreamTimeout         upstream_timeout         504  + worker_id, url
    │   └── JournalUnavailable      journal_unavailable      503  (the journal cannot take the record)
    └── WorkerApiError              body ``{"error": message, "code": CODE}`` (the /workers surface)
            BAD_REQUEST 400 · WORKER_NOT_FOUND 404 · WORKER_ALREADY_EXISTS 409

``upstream_error`` is not an exception: it only labels a non-2xx engine answer inside a fan-out's
``failed[]``.
"""

from __future__ import annotations

from typing import Any, ClassVar


class SmgrlError(Exception):
    """Root of every error smgrl raises on purpose."""


class ConfigError(SmgrlError):
    """A launch flag has a value smgrl refuses. The message is the one line printed on exit."""


class StartupError(SmgrlError):
    """The gateway cannot start. The message is the one line ``smgrl launch`` prints (it names the
    port or the path, and what to do); nothing is served."""


class RlError(SmgrlError):
    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def body(self) -> dict[str, Any]:
        # Field order on the wire: error, message, then context (SMG serialises it so).
        return {"error": self.code, "message": self.message, **self.context}


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


class NoControlEndpoint(RlError):
    code, status = "no_control_endpoint", 422


class UpstreamUnreachable(RlError):
    code, status = "upstream_unreachable", 502


class UpstreamTimeout(RlError):
    code, status = "upstream_timeout", 504


class JournalUnavailable(RlError):
    code, status = "journal_unavailable", 503


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

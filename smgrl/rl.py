"""Python client for the ``/v1/rl`` control plane. Standard library only.

A drop-in for ``smg.rl`` from SMG 1.13.0: code written for SMG changes only its import::

    from smgrl.rl import RL, paused

    rl = RL("http://gateway:30000")
    with paused(rl, "engine=sglang"):  # pause_generation ... continue_generation, always
        rl.fanout("update_weights_from_disk", {"model_path": p, "weight_version": "42"},
                  selector="engine=sglang")

Errors::

    RlError            the gateway answered with an error (``.status``, ``.code``, ``.payload``);
     |                 a non-JSON error body has code ``http_error``, an answer of the wrong
     |                 shape ``unexpected_response``
     +-- FanoutError   a fan-out where some target failed (code ``fanout_partial``, ``.result``,
                       ``.outcome``: ``failed`` when no target succeeded, else ``partial``, as
                       the journal records the operation), raised unless ``allow_partial=True``

    GatewayUnreachable a subclass of ``urllib.error.URLError``: the gateway could not be reached
                       (connection refused or reset, unknown host); the message names the URL
                       and what to check. Code written for ``smg.rl``, which lets ``URLError``
                       through, catches it unchanged.

A read that times out surfaces as ``TimeoutError``, as with ``smg.rl``. A base URL without
``http://`` or ``https://`` is a ``ValueError`` when the client is made.

Engine answers are data, not errors: ``call`` returns a :class:`CallResult` for an engine
4xx/5xx, because the gateway mirrors the engine's status and wraps its body in an envelope.

SGLang needs a JSON body on ``pause_generation``/``continue_generation`` (a bodyless POST is
a 400), so :func:`paused` always sends ``{}`` or ``{"mode": ...}``.

Rows from smgrl may carry fields SMG 1.13.0 does not send (``version_source``, ``control``);
they land in ``Worker.extra`` instead of breaking construction.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any

# SMG's public names exactly (a drop-in copy); the smgrl-only RefitError and GatewayUnreachable are
# imported by name.
__all__ = [
    "RL",
    "CallResult",
    "FanoutError",
    "FanoutFailure",
    "FanoutResult",
    "RlError",
    "Worker",
    "paused",
]


class RlError(Exception):
    """An error answer from ``/v1/rl`` (any status >= 400): ``{"error": <code>, "message": ...}``."""

    def __init__(self, status: int, payload: dict[str, Any]):
        self.status = status
        self.payload = payload
        self.code = str(payload.get("error", "unknown"))
        super().__init__(f"{self.code} (HTTP {status}): {payload.get('message', '')}")


class GatewayUnreachable(urllib.error.URLError):
    """The gateway at ``url`` could not be reached (``reason``: the socket's error)."""

    def __init__(self, url: str, reason: Any):
        super().__init__(reason)
        self.url = url

    def __str__(self) -> str:
        why = (
            self.reason.strerror if isinstance(self.reason, OSError) and self.reason.strerror else self.reason
        )
        return (
            f"cannot reach the gateway at {self.url} ({why}): is `smgrl launch` running there, "
            "and are the host and port right?"
        )


@dataclass
class Worker:
    """One discovery row (``GET /v1/rl/workers``)."""

    id: str
    url: str
    base_url: str
    engine: str
    engine_version: str | None
    model_id: str
    worker_type: str
    connection_mode: str
    tp_size: int | None
    dp_size: int | None
    pp_size: int | None
    dp_ranks: int
    role: str | None
    health: str
    weight_version: str | None
    control_url: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    capabilities: dict[str, Any] = field(default_factory=dict)
    # Row fields this client does not model (smgrl's `version_source`, `control`, ...).
    # Keyword-only and left out of ==, so positional use and equality match smg.rl.
    extra: dict[str, Any] = field(default_factory=dict, kw_only=True, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Worker:
        known = [f.name for f in fields(cls) if f.name != "extra"]
        kwargs: dict[str, Any] = {name: d.get(name) for name in known}
        # Absent or null maps become {} (as smg.rl does) so callers can index them directly.
        kwargs["labels"] = d.get("labels") or {}
        kwargs["capabilities"] = d.get("capabilities") or {}
        extra = {k: v for k, v in d.items() if k not in kwargs}
        return cls(**kwargs, extra=extra)


@dataclass
class CallResult:
    """An engine's answer through the gateway: its status, latency and (JSON or text) body."""

    worker_id: str
    url: str
    status: int
    latency_ms: int
    body: Any
    # True when the engine sent over 1 MiB and `body` is its first 1 MiB as text.
    body_truncated: bool = field(default=False, kw_only=True, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CallResult:
        return cls(
            worker_id=str(d.get("worker_id", "")),
            url=str(d.get("url", "")),
            status=int(d.get("status", 0)),
            latency_ms=int(d.get("latency_ms", 0)),
            body=d.get("body"),
            body_truncated=bool(d.get("body_truncated", False)),
        )


@dataclass
class FanoutFailure:
    """One ``failed[]`` entry: a non-2xx engine (``upstream_error``, with ``status``) or a call
    that never got an answer (``upstream_unreachable``, ``upstream_timeout``,
    ``no_control_endpoint``; ``status`` is None)."""

    worker_id: str
    url: str
    status: int | None
    error: str
    message: str
    # Set for `no_control_endpoint` (e.g. "grpc"); not part of smg.rl's FanoutFailure.
    connection_mode: str | None = field(default=None, kw_only=True, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FanoutFailure:
        return cls(
            worker_id=str(d.get("worker_id", "")),
            url=str(d.get("url", "")),
            status=d.get("status"),
            error=str(d.get("error", "")),
            message=str(d.get("message", "")),
            connection_mode=d.get("connection_mode"),
        )


@dataclass
class FanoutResult:
    """A fan-out's outcome: every answered call by worker id, the failures, and the counts."""

    results: dict[str, CallResult]
    failed: list[FanoutFailure]
    total: int
    succeeded: int

    @property
    def outcome(self) -> str:
        """``ok``, ``partial`` (some target failed) or ``failed`` (no target succeeded): the
        operation's result in the journal (``smgrl journal ops --result``)."""
        if not self.failed:
            return "ok"
        return "partial" if self.succeeded else "failed"

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FanoutResult:
        results = {}
        for worker_id, outcome in (d.get("results") or {}).items():
            # The key names the worker; an outcome's own worker_id, if any, wins.
            results[worker_id] = CallResult.from_json({"worker_id": worker_id, **outcome})
        return cls(
            results=results,
            failed=[FanoutFailure.from_json(f) for f in d.get("failed") or []],
            total=int(d.get("total", 0)),
            succeeded=int(d.get("succeeded", 0)),
        )


class FanoutError(RlError):
    """``RL.fanout`` when a target failed and ``allow_partial`` is False; ``.result`` has it all.

    ``.payload`` is SMG's (``failed workers: <ids>``); ``str(error)`` adds one line per failed
    engine with its URL and its own reason (the engine's error message, e.g. ``No such file or
    directory: ...``), so a traceback says what went wrong (a difference of smgrl.rl:
    docs/deviations.md)."""

    def __init__(self, result: FanoutResult, status: int = 207):
        self.result = result
        self.outcome = result.outcome
        names = ", ".join(failure.worker_id for failure in result.failed)
        super().__init__(status, {"error": "fanout_partial", "message": f"failed workers: {names}"})
        lines = [str(self.args[0])]
        lines += [
            f"  {_failure_line(failure, result.results.get(failure.worker_id))}" for failure in result.failed
        ]
        if self.outcome == "failed":
            # The payload is SMG's (its code says partial whatever failed); the text says it all.
            lines.append(f"  failed on every target ({len(result.failed)} of {result.total})")
        self.args = ("\n".join(lines),)


class RL:
    """A connection to one gateway. ``timeout`` (seconds, > 0) bounds each HTTP request."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 600.0):
        scheme = urllib.parse.urlsplit(base_url).scheme.lower()
        if scheme not in ("http", "https"):
            raise ValueError(
                f"gateway URL {base_url!r} needs http:// or https:// (e.g. http://127.0.0.1:30000)"
            )
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = _checked_timeout(timeout)

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> tuple[int, Any]:
        """Send one request; return (status, decoded body) for every HTTP answer, 4xx/5xx too."""
        seconds = self.timeout if timeout is None else _checked_timeout(timeout)
        url = self.base_url + path
        if params:
            url += "?" + urllib.parse.urlencode(params)
        headers = {"accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["content-type"] = "application/json"
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=seconds) as response:
                return response.status, _decoded(response.read())
        except urllib.error.HTTPError as error:  # any status >= 400 (urllib raises for them)
            try:
                return error.code, _decoded(error.read())
            finally:
                error.close()
        except urllib.error.URLError as error:
            # No answer at all: one exception naming the gateway, without urllib's chain.
            raise GatewayUnreachable(self.base_url, error.reason) from None
        except ConnectionError as error:  # refused or reset after the connection was made
            raise GatewayUnreachable(self.base_url, error) from None

    def workers(self) -> list[Worker]:
        """Every discovery row (DP ranks collapsed). Registration is asynchronous: poll."""
        status, payload = self._request("GET", "/v1/rl/workers")
        _raise_for_status(status, payload)
        return [Worker.from_json(row) for row in payload.get("workers", [])]

    def worker(self, worker_id: str) -> Worker:
        """One worker's row; ``RlError`` with code ``worker_not_found`` for an unknown id."""
        status, payload = self._request("GET", f"/v1/rl/workers/{worker_id}")
        _raise_for_status(status, payload)
        return Worker.from_json(payload)

    def call(
        self,
        worker_id: str,
        path: str,
        body: Any = None,
        *,
        method: str = "POST",
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
    ) -> CallResult:
        """Call one engine route on one worker; engine 4xx/5xx come back as a CallResult."""
        route = f"/v1/rl/workers/{worker_id}/engine/{path.lstrip('/')}"
        status, payload = self._request(method, route, body, params, timeout)
        # An envelope (it has latency_ms and no error code) is the engine's answer, whatever
        # its status: the gateway mirrors the engine status, so the status alone cannot tell.
        if isinstance(payload, dict) and "latency_ms" in payload and "error" not in payload:
            return CallResult.from_json(payload)
        _raise_for_status(status, payload)
        raise RlError(status, {"error": "unexpected_response", "message": str(payload)})

    def fanout(
        self,
        path: str,
        body: Any = None,
        *,
        selector: str,
        method: str = "POST",
        params: dict[str, Any] | None = None,
        timeout: float | None = None,
        allow_partial: bool = False,
    ) -> FanoutResult:
        """Send the same call to every worker matching ``selector``.

        200 and 207 answers become a FanoutResult; a 207 (some target failed) raises
        FanoutError unless ``allow_partial``. Any other answer raises RlError.
        """
        query = {**(params or {}), "selector": selector}
        route = f"/v1/rl/engine/{path.lstrip('/')}"
        status, payload = self._request(method, route, body, query, timeout)
        if status in (200, 207) and isinstance(payload, dict) and "results" in payload:
            result = FanoutResult.from_json(payload)
            if result.failed and not allow_partial:
                raise FanoutError(result, status)
            return result
        _raise_for_status(status, payload)
        raise RlError(status, {"error": "unexpected_response", "message": str(payload)})

    def set_version(
        self,
        weight_version: str,
        *,
        worker_id: str | None = None,
        selector: str | None = None,
        timeout: float | None = None,
    ) -> Worker | list[Worker]:
        """Record the weights a worker (``worker_id``) or every worker matching ``selector``
        serves (SMG M2, gateway-local: no engine call). Returns the updated row, or the rows."""
        return self._write("version", {"weight_version": weight_version}, worker_id, selector, timeout)

    # The same keywords as set_version: two public methods of the drop-in client, each its own body field.
    def set_state(
        self,
        control: str,
        *,
        worker_id: str | None = None,
        selector: str | None = None,
        timeout: float | None = None,
    ) -> Worker | list[Worker]:
        """Set the routing state (``active``, ``paused`` or ``asleep``) of a worker (``worker_id``)
        or of every worker matching ``selector`` (SMG M2, gateway-local: the engines are not
        called; paused and asleep workers get no rollouts). Returns the updated row, or the rows."""
        return self._write("state", {"control": control}, worker_id, selector, timeout)

    # -- PSRL's coordinator controls of the routing loop (docs/data-plane.md) ------------------

    def _json(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        status, payload = self._request(method, path, body, None, timeout)
        _raise_for_status(status, payload)
        return payload

    def pause_dispatch(self, *, wait: bool = False, timeout: float | None = None) -> dict[str, Any]:
        """New rollout requests wait in the gateway; in-flight ones finish. Returns the status.
        ``wait``: return once they have finished (at most ``timeout`` seconds, default 30;
        past it ``RlError`` with code ``pause_wait_timeout``: dispatch is paused all the same)."""
        if not wait:
            return self._json("POST", "/routing_loop/pause")
        query = "?wait=drain" + ("" if timeout is None else f"&timeout={timeout:g}")
        budget = (30.0 if timeout is None else timeout) + 30  # the gateway's wait, then its answer
        return self._json("POST", "/routing_loop/pause" + query, timeout=budget)

    def resume_dispatch(self) -> dict[str, Any]:
        return self._json("POST", "/routing_loop/resume")

    def routing_status(self) -> dict[str, Any]:
        return self._json("GET", "/routing_loop/status")

    def worker_stats(self) -> list[dict[str, Any]]:
        """Per instance (worker, DP rank): in flight, queued, dispatched, tokens, version, state."""
        return self._json("GET", "/workers/stats")["workers"]

    def update_weight_versions(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Per-instance version writes ``[{"worker_id", "dp_rank"?, "weight_version"}]``."""
        return self._json("POST", "/workers/update_weight_version", items)

    def pause_workers(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Hold instances out of routing (PSRL's ``/workers/pause``): ``[{"worker_id", "dp_rank"?}]``,
        ``dp_rank`` an int or a list (a replica's ranks all, or none). No engine is called."""
        return self._json("POST", "/workers/pause", items)

    def resume_workers(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """Put held instances back into routing (PSRL's ``/workers/resume``)."""
        return self._json("POST", "/workers/resume", items)

    def waiting_requests(self, version_tag: str | int) -> list[dict[str, Any]]:
        """The requests waiting in the gateway whose version tag is at most ``version_tag``
        (``-1``: the unversioned ones), with why each waits (``/routing_loop/waiting``; PSRL's
        ``/routing_loop/filter`` lists those with routing metadata, fewer fields)."""
        query = urllib.parse.urlencode({"version_tag": str(version_tag)})
        return self._json("GET", f"/routing_loop/waiting?{query}")["requests"]

    # -- refit sagas (smgrl only; docs/refits.md) ------------------------------------------------

    def start_refit(
        self,
        selector: str,
        weight_version: str,
        *,
        model_path: str | None = None,
        distributed: dict[str, Any] | None = None,
        pause_mode: str | None = None,
        flush: bool = True,
        on_failure: str = "quarantine",
        force: bool = False,
        transfer_timeout_secs: float | None = None,
    ) -> dict[str, Any]:
        """Start a refit saga; returns its record (``refit_id``, the plan, ``transfer`` for a
        distributed source). Exactly one of ``model_path`` and ``distributed``."""
        if (model_path is None) == (distributed is None):
            raise ValueError("pass exactly one of model_path and distributed")
        body: dict[str, Any] = {
            "selector": selector,
            "weight_version": weight_version,
            "source": {"disk": {"model_path": model_path}}
            if model_path is not None
            else {"distributed": distributed},
            "flush": flush,
            "on_failure": on_failure,
            "force": force,
        }
        if pause_mode is not None:
            body["pause_mode"] = pause_mode
        if transfer_timeout_secs is not None:
            body["transfer_timeout_secs"] = transfer_timeout_secs
        status, payload = self._request("POST", "/v1/rl/refits", body)
        _raise_for_status(status, payload)
        return payload

    def refit_status(self, refit_id: str) -> dict[str, Any]:
        status, payload = self._request("GET", f"/v1/rl/refits/{refit_id}")
        _raise_for_status(status, payload)
        return payload

    def wait_refit(
        self,
        refit_id: str,
        *,
        progress: Callable[[dict[str, Any]], None] | None = None,
        poll_secs: float = 0.2,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Poll until the refit ends; ``progress(record)`` on every change. Returns the final
        record when every engine is on the new version, else raises :class:`RefitError`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        last = None
        while True:
            record = self.refit_status(refit_id)
            if record.get("last_seq") != last:
                last = record.get("last_seq")
                if progress is not None:
                    progress(record)
            if record.get("result") is not None:
                if record["result"] != "succeeded":
                    raise RefitError(record)
                return record
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"refit {refit_id} still {record.get('state')} after {timeout:g}s")
            time.sleep(poll_secs)

    def refit(
        self,
        selector: str,
        weight_version: str,
        *,
        model_path: str | None = None,
        progress: Callable[[dict[str, Any]], None] | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> dict[str, Any]:
        """A disk refit through the gateway's saga, waited for (every engine kind, one call).
        Raises :class:`RefitError` naming the engines that did not make it."""
        started = self.start_refit(selector, weight_version, model_path=model_path, **options)
        return self.wait_refit(started["refit_id"], progress=progress, timeout=timeout)

    def commit_refit(self, refit_id: str, *, retry_secs: float = 60.0) -> dict[str, Any]:
        """A distributed refit: the trainer's transfer is done. Retried while the saga's driver
        is being replaced (``retry_secs``, see ``_hand_off``)."""
        return self._hand_off(f"/v1/rl/refits/{refit_id}/commit", {}, retry_secs)

    def fail_refit(
        self, refit_id: str, reason: str | None = None, *, retry_secs: float = 60.0
    ) -> dict[str, Any]:
        return self._hand_off(f"/v1/rl/refits/{refit_id}/fail", {"reason": reason}, retry_secs)

    def _hand_off(self, path: str, body: Any, retry_secs: float) -> dict[str, Any]:
        """A trainer hand-off: sent again, a second apart for at most ``retry_secs``, while the
        gateway answers 503 ``refit_driver_unavailable`` (several gateway processes: the one
        driving the saga died and another is resuming it; docs/refits.md). Safe: commit and fail
        are idempotent, and a chunk that never reached an engine can be sent again."""
        deadline = time.monotonic() + retry_secs
        while True:
            status, payload = self._request("POST", path, body)
            waiting = (
                status == 503 and isinstance(payload, dict) and payload.get("error") == _DRIVER_UNAVAILABLE
            )
            if not waiting or time.monotonic() >= deadline:
                _raise_for_status(status, payload)
                return payload
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))

    def refit_transfer(
        self,
        refit_id: str,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        *,
        retry_secs: float = 60.0,
    ) -> dict:
        """The engines' half of one broadcast chunk (each engine kind's own update call)."""
        body = {"names": names, "dtypes": dtypes, "shapes": shapes}
        return self._hand_off(f"/v1/rl/refits/{refit_id}/transfer", body, retry_secs)

    def _write(
        self,
        kind: str,
        body: dict[str, Any],
        worker_id: str | None,
        selector: str | None,
        timeout: float | None,
    ) -> Worker | list[Worker]:
        if (worker_id is None) == (selector is None):
            raise ValueError("pass exactly one of worker_id and selector")
        if worker_id is not None:
            status, payload = self._request("POST", f"/v1/rl/workers/{worker_id}/{kind}", body, None, timeout)
            _raise_for_status(status, payload)
            if not isinstance(payload, dict) or "id" not in payload:
                raise RlError(status, {"error": "unexpected_response", "message": str(payload)})
            return Worker.from_json(payload)
        status, payload = self._request("POST", f"/v1/rl/{kind}", body, {"selector": selector}, timeout)
        _raise_for_status(status, payload)
        if not isinstance(payload, dict) or not isinstance(payload.get("workers"), list):
            raise RlError(status, {"error": "unexpected_response", "message": str(payload)})
        return [Worker.from_json(row) for row in payload["workers"]]


class RefitError(RlError):
    """A refit that did not end with every engine on the new version: ``refit`` is its final
    record, ``engines`` the ids of the engines that did not make it (quarantined, rolled back or
    left paused)."""

    def __init__(self, refit: dict[str, Any]):
        engines = [e for e in refit.get("engines", []) if e.get("status") != "resumed"]
        self.refit = refit
        self.engines = [e["worker_id"] for e in engines]
        names = ", ".join(
            f"{e['worker_id']} ({e.get('url')}): {e.get('status')}: {e.get('failure') or e.get('detail') or '-'}"
            for e in engines
        )
        super().__init__(
            409,
            {
                "error": f"refit_{refit.get('result')}",
                "message": f"refit {refit.get('refit_id')} ended {refit.get('result')}: {names or 'no engine'}",
            },
        )


@contextmanager
def paused(
    rl: RL,
    selector: str,
    *,
    mode: str | None = None,
    timeout: float | None = None,
) -> Iterator[FanoutResult]:
    """Pause every worker matching ``selector``, run the body, and always resume them.

    - The pause's FanoutResult is what ``with ... as`` binds.
    - A pause that fails (e.g. FanoutError because one worker did not pause) is re-raised
      without running the body, but ``continue_generation`` is still sent, so the workers
      that did pause do not stay paused.
    - If the body raises, the workers are resumed and the body's error propagates; a resume
      error is then attached as its ``__context__`` (the body's error is the one that matters).
    - If only the resume fails, its error is raised.
    """
    pause_body: dict[str, Any] = {"mode": mode} if mode else {}
    primary: BaseException | None = None
    try:
        yield rl.fanout("pause_generation", pause_body, selector=selector, timeout=timeout)
    except BaseException as error:  # BaseException: a Ctrl-C in the body must still resume
        primary = error
        raise
    finally:
        _resume(rl, selector, timeout, primary)


def _resume(rl: RL, selector: str, timeout: float | None, primary: BaseException | None) -> None:
    try:
        rl.fanout("continue_generation", {}, selector=selector, timeout=timeout)
    except Exception as resume_error:
        if primary is None:
            raise
        if primary.__context__ is None:
            primary.__context__ = resume_error


# Bounds one engine's reason in a FanoutError message (an engine may answer 1 MiB).
_REASON_CHARS = 500


def _failure_line(failure: FanoutFailure, answer: CallResult | None) -> str:
    """``<id> <url>: <error> [HTTP <status>]: <reason>``, the reason being the engine's own
    message when it answered (upstream_error), else the gateway's message for the failure."""
    head = f"{failure.worker_id} {failure.url}: {failure.error}"
    if failure.status is not None:
        head += f" HTTP {failure.status}"
    reason = _engine_reason(answer.body) if answer is not None else None
    if not reason and failure.message and failure.message != f"HTTP {failure.status}":
        reason = failure.message
    return f"{head}: {_printable(reason)}" if reason else head


def _engine_reason(body: Any) -> str | None:
    """The error text of an engine's answer: SGLang/TokenSpeed ``message``, FastAPI/vLLM
    ``detail``, OpenAI-style ``error.message``; else the answer itself (JSON or text)."""
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            value = body.get(key)
            if isinstance(value, dict) and isinstance(value.get("message"), str):
                value = value["message"]
            if isinstance(value, str) and value.strip():
                return value
        return json.dumps(body, separators=(",", ":")) if body else None
    if isinstance(body, str):
        return body.strip() or None
    return None if body is None else json.dumps(body)


# Not smgrl.core.printable.escape: this client module imports only the standard library (the
# drop-in contract: a trainer copies or imports it without smgrl's dependencies).
def _printable(text: str) -> str:
    """One line, at most _REASON_CHARS, control characters escaped (an engine wrote it)."""
    clipped = text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS] + "..."
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in clipped)


def _checked_timeout(timeout: float) -> float:
    if timeout <= 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
    return timeout


def _decoded(raw: bytes) -> Any:
    """JSON when the bytes parse, else the text (invalid UTF-8 replaced); None when empty."""
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


_DRIVER_UNAVAILABLE = "refit_driver_unavailable"  # a retryable trainer hand-off (smgrl/refit/errors.py)


def _raise_for_status(status: int, payload: Any) -> None:
    if status >= 400:
        if not isinstance(payload, dict):
            payload = {"error": "http_error", "message": str(payload)}
        raise RlError(status, payload)

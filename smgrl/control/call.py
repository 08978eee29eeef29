"""One control call to one worker: resolve its control endpoint, send, read at most 1 MiB.

This is SMG's ``call_worker``: no retries (a refit is not idempotent), no circuit breaker, no load
counter; the per-call deadline (``--rl-control-timeout-secs``) starts when the call starts.
Redirects are not followed (D4): a 3xx comes back as the engine's status.
"""

from __future__ import annotations

import attrs
import trio

from smgrl.control.outcome import BODY_CAP, Outcome, decode_engine_body
from smgrl.core import Worker, origin_of
from smgrl.core import control_url as control_url_of
from smgrl.core.errors import NoControlEndpoint, UpstreamTimeout, UpstreamUnreachable
from smgrl.upstream import ConnectError, PoolSet, UpstreamError

# SMG's text for ANY failure while reading the engine's body (cut short, bad chunking, or the
# deadline hit mid-body): reqwest reports them all as a decode error (observed on 1.13.0).
BODY_READ_FAILURE = "reading response body: error decoding response body"
NO_LABEL_DETAIL = (
    "no `rl.control_url` label: set it at registration or through the worker update route "
    "(a TokenSpeed gRPC engine advertises it when launched with a routable --rl-control-host)"
)


@attrs.frozen
class ControlRequest:
    """What every target of one call or fan-out is sent (identical for each target)."""

    method: str  # GET | POST | HEAD
    path: str  # validated, no leading slash
    query: str | None  # passthrough query (selector removed), sent verbatim
    body: bytes
    content_type: str | None  # caller's, or application/json for a non-empty body
    forward_headers: tuple[tuple[bytes, bytes], ...] = ()  # x-request-id, traceparent, tracestate

    @property
    def target(self) -> str:
        return f"/{self.path}?{self.query}" if self.query else f"/{self.path}"

    def headers_for(self, api_key: str | None) -> list[tuple[bytes, bytes]]:
        headers = [(b"accept", b"*/*")]
        if self.content_type is not None:
            headers.append((b"content-type", self.content_type.encode("latin-1")))
        headers.extend(self.forward_headers)
        if api_key:
            headers.append((b"authorization", b"Bearer " + api_key.encode("latin-1")))
        return headers


def no_endpoint(worker: Worker, detail: str = NO_LABEL_DETAIL) -> NoControlEndpoint:
    return NoControlEndpoint(
        f"worker `{worker.id}` has no control endpoint ({worker.connection_mode}): {detail}",
        worker_id=worker.id,
        url=worker.url,
        connection_mode=worker.connection_mode,
    )


async def call_worker(
    worker: Worker,
    api_key: str | None,
    request: ControlRequest,
    pools: PoolSet,
    timeout: float,
) -> Outcome:
    endpoint = control_url_of(worker)
    if endpoint is None:
        return Outcome(worker.id, worker.url, None, error=no_endpoint(worker))
    endpoint = endpoint.rstrip("/")
    full_url = endpoint + request.target
    started = trio.current_time()
    got_head = False
    data, truncated, status, ctype = b"", False, None, None
    failure: str | None = None
    stage = "connect"  # how far a failed exchange got (Outcome.stage)
    # The deadline covers the whole exchange, as SMG's per-request timeout does: hitting it before
    # the response head is `upstream_timeout`; hitting it while reading the body is a body-read
    # error (`upstream_unreachable`, "reading response body: ...").
    with trio.move_on_after(timeout) as scope:
        try:
            pool = pools.get(origin_of(endpoint))
            async with pool.stream(
                request.method,
                path_prefix(endpoint) + request.target,
                headers=request.headers_for(api_key),
                body=request.body if request.body else None,
            ) as response:
                got_head = True
                status = response.status
                raw_ctype = response.header(b"content-type")
                ctype = raw_ctype.decode("latin-1") if raw_ctype is not None else None
                data, truncated = await response.read_bounded(BODY_CAP)
        except ConnectError:
            failure = f"error sending request for url ({full_url})"
        except UpstreamError:
            failure = BODY_READ_FAILURE if got_head else f"error sending request for url ({full_url})"
            stage = "body" if got_head else "send"
        except (OSError, ValueError) as exc:  # e.g. an unparsable control URL
            failure = f"error sending request for url ({full_url}): {exc}"
            stage = "body" if got_head else "connect"
    latency_ms = int((trio.current_time() - started) * 1000)
    if scope.cancelled_caught:
        return timed_out(worker, endpoint, latency_ms, timeout, got_head)
    if failure is not None:
        return unreachable(worker, endpoint, latency_ms, failure, stage)
    return answered(worker, endpoint, latency_ms, status, data, ctype, truncated)


# The three endings of a call, shared with the batched fan-out (smgrl/control/batched.py).


def timed_out(worker: Worker, endpoint: str, latency_ms: int, timeout: float, got_head: bool) -> Outcome:
    if got_head:
        return unreachable(worker, endpoint, latency_ms, BODY_READ_FAILURE, "body")
    return Outcome(
        worker.id,
        worker.url,
        endpoint,
        latency_ms=latency_ms,
        stage="head",
        error=UpstreamTimeout(
            f"upstream `{worker.url}` timed out after {_secs(timeout)}s", worker_id=worker.id, url=worker.url
        ),
    )


def unreachable(worker: Worker, endpoint: str, latency_ms: int, failure: str, stage: str) -> Outcome:
    return Outcome(
        worker.id,
        worker.url,
        endpoint,
        latency_ms=latency_ms,
        stage=stage,
        error=UpstreamUnreachable(
            f"upstream `{worker.url}` unreachable: {failure}", worker_id=worker.id, url=worker.url
        ),
    )


def answered(
    worker: Worker,
    endpoint: str,
    latency_ms: int,
    status: int | None,
    data: bytes,
    ctype: str | None,
    truncated: bool,
) -> Outcome:
    return Outcome(
        worker.id,
        worker.url,
        endpoint,
        latency_ms=latency_ms,
        status=status,
        body=decode_engine_body(data, ctype, truncated),
        body_truncated=truncated,
    )


def _secs(timeout: float) -> str:
    return str(int(timeout)) if float(timeout).is_integer() else str(timeout)


def path_prefix(url: str) -> str:
    """A control URL may carry a path (``http://ctl:8001/engine``): calls go below it."""
    rest = url.partition("://")[2]
    _, slash, path = rest.partition("/")
    return "/" + path.rstrip("/") if slash and path.strip("/") else ""

"""A fan-out's engine calls made from one task (``smgrl.upstream.batch``), with the per-call rules.

A task of its own per engine call (its cancel scope, exchange, response and readiness wait) was
most of a 64-engine fan-out's CPU (docs/benchmarks.md, the independent harness). Here the
request task itself writes each target's request on a kept-alive connection, then collects the
answers round by round from one wait. What stays the same as ``call_worker`` (smgrl/control/
call.py) for every target:

- the outcome: the same builders (``answered``, ``unreachable``, ``timed_out``), so an answer,
  a broken connection, a malformed response and a passed deadline read the same;
- the deadline: ``--rl-control-timeout-secs`` from the moment the call starts;
- the concurrency bound: at most ``concurrency`` calls in flight, the batched ones and the others
  together;
- no retries, except the pool's own: a kept-alive connection the engine had closed before reading
  the request ("stale") is sent again, here through ``call_worker`` (with a deadline of its own).

A target the batch cannot take (no idle connection yet, TLS, no control endpoint, a URL or header
the request serialiser refuses) goes through ``call_worker`` in a runner task as before, and that
runner then takes further targets from the same queue, so slots are never lost.

Cancellation: the batch's wait is a checkpoint of the request task. When the client leaves, the
request's cancel scope cancels it (and the runners, in the nursery), the ``finally`` closes every
connection still in flight, and ``ControlService`` records the outcomes that arrived.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import trio

from smgrl.control.call import (
    BODY_READ_FAILURE,
    ControlRequest,
    answered,
    path_prefix,
    timed_out,
    unreachable,
)
from smgrl.control.outcome import BODY_CAP, Outcome
from smgrl.core import Worker, origin_of
from smgrl.core import control_url as control_url_of
from smgrl.upstream import Batch, Done, PoolSet, request_wants_close, serialize_request


async def run_batched(
    targets: Sequence[Worker],
    request: ControlRequest,
    api_key_of: Callable[[Worker], str | None],
    pools: PoolSet,
    timeout: float,
    concurrency: int,
    call: Callable[[Worker], Awaitable[Outcome]],
    on_outcome: Callable[[Worker, Outcome], None],
    routes: dict | None = None,
    batches: list[Batch] | None = None,
) -> None:
    """``call(worker)`` is the per-task way (``call_worker``); ``on_outcome`` runs as each call
    completes, whichever way it went. ``routes``: the caller's cache of each worker's control
    endpoint, path prefix and pool, by worker id (an entry counts only for the same ``Worker``
    object and a pool still open): resolving them was 8% of a 64-engine fan-out. ``batches``: the
    caller's idle ``Batch``es, one taken for this fan-out and handed back after it (at most
    ``KEPT_BATCHES``), so that its private epoll outlives the fan-out."""
    queue = iter(targets)
    slots = max(1, concurrency)
    runners = [0]  # runner tasks alive (each holds one slot)
    batch = batches.pop() if batches else Batch(BODY_CAP)
    calls: dict[int, tuple[Worker, str, float]] = {}  # token -> (worker, endpoint, started)
    body = request.body if request.body else None
    tokens = iter(range(len(targets)))
    # The request's bytes differ between targets only by their host header (and a path prefix
    # or API key, rarely): serialised once per prefix and key, the host spliced in per target.
    templates: dict[tuple[str, str | None], tuple[bytes, bytes, bool]] = {}

    async def runner(first: Worker) -> None:
        try:
            on_outcome(first, await call(first))
            # Iterators are safe to share between trio tasks: ``next`` never yields.
            for worker in queue:
                on_outcome(worker, await call(worker))
        finally:
            runners[0] -= 1

    def to_runner(worker: Worker) -> None:
        runners[0] += 1
        nursery.start_soon(runner, worker)

    def start(worker: Worker) -> None:
        route = routes.get(worker.id) if routes is not None else None
        if route is None or route[0] is not worker or route[3].closed:
            endpoint = control_url_of(worker)
            if endpoint is None:
                to_runner(worker)  # its outcome (no control endpoint) is call_worker's, without I/O
                return
            endpoint = endpoint.rstrip("/")
            try:
                route = (worker, endpoint, path_prefix(endpoint), pools.get(origin_of(endpoint)))
            except (OSError, ValueError):
                to_runner(worker)  # call_worker words the failure
                return
            if routes is not None:
                routes[worker.id] = route
        _, endpoint, prefix, pool = route
        key = api_key_of(worker)
        template = templates.get((prefix, key))
        if template is None:
            try:
                template = templates[(prefix, key)] = _template(request, prefix, key, body)
            except ValueError:
                to_runner(worker)  # call_worker words the failure
                return
        head, tail, keep_alive = template
        raw = head + pool.host_header + tail
        started = trio.current_time()
        token = next(tokens)
        result = batch.start(token, pool, request.method, raw, started + timeout, keep_alive=keep_alive)
        if result is True:
            calls[token] = (worker, endpoint, started)
        else:
            to_runner(worker)  # nothing idle to reuse, or stale at once: the pool's way

    # One nursery per fan-out, owned by the request: cancelling the request (client gone,
    # shutdown past its grace period) cancels the batch's wait and every runner in flight.
    async with trio.open_nursery() as nursery:
        try:
            ended = False
            while not ended:
                # The waits' deadline (each set to the soonest exchange's by ``batch.wait``): one
                # scope for all of them; when it passes, a new scope, whose first wait reports
                # the exchanges whose deadline passed.
                with trio.CancelScope() as waits:
                    while True:
                        while len(batch) + runners[0] < slots:
                            worker = next(queue, None)
                            if worker is None:
                                break
                            start(worker)
                        if not len(batch):
                            ended = True  # every target started; runners finish theirs
                            break
                        for done in await batch.wait(waits):
                            worker, endpoint, started = calls.pop(done.token)
                            if done.error == "stale":
                                to_runner(worker)
                                continue
                            latency_ms = int((trio.current_time() - started) * 1000)
                            on_outcome(worker, _outcome(worker, endpoint, request, latency_ms, timeout, done))
        finally:
            # Synchronous: connections still in flight are closed, never pooled. The batch goes
            # back empty, so a cancelled fan-out leaves nothing in it for the next one.
            if batches is not None and len(batches) < KEPT_BATCHES:
                batch.release()
                batches.append(batch)
            else:
                batch.close()


# Idle batches kept for later fan-outs: one per fan-out running at once, up to this many.
KEPT_BATCHES = 4

_HOST = b"\x00host\x00"  # a placeholder no real host header can contain


def _template(
    request: ControlRequest, prefix: str, key: str | None, body: bytes | None
) -> tuple[bytes, bytes, bool]:
    """(bytes before the host, bytes after it, keep-alive) of this request to any engine."""
    headers = request.headers_for(key)
    raw = serialize_request(request.method, prefix + request.target, _HOST, headers, body)
    head, _, tail = raw.partition(_HOST)
    return head, tail, not request_wants_close(headers)


def _outcome(
    worker: Worker, endpoint: str, request: ControlRequest, latency_ms: int, timeout: float, done: Done
) -> Outcome:
    if done.error is None:
        ctype = done.content_type.decode("latin-1") if done.content_type is not None else None
        return answered(worker, endpoint, latency_ms, done.status, done.data, ctype, done.truncated)
    if done.error == "timeout":
        return timed_out(worker, endpoint, latency_ms, timeout, done.got_head)
    if done.got_head:
        return unreachable(worker, endpoint, latency_ms, BODY_READ_FAILURE, "body")
    return unreachable(
        worker, endpoint, latency_ms, f"error sending request for url ({endpoint + request.target})", "send"
    )

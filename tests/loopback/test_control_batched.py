"""The batched fan-out (smgrl/control/batched.py) against scripted trio engines on 127.0.0.1.

Each engine is a coroutine ``script(peer, index, nth)`` per accepted connection: ``index``
counts the engine's connections, ``nth`` the requests read on this one. The first request of
every test opens the connections (no idle one exists yet, so it goes through ``call_worker``);
the second travels on the kept-alive connections through the batch, and its outcomes are
compared with ``call_worker``'s for the same scripts (latency aside). No test asserts on
wall-clock time: the short control timeout is what a stalled engine is given.
"""

from __future__ import annotations

import socket
from functools import partial

import attrs
import pytest
import trio

from smgrl.control.batched import run_batched
from smgrl.control.call import ControlRequest, call_worker
from smgrl.control.outcome import BODY_CAP
from smgrl.core import Worker
from smgrl.upstream import PoolSet
from smgrl.upstream.batch import Batch

TIMEOUT = 0.5  # the control timeout a stalled engine meets
SAFETY = 10


class Peer:
    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def read_request(self) -> bytes | None:
        while b"\r\n\r\n" not in self.buffer:
            data = await self.stream.receive_some(65536)
            if not data:
                return None
            self.buffer += data
        end = self.buffer.index(b"\r\n\r\n") + 4
        length = 0
        for line in self.buffer[:end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        while len(self.buffer) < end + length:
            self.buffer += await self.stream.receive_some(65536)
        request, self.buffer = self.buffer[: end + length], self.buffer[end + length :]
        return request


def ok(body: bytes = b"ok", ctype: bytes = b"text/plain") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (ctype, len(body), body)


async def serve(nursery: trio.Nursery, second) -> str:
    """An engine answering its first request with 200 "ok"; ``second(peer)`` handles the next
    request on that connection. Later connections (a retry) are answered "fresh" throughout."""
    connections = [0]

    async def handle(stream: trio.SocketStream) -> None:
        index = connections[0]
        connections[0] += 1
        peer = Peer(stream)
        try:
            if index > 0:
                while await peer.read_request() is not None:
                    await stream.send_all(ok(b"fresh"))
                return
            await peer.read_request()
            await stream.send_all(ok())
            await second(peer)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


async def answer(data: bytes, peer: Peer) -> None:
    await peer.read_request()
    await peer.stream.send_all(data)
    await trio.sleep_forever()


async def close_idle(peer: Peer) -> None:
    peer.stream.socket.close()  # the engine's idle timeout, just before our request lands


async def reset_after_request(peer: Peer) -> None:
    await peer.read_request()
    peer.stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    peer.stream.socket.close()


async def stall(peer: Peer) -> None:
    await peer.read_request()
    await trio.sleep_forever()


async def head_then_stall(peer: Peer) -> None:
    await peer.read_request()
    await peer.stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
    await trio.sleep_forever()


async def body_cut_short(peer: Peer) -> None:
    await peer.read_request()
    await peer.stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc")
    await peer.stream.aclose()


SCRIPTS = {
    "json": partial(answer, ok(b'{"a": [1, 2]}', b"application/json")),
    "status 500": partial(answer, b"HTTP/1.1 500 Oops\r\ncontent-length: 4\r\n\r\nfail"),
    "chunked": partial(
        answer, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
    ),
    "interim 100": partial(answer, b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after")),
    "in pieces": None,  # below
    "malformed": partial(answer, b"HTTP/1.1 two hundred\r\n\r\n"),
    "over the cap": partial(answer, ok(b"x" * (BODY_CAP + 10))),
    "closed while idle": close_idle,
    "reset after the request": reset_after_request,
    "stalled": stall,
    "head then stalled": head_then_stall,
    "body cut short": body_cut_short,
}


async def in_pieces(peer: Peer) -> None:
    await peer.read_request()
    for piece in (b"HTTP/1.1 200 OK\r\ncon", b"tent-length: 5\r\n\r\nhe", b"llo"):
        await peer.stream.send_all(piece)
        await trio.sleep(0.01)
    await trio.sleep_forever()


SCRIPTS["in pieces"] = in_pieces
REQUEST = ControlRequest("POST", "flush_cache", None, b"{}", "application/json")


def workers(origins: list[str]) -> list[Worker]:
    return [Worker(id=f"w{i}", url=o, base_url=o, status="ready") for i, o in enumerate(origins)]


def comparable(outcome) -> dict:
    """The outcome's fields, its latency and its engine's (random) port left out."""
    fields = attrs.asdict(outcome, recurse=False)
    fields["latency_ms"] = None
    error = fields.pop("error")
    fields["error"] = None if error is None else (error.code, error.message)
    return {k: v.replace(outcome.url, "ENGINE") if isinstance(v, str) else v for k, v in fields.items()} | {
        "error": None if error is None else (error.code, error.message.replace(outcome.url, "ENGINE"))
    }


async def per_task(nursery, names: list[str]) -> dict[str, dict]:
    ws = workers([await serve(nursery, SCRIPTS[n]) for n in names])
    pools = PoolSet()
    for w in ws:
        assert (await call_worker(w, None, REQUEST, pools, TIMEOUT)).status == 200
    out = {}
    for name, w in zip(names, ws, strict=True):
        out[name] = comparable(await call_worker(w, None, REQUEST, pools, TIMEOUT))
    await pools.aclose()
    return out


async def batched(nursery, names: list[str], concurrency: int = 32) -> tuple[dict[str, dict], int]:
    ws = workers([await serve(nursery, SCRIPTS[n]) for n in names])
    pools = PoolSet()
    got = {}

    async def run():
        got.clear()
        await run_batched(
            ws,
            REQUEST,
            lambda w: None,
            pools,
            TIMEOUT,
            concurrency,
            lambda w: call_worker(w, None, REQUEST, pools, TIMEOUT),
            lambda w, o: got.__setitem__(w.id, o),
        )

    await run()
    assert all(o.status == 200 for o in got.values())
    spawned = Spawns()
    trio.lowlevel.add_instrument(spawned)
    try:
        await run()
    finally:
        trio.lowlevel.remove_instrument(spawned)
    await pools.aclose()
    return {name: comparable(got[w.id]) for name, w in zip(names, ws, strict=True)}, spawned.count


class Spawns(trio.abc.Instrument):
    def __init__(self) -> None:
        self.count = 0

    def task_spawned(self, task) -> None:
        self.count += 1


async def test_a_fanout_on_kept_alive_connections_runs_in_the_request_task(nursery):
    with trio.fail_after(SAFETY):
        outcomes, spawned = await batched(nursery, ["json"] * 8)
    assert spawned == 0  # a task per engine call (the earlier fan-out runner) spawned 8
    assert all(o["status"] == 200 and o["body"] == {"a": [1, 2]} for o in outcomes.values())


@pytest.mark.parametrize("concurrency", [32, 2])
async def test_every_ending_reads_as_call_worker_reads_it(nursery, concurrency):
    names = list(SCRIPTS)
    with trio.fail_after(SAFETY):
        want = await per_task(nursery, names)
        got, _ = await batched(nursery, names, concurrency)
    for name in names:
        assert got[name] == want[name], name
    assert got["closed while idle"]["body"] == "fresh"  # sent again on a new connection
    assert got["stalled"]["error"][0] == "upstream_timeout"
    assert got["over the cap"]["body_truncated"] is True


async def test_concurrency_bounds_the_calls_in_flight(nursery):
    in_flight = [0, 0]  # now, most

    async def counted(peer: Peer) -> None:
        await peer.read_request()
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        await trio.sleep(0.02)
        in_flight[0] -= 1
        await peer.stream.send_all(ok())
        await trio.sleep_forever()

    SCRIPTS["counted"] = counted
    try:
        with trio.fail_after(SAFETY):
            got, _ = await batched(nursery, ["counted"] * 6, concurrency=2)
    finally:
        del SCRIPTS["counted"]
    assert in_flight[1] == 2
    assert all(o["status"] == 200 for o in got.values())


async def test_a_cancelled_batch_closes_its_connections(nursery):
    ws = workers([await serve(nursery, stall) for _ in range(3)])
    pools = PoolSet()
    for w in ws:
        await call_worker(w, None, REQUEST, pools, TIMEOUT)
    got = []
    with trio.fail_after(SAFETY), trio.move_on_after(0.1):
        await run_batched(
            ws, REQUEST, lambda w: None, pools, 30.0, 32,
            lambda w: call_worker(w, None, REQUEST, pools, 30.0),
            lambda w, o: got.append(o),
        )  # fmt: skip
    assert got == []
    for w in ws:
        pool = pools.get(w.base_url)
        assert pool.active_connections == 0 and pool.idle_connections == 0
    await pools.aclose()


async def test_a_cached_route_is_not_used_once_its_pool_is_discarded(nursery):
    ws = workers([await serve(nursery, partial(answer, ok(b"second"))) for _ in range(2)])
    pools = PoolSet()
    routes: dict = {}
    got = {}

    async def run():
        await run_batched(
            ws, REQUEST, lambda w: None, pools, TIMEOUT, 32,
            lambda w: call_worker(w, None, REQUEST, pools, TIMEOUT),
            lambda w, o: got.__setitem__(w.id, o), routes,
        )  # fmt: skip

    with trio.fail_after(SAFETY):
        await run()
        assert set(routes) == {"w0", "w1"}
        old = routes["w0"][3]
        await pools.discard(ws[0].base_url)
        await run()
    assert routes["w0"][3] is not old and not routes["w0"][3].closed
    assert got["w0"].status == 200 and got["w1"].body == "second"
    await pools.aclose()


async def test_a_kept_batch_serves_the_next_fanout_and_comes_back_empty_from_a_cancel(nursery):
    """``batches``: the caller's idle batches. A fan-out takes one and hands it back, so its
    epoll serves later fan-outs; a cancelled fan-out hands it back with nothing in flight (its
    connections closed), and the next fan-out through it still reads every answer."""
    read = trio.Semaphore(0)

    async def stall_counted(peer: Peer) -> None:
        await peer.read_request()
        read.release()  # the fan-out's request reached this engine
        await trio.sleep_forever()

    stalled = workers([await serve(nursery, stall_counted) for _ in range(3)])
    answering = workers([await serve(nursery, partial(answer, ok(b"second"))) for _ in range(3)])
    pools = PoolSet()
    batches: list = []
    got = {}

    async def run(ws, timeout):
        await run_batched(
            ws, REQUEST, lambda w: None, pools, timeout, 32,
            lambda w: call_worker(w, None, REQUEST, pools, timeout),
            lambda w, o: got.__setitem__(w.id + w.url, o), None, batches,
        )  # fmt: skip

    for w in stalled + answering:
        assert (await call_worker(w, None, REQUEST, pools, TIMEOUT)).status == 200
    with trio.fail_after(SAFETY):
        # The fan-out is cancelled once every stalled engine has its request (all in flight).
        async with trio.open_nursery() as cancelling:
            cancelling.start_soon(run, stalled, 30.0)
            for _ in stalled:
                await read.acquire()
            cancelling.cancel_scope.cancel()
        assert [len(b) for b in batches] == [0]
        kept = batches[0]
        for w in stalled:
            pool = pools.get(w.base_url)
            assert pool.active_connections == 0 and pool.idle_connections == 0
        got.clear()
        await run(answering, TIMEOUT)
    assert batches == [kept]
    assert [o.body for o in got.values()] == ["second"] * 3
    await pools.aclose()


async def answer_and_close(closed: trio.Event, peer: Peer) -> None:
    """Answer one request, then close the connection (an engine ending an idle keep-alive)."""
    await peer.read_request()
    await peer.stream.send_all(ok(b"second"))
    await peer.stream.aclose()
    closed.set()


async def test_a_kept_registration_of_a_connection_the_engine_closed_is_dropped(nursery):
    """A connection handed back to its pool stays registered in the kept batch's epoll. When
    the engine closes it while idle, the next fan-out through that batch sends its call again
    on a fresh connection, as any stale connection's does, and the kept epoll holds no more
    registrations than connections (the dropping of one that wakes a fan-out not using it is
    the next test's)."""
    closed = trio.Event()
    answer_then_close = partial(answer_and_close, closed)

    async def answer_every_request(peer: Peer) -> None:
        while await peer.read_request() is not None:
            await peer.stream.send_all(ok(b"x"))

    ws = workers([await serve(nursery, answer_then_close), await serve(nursery, answer_every_request)])
    pools = PoolSet()
    batches: list = []
    got = {}

    async def run():
        got.clear()
        await run_batched(
            ws, REQUEST, lambda w: None, pools, TIMEOUT, 32,
            lambda w: call_worker(w, None, REQUEST, pools, TIMEOUT),
            lambda w, o: got.__setitem__(w.id, o), None, batches,
        )  # fmt: skip

    with trio.fail_after(SAFETY):
        for w in ws:
            assert (await call_worker(w, None, REQUEST, pools, TIMEOUT)).status == 200
        await run()
        assert got["w0"].body == "second"
        await closed.wait()
        assert pools.get(ws[0].base_url).idle_connections  # pooled before run() returned
        kept = batches[0]
        assert len(kept._registered) == 2  # both pooled connections stay registered
        await run()
    assert got["w0"].body == "fresh" and got["w1"].status == 200
    assert batches == [kept] and len(kept._registered) <= 2
    await pools.aclose()


async def test_a_kept_registration_waking_a_fanout_that_does_not_use_it_is_dropped(nursery):
    """The kept-registration case the batch's ``wait`` handles: a pooled connection this fan-out
    does not use (w0's, idle) becomes readable (its engine closed it) while another exchange
    (w1's) is in flight. One ``wait`` must drop it from the kept epoll: left there, its
    level-triggered readiness makes every later ``wait`` return at once with nothing done, so
    the fan-out spins a pass of the loop per ``wait`` until its deadline."""
    closed = trio.Event()
    answer_then_close = partial(answer_and_close, closed)

    async def answer_then_stall(peer: Peer) -> None:
        await peer.read_request()
        await peer.stream.send_all(ok(b"second"))
        await stall(peer)

    ws = workers([await serve(nursery, answer_then_close), await serve(nursery, answer_then_stall)])
    pools = PoolSet()
    batches: list = []
    got = {}
    with trio.fail_after(SAFETY):
        for w in ws:
            assert (await call_worker(w, None, REQUEST, pools, TIMEOUT)).status == 200
        await run_batched(
            ws, REQUEST, lambda w: None, pools, TIMEOUT, 32,
            lambda w: call_worker(w, None, REQUEST, pools, TIMEOUT),
            lambda w, o: got.__setitem__(w.id, o), None, batches,
        )  # fmt: skip
        assert [o.body for o in got.values()] == ["second", "second"]
        (kept,) = batches
        idle_w0 = pools.get(ws[0].base_url)._idle[0]
        assert kept._registered.get(idle_w0.fd) is idle_w0
        await closed.wait()
        await trio.lowlevel.wait_readable(idle_w0.fd)  # the engine's FIN has arrived
        pool_w1 = pools.get(ws[1].base_url)
        request = b"POST /flush_cache HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
        assert kept.start("t", pool_w1, "POST", request, trio.current_time() + TIMEOUT) is True
        assert await kept.wait() == []  # w1 stalls; only w0's kept registration was ready
        assert idle_w0.fd not in kept._registered
    kept.close()
    await pools.aclose()


async def test_a_wait_that_finishes_nothing_is_a_checkpoint(nursery):
    """Readiness that finishes no exchange (here: part of an answer) makes ``wait`` return
    nothing; the caller waits again at once, so ``wait`` must have yielded to the loop, or a
    readiness it cannot use (a kept registration the kernel keeps) spins without a checkpoint."""
    (w,) = workers([await serve(nursery, head_then_stall)])
    pools = PoolSet()
    assert (await call_worker(w, None, REQUEST, pools, TIMEOUT)).status == 200
    batch = Batch(BODY_CAP)
    pool = pools.get(w.base_url)
    conn = pool._idle[0]
    request = b"POST /flush_cache HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
    with trio.fail_after(SAFETY):
        assert batch.start("t", pool, "POST", request, trio.current_time() + TIMEOUT) is True
        await trio.lowlevel.wait_readable(conn.fd)  # the head is in, the body never comes
        with trio.CancelScope() as scope:
            scope.cancel()
            await batch.wait()
    assert scope.cancelled_caught  # the wait checkpointed: nothing was finished
    batch.close()
    await pools.aclose()


async def test_deadlines_passing_one_after_another_each_end_their_call(nursery):
    """Stalled engines met one after another (concurrency 1): each call's deadline passes in its
    own turn, the fan-out's one scope of waits ends each time, and every call still ends with its
    own timeout outcome; the answering engine's outcome is kept."""
    names = ["stalled", "json", "stalled"]
    ws = workers([await serve(nursery, SCRIPTS[n]) for n in names])
    pools = PoolSet()
    got: dict = {}

    async def run():
        got.clear()
        await run_batched(
            ws, REQUEST, lambda w: None, pools, TIMEOUT, 1,
            lambda w: call_worker(w, None, REQUEST, pools, TIMEOUT),
            lambda w, o: got.__setitem__(w.id, o),
        )  # fmt: skip

    with trio.fail_after(SAFETY):
        await run()  # the first requests: every engine answers "ok"
        await run()
    await pools.aclose()
    assert [got[w.id].error.code if got[w.id].error else got[w.id].status for w in ws] == [
        "upstream_timeout",
        200,
        "upstream_timeout",
    ]


async def test_a_kept_connection_the_engine_closed_is_not_taken_for_the_next_call(nursery):
    """The batch vouches for its kept connections from one poll of its epoll instead of the
    pool's check of each: one the engine closed while idle is readable there, so the pool still
    checks it and discards it, and the batch's next call is not written on it (``start`` finds
    nothing idle), where a connection taken unchecked would take the request and only fail
    later, read as stale. The silent one beside it is taken."""
    closed = trio.Event()

    async def answer_every_request(peer: Peer) -> None:
        while await peer.read_request() is not None:
            await peer.stream.send_all(ok(b"x"))

    ws = workers(
        [await serve(nursery, partial(answer_and_close, closed)), await serve(nursery, answer_every_request)]
    )
    pools = PoolSet()
    batches: list = []
    got = {}
    with trio.fail_after(SAFETY):
        for w in ws:
            assert (await call_worker(w, None, REQUEST, pools, TIMEOUT)).status == 200
        await run_batched(
            ws, REQUEST, lambda w: None, pools, TIMEOUT, 32,
            lambda w: call_worker(w, None, REQUEST, pools, TIMEOUT),
            lambda w, o: got.__setitem__(w.id, o), None, batches,
        )  # fmt: skip
        assert got["w0"].body == "second"
        await closed.wait()
        kept = batches[0]
        raw = b"POST /flush_cache HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"
        deadline = trio.current_time() + TIMEOUT
        closed_pool, silent_pool = pools.get(ws[0].base_url), pools.get(ws[1].base_url)
        assert closed_pool.idle_connections and silent_pool.idle_connections
        assert kept.start(0, closed_pool, "POST", raw, deadline) is False
        assert closed_pool.idle_connections == 0  # checked and discarded
        assert kept.start(1, silent_pool, "POST", raw, deadline) is True
        while not (done := await kept.wait()):
            pass
        assert done[0].status == 200
        kept.close()
    await pools.aclose()

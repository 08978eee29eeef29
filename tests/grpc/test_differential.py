"""smgrl's gRPC client against grpcio's, on the same grpcio server: same messages, statuses,
details and trailing metadata (grpcio is the reference, as h11 is for the HTTP/1.1 client)."""

from __future__ import annotations

import pytest
import trio
from grpc_reference import SERVICE, Msg, grpcio_call, serve

from smgrl.upstream.grpc import Channel, DeadlineExceeded, GrpcError, StatusCode, Unavailable


@pytest.fixture(scope="module")
def server():
    srv, port, ref = serve(options=(("grpc.max_concurrent_streams", 100),))
    yield port, ref
    srv.stop(None)


async def smgrl_call(port, method, req, timeout=None, stream=False, **channel_kw):
    ch = Channel("127.0.0.1", port, **channel_kw)
    path = f"/{SERVICE}/{method}"
    got: list[bytes] = []
    try:
        if stream:
            async with ch.server_stream(path, req, Msg, timeout=timeout) as s:
                async for msg in s:
                    got.append(msg.SerializeToString())
        else:
            got.append((await ch.unary(path, req, Msg, timeout=timeout)).SerializeToString())
    except GrpcError as exc:
        return ("error", exc.code.name, exc.message, exc.trailers, got)
    finally:
        await ch.aclose()
    return ("ok", got)


async def both(port, method, req, timeout=None, stream=False):
    ours = await smgrl_call(port, method, req, timeout, stream)
    theirs = await trio.to_thread.run_sync(grpcio_call, port, method, req, timeout, stream)
    return ours, theirs


CASES = [
    ("Echo", Msg(data=b"hello", sha256="x"), False),
    ("Echo", Msg(), False),
    ("Echo", Msg(sha256="code:NOT_FOUND:no such request"), False),
    ("Echo", Msg(sha256="code:INVALID_ARGUMENT:bad %s 100% ünïcode\nline"), False),
    ("Echo", Msg(sha256="code:UNAVAILABLE:queue full"), False),
    ("Echo", Msg(sha256="code:RESOURCE_EXHAUSTED:"), False),
    ("Echo", Msg(sha256="code:INTERNAL:boom"), False),
    ("Echo", Msg(sha256="big:1048576"), False),
    ("Nope", Msg(), False),
    # A request far over the server's 64 KiB initial window: sent as WINDOW_UPDATEs allow.
    ("Echo", Msg(data=b"r" * 3_000_000), False),
    ("Count", Msg(data=b"abcdef"), True),
    ("Count", Msg(data=b""), True),
    ("Count", Msg(data=b"abc", sha256="code:ABORTED:stopped midway"), True),
    ("Count", Msg(data=b"abcd", sha256="code:FAILED_PRECONDITION:weights released"), True),
]


@pytest.mark.parametrize(("method", "req", "stream"), CASES)
async def test_same_outcome_as_grpcio(server, method, req, stream):
    port, _ = server
    ours, theirs = await both(port, method, req, stream=stream)
    assert ours == theirs


async def test_deadline_exceeded_like_grpcio(server):
    port, _ = server
    ours, theirs = await both(port, "Echo", Msg(sha256="sleep:1"), timeout=0.1)
    assert ours[:2] == theirs[:2] == ("error", "DEADLINE_EXCEEDED")
    assert ours[2] == theirs[2] == "Deadline Exceeded"


async def test_deadline_reaches_the_server_as_grpc_timeout(server):
    # The server's own deadline (from grpc-timeout) ends the call even with no local one
    # hit first: a slow stream with a long local deadline still ends DEADLINE_EXCEEDED.
    port, _ = server
    ch = Channel("127.0.0.1", port)
    with pytest.raises(DeadlineExceeded):
        async with ch.server_stream(
            f"/{SERVICE}/Count", Msg(data=b"d1", sha256="slow"), Msg, timeout=0.3
        ) as s:
            async for _ in s:
                pass
    await ch.aclose()


async def test_oversized_message_like_grpcio(server):
    port, _ = server
    req = Msg(sha256=f"big:{5 * 1024 * 1024}")
    ours, theirs = await both(port, "Echo", req)
    assert ours[:2] == theirs[:2] == ("error", "RESOURCE_EXHAUSTED")
    # A larger limit takes it.
    ok = await smgrl_call(port, "Echo", req, max_message_bytes=8 * 1024 * 1024)
    assert ok[0] == "ok" and len(ok[1][0]) > 5 * 1024 * 1024


async def test_leaving_a_stream_cancels_it_on_the_server(server):
    port, ref = server
    ch = Channel("127.0.0.1", port)
    async with ch.server_stream(f"/{SERVICE}/Count", Msg(data=b"left", sha256="slow"), Msg) as s:
        async for _ in s:
            break
    # The same through grpcio's client: cancel() after the first message.
    import grpc

    def grpcio_leave():
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            it = channel.unary_stream(f"/{SERVICE}/Count", Msg.SerializeToString, Msg.FromString)(
                Msg(data=b"left-grpcio", sha256="slow")
            )
            next(it)
            it.cancel()

    await trio.to_thread.run_sync(grpcio_leave)
    with trio.move_on_after(5):
        while {"left", "left-grpcio"} - set(ref.cancelled):
            await trio.sleep(0.02)
    assert {"left", "left-grpcio"} <= set(ref.cancelled)
    await ch.aclose()


async def test_cancelled_task_resets_its_stream(server):
    port, ref = server
    ch = Channel("127.0.0.1", port)
    with trio.move_on_after(0.2):
        async with ch.server_stream(f"/{SERVICE}/Count", Msg(data=b"scope", sha256="slow"), Msg) as s:
            async for _ in s:
                pass
    with trio.fail_after(5):
        while "scope" not in ref.cancelled:
            await trio.sleep(0.02)
    # The connection is still good for the next call.
    assert (await ch.unary(f"/{SERVICE}/Echo", Msg(data=b"after"), Msg)).data == b"after"
    assert ch.connections_opened == 1
    await ch.aclose()


async def test_1200_streams_on_one_connection_under_max_concurrent_streams(server):
    port, _ = server
    ch = Channel("127.0.0.1", port)
    results: dict[int, list[bytes]] = {}

    async def one(i: int):
        data = str(i).encode()
        async with ch.server_stream(f"/{SERVICE}/Count", Msg(data=data), Msg) as s:
            results[i] = [m.data async for m in s]

    async with trio.open_nursery() as nursery:
        for i in range(1200):
            nursery.start_soon(one, i)
    assert ch.connections_opened == 1
    for i, got in results.items():
        data = str(i).encode()
        assert got == [data[: k + 1] for k in range(len(data))]
    assert len(results) == 1200
    await ch.aclose()


def _grpcio_stream_until_stopped(port, started):
    return grpcio_call(port, "Count", Msg(data=b"g", sha256="slow"), stream=True)


async def test_server_shutdown_mid_stream_and_goaway_like_grpcio():
    # A server stopping with a grace period sends GOAWAY: running streams end as the server
    # decides (here: cancelled at the end of the grace), new calls fail UNAVAILABLE, and a
    # server back on the port is reached through a new connection.
    srv, port, _ = serve()
    ch = Channel("127.0.0.1", port)
    ours: list = []

    async def our_stream():
        ours.append(await _stream_outcome(ch, b"o"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(our_stream)
        theirs_task = nursery.start_soon(_theirs, port, ours)  # noqa: F841
        await trio.sleep(0.3)
        await trio.to_thread.run_sync(lambda: srv.stop(0.2).wait())
    ours_outcome, theirs_outcome = ours[0], ours[1]
    assert ours_outcome[:2] == theirs_outcome[:2], (ours_outcome, theirs_outcome)
    assert ours_outcome[1] in ("CANCELLED", "UNAVAILABLE")
    with pytest.raises(Unavailable):
        await ch.unary(f"/{SERVICE}/Echo", Msg(), Msg, timeout=2)
    await ch.aclose()


async def _theirs(port, out):
    await trio.sleep(0.05)
    out.append(await trio.to_thread.run_sync(_grpcio_stream_until_stopped, port, None))


async def _stream_outcome(ch, data):
    got = []
    try:
        async with ch.server_stream(f"/{SERVICE}/Count", Msg(data=data, sha256="slow"), Msg) as s:
            async for m in s:
                got.append(m.data)
    except GrpcError as exc:
        return ("error", exc.code.name, exc.message)
    return ("ok", got)


async def test_reconnects_after_the_server_came_back():
    srv, port, _ = serve()
    ch = Channel("127.0.0.1", port)
    assert (await ch.unary(f"/{SERVICE}/Echo", Msg(data=b"1"), Msg)).data == b"1"
    await trio.to_thread.run_sync(lambda: srv.stop(None).wait())
    with pytest.raises(Unavailable):
        await ch.unary(f"/{SERVICE}/Echo", Msg(data=b"2"), Msg)
    srv2, _port2, _ = serve_on(port)
    assert (await ch.unary(f"/{SERVICE}/Echo", Msg(data=b"3"), Msg)).data == b"3"
    assert ch.connections_opened == 2
    await ch.aclose()
    srv2.stop(None)


def serve_on(port):
    import grpc
    import grpc_reference as reference

    srv, _, ref = reference.serve()
    srv.stop(None)
    # grpcio binds at add_insecure_port: build the server again on the old port.
    server = grpc.server(reference.futures.ThreadPoolExecutor(max_workers=4))
    handler = grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(
                ref.echo, request_deserializer=Msg.FromString, response_serializer=Msg.SerializeToString
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    assert server.add_insecure_port(f"127.0.0.1:{port}") == port
    server.start()
    return server, port, ref


async def test_connection_refused_is_unavailable():
    srv, port, _ = serve()
    await trio.to_thread.run_sync(lambda: srv.stop(None).wait())
    ours = await smgrl_call(port, "Echo", Msg())
    theirs = await trio.to_thread.run_sync(grpcio_call, port, "Echo", Msg(), 2.0)
    assert ours[:2] == theirs[:2] == ("error", StatusCode.UNAVAILABLE.name)


async def test_graceful_goaway_lets_a_running_stream_finish():
    # stop(grace) sends GOAWAY; a stream the server already runs, and that ends within the
    # grace, ends OK with every message (h2 alone would stop reading at the GOAWAY).
    srv, port, _ = serve()
    ch = Channel("127.0.0.1", port)
    got: list[bytes] = []
    async with trio.open_nursery() as nursery:

        async def stream():
            async with ch.server_stream(
                f"/{SERVICE}/Count", Msg(data=b"x" * 30, sha256="sleep:0.6"), Msg
            ) as s:
                async for m in s:
                    got.append(m.data)

        nursery.start_soon(stream)
        await trio.sleep(0.2)
        stopped = await trio.to_thread.run_sync(lambda: srv.stop(5.0))
        with pytest.raises(Unavailable):
            await ch.unary(f"/{SERVICE}/Echo", Msg(), Msg, timeout=2)
    assert len(got) == 30
    await trio.to_thread.run_sync(stopped.wait)
    await ch.aclose()


async def test_keepalive_pings_are_answered_and_a_silent_peer_fails_the_connection(server):
    port, _ = server
    ch = Channel("127.0.0.1", port, keepalive_secs=0.05, keepalive_timeout_secs=1)
    async with ch.server_stream(f"/{SERVICE}/Count", Msg(data=b"ka", sha256="slow"), Msg) as s:
        async for m in s:
            if ch._conn.pings_acked >= 2:
                break
    await ch.aclose()
    # A peer that accepts and then says nothing (no SETTINGS, no PING ACK): the watchdog ends the
    # call UNAVAILABLE rather than letting it hang.
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, _silent, 0)
        silent_port = listeners[0].socket.getsockname()[1]
        ch = Channel("127.0.0.1", silent_port, keepalive_secs=0.1, keepalive_timeout_secs=0.2)
        with trio.fail_after(5), pytest.raises(Unavailable) as info:
            await ch.unary(f"/{SERVICE}/Echo", Msg(), Msg)
        assert "keepalive" in info.value.message
        await ch.aclose()
        nursery.cancel_scope.cancel()


async def _silent(stream):
    await trio.sleep_forever()


async def test_metadata_both_ways_like_grpcio(server):
    import grpc

    port, _ = server
    metadata = (("x-trace", "abc"), ("x-worker", "w1"))
    ch = Channel("127.0.0.1", port)
    async with ch.server_stream(f"/{SERVICE}/Echo", Msg(sha256="meta"), Msg, metadata=metadata) as s:
        ours = [m.data async for m in s]
        initial = s.initial_metadata
    await ch.aclose()

    def theirs():
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(f"/{SERVICE}/Echo", Msg.SerializeToString, Msg.FromString)
            answer, info = call.with_call(Msg(sha256="meta"), metadata=metadata)
            return [answer.data], tuple(info.initial_metadata())

    their_messages, their_initial = await trio.to_thread.run_sync(theirs)
    assert ours == their_messages == [b"x-trace=abc;x-worker=w1"]
    assert ("x-initial", "yes") in initial and ("x-initial", "yes") in their_initial


async def test_channel_set_shares_one_channel_per_address(server):
    from smgrl.upstream.grpc import ChannelSet

    port, _ = server
    channels = ChannelSet()
    a = channels.get(f"grpc://127.0.0.1:{port}")
    assert channels.get(f"grpc://127.0.0.1:{port}@1") is a  # a DP rank is the same engine
    assert (await a.unary(f"/{SERVICE}/Echo", Msg(data=b"z"), Msg)).data == b"z"
    await channels.aclose()
    with pytest.raises(Unavailable):
        await a.unary(f"/{SERVICE}/Echo", Msg(data=b"z"), Msg)


async def test_finished_calls_give_their_bytes_back_to_the_connection_window(server):
    # 400 answers of 200 kB (80 MB) on one connection, over its 64 MiB window: a call whose
    # last bytes arrived with its end must still hand them back, or the connection stalls.
    port, _ = server
    ch = Channel("127.0.0.1", port)
    try:
        with trio.fail_after(60):
            for _ in range(400):
                got = await ch.unary(f"/{SERVICE}/Echo", Msg(sha256="big:200000"), Msg, timeout=5)
                assert len(got.data) == 200000
        assert ch.connections_opened == 1
    finally:
        await ch.aclose()

"""Inference-side resilience: retries only before the first byte and only on
connection errors / 5xx, per-engine circuit breakers, in-flight load counters, the request
timeout, admission with a bounded queue, and proof that control calls touch none of it."""

from __future__ import annotations

import functools
import json

import attrs
import trio

from smgrl.core.config import BreakerConfig, Config, DataPlaneConfig, RetryConfig, RlConfig
from smgrl.dataplane.breaker import CLOSED, OPEN
from smgrl.testing import gateway_in_process
from smgrl.testing.dataplane import ScriptedEngine, gateway_on_loopback

GEN = {"text": "hello"}
OK = json.dumps({"text": "ok", "meta_info": {"weight_version": "default"}}).encode()


def cfg(retries: int = 3, breaker: BreakerConfig | None = None, **kw) -> Config:
    dp = DataPlaneConfig(
        eligible_wait_secs=0,
        retry=RetryConfig(max_retries=retries, initial_backoff_ms=1, max_backoff_ms=2),
        breaker=breaker or BreakerConfig(failure_threshold=100),
        **kw.pop("dp", {}),
    )
    return Config(rl=RlConfig(enabled=True, control_timeout_secs=5), policy="round_robin", dataplane=dp, **kw)


def failing(status: int = 500):
    async def script(req, w):
        if req.path.startswith("/generate") or req.path.startswith("/v1/"):
            await w.full(status, b'{"error": "boom"}')
        else:
            await w.full(200, b"{}")  # control routes answer

    return script


async def everything_fails(req, w):
    await w.full(503, b'{"error": "down"}')


async def hang_up(req, w):
    await w.hang_up()  # read the request, close without a byte of answer


async def good(req, w):
    await w.full(200, OK)


async def engines(nursery, *scripts) -> list[ScriptedEngine]:
    out = []
    for script in scripts:
        out.append(await nursery.start(ScriptedEngine(script).serve))
    return out


async def test_a_5xx_or_a_connection_error_is_retried_on_another_engine():
    for bad in (failing(500), hang_up):
        async with trio.open_nursery() as nursery:
            broken, healthy = await engines(nursery, bad, good)
            async with gateway_in_process(cfg(), worker_urls=[broken.url, healthy.url]) as gw:
                wids = [gw.gateway.fleet.registry.id_for_url(u) for u in (broken.url, healthy.url)]
                for _ in range(4):
                    r = await gw.client.post("/generate", json=GEN)
                    assert r.status_code == 200 and r.headers["x-smgrl-worker-id"] == wids[1]
                # Round robin sent every other first attempt there (the upstream pool may resend
                # once on a fresh connection when a kept-alive one dies without a byte: pool.py).
                assert len(broken.seen) in (2, 3)
                assert len(healthy.seen) == 4
                assert gw.app.dataplane.loads == dict.fromkeys(wids, 0)
            nursery.cancel_scope.cancel()


async def test_a_4xx_is_never_retried_and_the_last_5xx_is_relayed():
    async with trio.open_nursery() as nursery:
        (bad,) = await engines(nursery, failing(400))
        async with gateway_in_process(cfg(), worker_urls=[bad.url]) as gw:
            r = await gw.client.post("/generate", json=GEN)
            assert r.status_code == 400 and len(bad.seen) == 1
        (worse,) = await engines(nursery, failing(503))
        async with gateway_in_process(cfg(retries=3), worker_urls=[worse.url]) as gw:
            r = await gw.client.post("/generate", json=GEN)
            assert r.status_code == 503 and r.content == b'{"error": "boom"}'
            assert len(worse.seen) == 3  # every attempt, then the engine's answer as it is
        nursery.cancel_scope.cancel()


async def test_retries_exhausted_on_connection_errors_is_a_502():
    async with trio.open_nursery() as nursery:
        (dead,) = await engines(nursery, hang_up)
        async with gateway_in_process(cfg(retries=2), worker_urls=[dead.url]) as gw:
            r = await gw.client.post("/generate", json=GEN)
            assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unreachable"
            assert len(dead.seen) in (2, 3)  # two attempts (+ the pool's stale-connection resend)
        nursery.cancel_scope.cancel()


async def test_disable_retries_means_one_attempt():
    config = cfg()
    config = attrs.evolve(config, dataplane=attrs.evolve(config.dataplane, retry=RetryConfig(enabled=False)))
    async with trio.open_nursery() as nursery:
        broken, healthy = await engines(nursery, failing(500), good)
        async with gateway_in_process(config, worker_urls=[broken.url, healthy.url]) as gw:
            statuses = sorted([(await gw.client.post("/generate", json=GEN)).status_code for _ in range(2)])
            assert statuses == [200, 500] and len(broken.seen) == 1
        nursery.cancel_scope.cancel()


async def test_nothing_is_retried_once_the_first_byte_reached_the_client():
    async def cut(req, w):
        await w.start()
        await w.chunk(b'data: {"text": "a"}\n\n')
        await w.hang_up()

    async with trio.open_nursery() as nursery:
        (broken,) = await engines(nursery, cut)
        async with gateway_on_loopback(cfg(worker_urls=(broken.url,))) as gw:
            await gw.wait_routable(1)
            r = await gw.client.post("/generate", json={"text": "x", "stream": True})
            assert r.status_code == 200
            events = r.text.split("\n\n")
            assert events[0] == 'data: {"text": "a"}'
            assert json.loads(events[1][6:])["error"]["code"] == "upstream_unreachable"
            assert "[DONE]" not in r.text
            assert len(broken.seen) == 1
        nursery.cancel_scope.cancel()


async def test_an_open_breaker_keeps_an_engine_out_until_it_half_opens(mock_clock):
    # Time is the subject: the clock runs at real speed (sockets and the gateway's own waits go on)
    # and the test moves it past the breaker's open period itself, so a slow machine can neither
    # half-open the breaker early nor make the test wait.
    mock_clock.rate = 1
    breaker = BreakerConfig(failure_threshold=2, success_threshold=1, timeout_secs=60, window_secs=600)
    async with trio.open_nursery() as nursery:
        broken, healthy = await engines(nursery, failing(500), good)
        async with gateway_in_process(cfg(breaker=breaker), worker_urls=[broken.url, healthy.url]) as gw:
            dp = gw.app.dataplane
            for _ in range(4):
                assert (await gw.client.post("/generate", json=GEN)).status_code == 200
            assert dp.breakers.state(broken.url) == OPEN
            seen = len(broken.seen)
            for _ in range(6):
                assert (await gw.client.post("/generate", json=GEN)).status_code == 200
            assert len(broken.seen) == seen  # not even tried while open
            # A control call still reaches it: breakers are the data plane's alone.
            wid = gw.gateway.fleet.registry.id_for_url(broken.url)
            r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache", json={})
            assert r.status_code == 200 and broken.seen[-1].path == "/flush_cache"
            broken.script = good
            mock_clock.jump(61)  # past the open period: the breaker half-opens
            tried = len(broken.seen)
            for _ in range(4):  # round robin over two engines: the half-open one is tried again
                assert (await gw.client.post("/generate", json=GEN)).status_code == 200
            assert len(broken.seen) > tried
            assert dp.breakers.state(broken.url) == CLOSED  # one success closes it
        nursery.cancel_scope.cancel()


async def test_disable_circuit_breaker():
    breaker = BreakerConfig(failure_threshold=1)
    async with trio.open_nursery() as nursery:
        broken, healthy = await engines(nursery, failing(500), good)
        config = cfg(breaker=breaker, disable_circuit_breaker=True)
        async with gateway_in_process(config, worker_urls=[broken.url, healthy.url]) as gw:
            for _ in range(6):
                await gw.client.post("/generate", json=GEN)
            assert len(broken.seen) == 3 and gw.app.dataplane.breakers.by_engine == {}
        nursery.cancel_scope.cancel()


async def test_control_calls_never_touch_breakers_or_load_counters():
    breaker = BreakerConfig(failure_threshold=1)
    async with trio.open_nursery() as nursery:
        (engine,) = await engines(nursery, failing(500))
        async with gateway_in_process(cfg(breaker=breaker), worker_urls=[engine.url]) as gw:
            dp = gw.app.dataplane
            wid = gw.gateway.fleet.registry.id_for_url(engine.url)
            engine.script = everything_fails  # now control routes fail too
            for _ in range(5):
                r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/pause_generation", json={})
                assert r.status_code == 503
                r = await gw.client.post(
                    "/v1/rl/engine/flush_cache", params={"selector": "engine=sglang"}, json={}
                )
                assert r.status_code == 207
            engine.script = hang_up  # no answer at all now: control calls fail to read one
            for _ in range(3):
                r = await gw.client.post(
                    "/v1/rl/engine/flush_cache", params={"selector": "engine=sglang"}, json={}
                )
                assert r.status_code == 207
            assert dp.breakers.by_engine == {} and dp.breakers.open_count == 0
            assert dp.loads == {}
        nursery.cancel_scope.cancel()


async def test_in_flight_counters_follow_streams_to_their_end():
    release = trio.Event()

    async def slow(req, w):
        await w.start()
        await w.chunk(b'data: {"text": "a"}\n\n')
        await release.wait()
        await w.chunk(b"data: [DONE]\n\n")
        await w.end()

    async with trio.open_nursery() as nursery:
        (engine,) = await engines(nursery, slow)
        async with gateway_on_loopback(cfg(worker_urls=(engine.url,))) as gw:
            await gw.wait_routable(1)
            wid = gw.gateway.fleet.registry.id_for_url(engine.url)
            plane = gw.dataplane
            async with gw.client.stream("POST", "/generate", json={"text": "x", "stream": True}) as r:
                chunks = r.aiter_raw()
                await chunks.__anext__()
                assert plane.loads[wid] == 1 and plane.admission.active == 1
                release.set()
                async for _ in chunks:
                    pass
            with trio.fail_after(5):
                while plane.loads[wid] or plane.admission.active:
                    await trio.sleep(0.01)
        nursery.cancel_scope.cancel()


async def test_the_request_timeout_is_a_504():
    async def stuck(req, w):
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        (engine,) = await engines(nursery, stuck)
        config = attrs.evolve(cfg(worker_urls=()), request_timeout_secs=0.1)
        async with gateway_in_process(config, worker_urls=[engine.url]) as gw:
            r = await gw.client.post("/generate", json=GEN)
            assert r.status_code == 504 and r.json()["error"]["code"] == "request_timeout"
        nursery.cancel_scope.cancel()


async def test_max_concurrent_requests_queue_and_429():
    release = trio.Event()

    async def slow(req, w):
        await release.wait()
        await w.full(200, OK)

    async with trio.open_nursery() as nursery:
        (engine,) = await engines(nursery, slow)
        config = cfg(dp={"max_concurrent_requests": 1, "queue_size": 1, "queue_timeout_secs": 30})
        async with gateway_in_process(config, worker_urls=[engine.url]) as gw:
            adm = gw.app.dataplane.admission
            results = []

            async def rollout():
                results.append((await gw.client.post("/generate", json=GEN)).status_code)

            with trio.fail_after(10):
                async with trio.open_nursery() as inner:
                    inner.start_soon(rollout)
                    while adm.active < 1:
                        await trio.sleep(0.001)
                    inner.start_soon(rollout)
                    while len(adm.queue) < 1:
                        await trio.sleep(0.001)
                    r = await gw.client.post("/generate", json=GEN)
                    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_requests"
                    assert r.headers["retry-after"] == "1"
                    release.set()
            assert results == [200, 200]
            assert adm.active == 0 and not adm.queue
        nursery.cancel_scope.cancel()


async def test_a_queue_wait_that_runs_out_is_a_429():
    release = trio.Event()

    async def slow(req, w):
        await release.wait()
        await w.full(200, OK)

    async with trio.open_nursery() as nursery:
        (engine,) = await engines(nursery, slow)
        config = cfg(dp={"max_concurrent_requests": 1, "queue_size": 4, "queue_timeout_secs": 0.05})
        async with gateway_in_process(config, worker_urls=[engine.url]) as gw:
            adm = gw.app.dataplane.admission
            async with trio.open_nursery() as inner:
                inner.start_soon(functools.partial(gw.client.post, "/generate", json=GEN))
                while adm.active < 1:
                    await trio.sleep(0.001)
                r = await gw.client.post("/generate", json=GEN)
                assert r.status_code == 429 and r.json()["error"]["code"] == "queue_timeout"
                release.set()
        nursery.cancel_scope.cancel()


async def test_an_open_breaker_of_a_held_out_engine_never_makes_a_waiting_request_spin():
    # The wait for an engine held out by its breaker woke at the earliest reopen time
    # of ANY open breaker, including one of an engine the table holds out (paused: never
    # consulted, so its reopen time stays in the past): the wait returned at once and selection
    # spun (15,309 passes in 0.3 s where 2 are expected).
    timeout = 0.5
    breaker = BreakerConfig(failure_threshold=1, success_threshold=1, timeout_secs=timeout, window_secs=60)
    config = cfg(retries=1, breaker=breaker)
    dataplane = attrs.evolve(config.dataplane, retry=RetryConfig(enabled=False), eligible_wait_secs=10)
    config = attrs.evolve(config, dataplane=dataplane)
    async with trio.open_nursery() as nursery:
        a, b = await engines(nursery, failing(500), failing(500))
        async with gateway_in_process(config, worker_urls=[a.url, b.url]) as gw:
            dp = gw.app.dataplane
            r = await gw.client.post("/generate", json=GEN)
            first = a if r.headers["x-smg-routed-worker-id"] == a.url else b
            second = b if first is a else a
            opened = trio.current_time()
            wid = gw.gateway.fleet.registry.id_for_url(first.url)
            r = await gw.client.post(f"/v1/rl/workers/{wid}/state", json={"control": "paused"})
            assert r.status_code == 200
            # The paused engine's breaker stays open; its reopen time passes.
            await trio.sleep_until(opened + timeout + 0.05)
            assert (await gw.client.post("/generate", json=GEN)).status_code == 500  # opens `second`
            assert dp.breakers.state(second.url) == OPEN and dp.breakers.state(first.url) == OPEN
            second.script = good
            passes = dp.wait_passes
            with trio.fail_after(5):
                r = await gw.client.post("/generate", json=GEN)  # waits for `second` to half-open
            assert r.status_code == 200 and r.headers["x-smg-routed-worker-id"] == second.url
            assert dp.wait_passes - passes <= 3
        nursery.cancel_scope.cancel()

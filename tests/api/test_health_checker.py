"""The health checker: thresholds, recovery, and never probing an engine the journal knows is paused."""

import trio

from smgrl.core.config import Config, HealthConfig, RlConfig
from smgrl.fake import fake_fleet
from smgrl.registry.health import HealthChecker
from smgrl.testing import gateway_in_process

CFG = Config(rl=RlConfig(enabled=True, control_timeout_secs=5))
HEALTH = HealthConfig(interval_secs=1, timeout_secs=1, failure_threshold=2, success_threshold=2)


def checker(gw):
    g = gw.gateway
    return HealthChecker(fleet=g.fleet, registry=g.registry, pools=g.pools, keys=g.keys, cfg=HEALTH)


async def accepting(port: int) -> None:
    """``come_up`` re-opens the listener in the background: wait until it accepts (bounded)."""
    with trio.fail_after(10):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                await trio.sleep(0.01)
                continue
            await stream.aclose()
            return


def status(gw):
    return {w.base_url: w.status for w in gw.gateway.fleet.registry}


async def test_failures_then_recovery_follow_the_thresholds():
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(CFG, worker_urls=fleet.urls) as gw:
        hc = checker(gw)
        down, up = fleet.engines
        down.go_down(60)
        await hc.check_once()
        assert status(gw)[down.url] == "ready"  # one failure is below the threshold
        await hc.check_once()
        assert status(gw) == {down.url: "not_ready", up.url: "ready"}
        down.come_up()
        await accepting(down.port)
        await hc.check_once()
        assert status(gw)[down.url] == "not_ready"  # one success is below the threshold
        await hc.check_once()
        assert status(gw)[down.url] == "ready"
        kinds = [r.event.TYPE for r in gw.store.read(types=["worker.health_changed"])]
        assert kinds == ["worker.health_changed", "worker.health_changed"]  # transitions only


async def test_a_paused_engine_is_not_probed_and_not_marked_dead():
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(CFG, worker_urls=fleet.urls) as gw:
        engine = fleet.engines[0]
        r = await gw.client.post("/v1/rl/engine/pause_generation?selector=engine%3Dsglang", json={})
        assert r.status_code == 200
        assert gw.gateway.fleet.facts()[engine.url].control == "paused"
        hc = checker(gw)
        assert list(hc.candidates()) == []
        engine.clear_calls()
        engine.go_down(60)  # even if its /health would fail now (SGLang's stalls while paused)
        for _ in range(3):
            await hc.check_once()
        assert status(gw)[engine.url] == "ready"
        assert engine.calls_to("/health") == []
        engine.come_up()
        # A fan-out sent before the listener is back meets a closed port (the raw engine-route
        # front answers fast enough to hit that window).
        await accepting(engine.port)
        r = await gw.client.post("/v1/rl/engine/continue_generation?selector=engine%3Dsglang", json={})
        assert r.status_code == 200
        assert [w.id for w in hc.candidates()] == [w.id for w in gw.gateway.fleet.registry]

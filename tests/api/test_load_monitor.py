"""The load monitor: engine_load in GET /workers rows, as SMG 1.13.0 shows it (real fake engines)."""

import httpx
import pytest
import trio
from rl_api_helpers import rl_cfg

from smgrl.core.config import Config, HealthConfig
from smgrl.fake import fake_fleet
from smgrl.registry.loads import group_key, monitoring_enabled
from smgrl.runtime.server import serve
from smgrl.testing import gateway_in_process

CFG = rl_cfg()


async def rows(gw) -> dict:
    r = await gw.client.get("/workers")
    assert r.status_code == 200
    return {w["url"]: w for w in r.json()["workers"]}


def paths(engine, prefix: str) -> list[str]:
    return [c.path for c in engine.calls if c.path.startswith(prefix)]


async def test_a_tick_shows_each_ready_engines_sample_and_drops_a_failed_one():
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(CFG, worker_urls=fleet.urls) as gw:
        monitor = gw.gateway.loads
        before = await rows(gw)
        assert all("engine_load" not in w for w in before.values())  # no sample yet: absent
        (key,) = {group_key(w) for w in gw.gateway.fleet.registry}
        await monitor.poll_group(key)
        after = await rows(gw)
        for engine in fleet.engines:
            load = after[engine.url]["engine_load"]
            assert list(load) == ["timestamp", "version", "dp_rank_count", "loads"]
            assert load["version"] == "0.5.23" and load["dp_rank_count"] == 0
            assert [r["dp_rank"] for r in load["loads"]] == [0]
            assert set(load["loads"][0]) >= {"memory", "queues"}  # include=memory,queues was asked
            assert paths(engine, "/v1/loads") == ["/v1/loads"]
        one = after[fleet.engines[0].url]
        r = await gw.client.get(f"/workers/{one['id']}")
        assert r.json()["engine_load"] == one["engine_load"]
        # A failed read clears that engine's sample (never a stale one); SMG then tries /metrics.
        failing, fine = fleet.engines
        failing.set_knobs(force_status=500)
        await monitor.poll_group(key)
        after = await rows(gw)
        assert "engine_load" not in after[failing.url]
        assert "engine_load" in after[fine.url]
        assert paths(failing, "/metrics") == ["/metrics"]
        # A 500 is a condition, not a fact about the route: the next tick asks /v1/loads again.
        failing.set_knobs(force_status=None)
        await monitor.poll_group(key)
        assert "engine_load" in (await rows(gw))[failing.url]


async def test_an_engine_without_v1_loads_is_not_asked_again():
    async with fake_fleet("vllm", 1) as fleet, gateway_in_process(CFG, worker_urls=fleet.urls) as gw:
        engine = fleet.engines[0]
        (key,) = {group_key(w) for w in gw.gateway.fleet.registry}
        for _ in range(2):
            await gw.gateway.loads.poll_group(key)
        assert paths(engine, "/v1/loads") == ["/v1/loads"]  # 404 once, remembered
        assert paths(engine, "/metrics") == ["/metrics", "/metrics"]  # the fake serves none
        assert "engine_load" not in (await rows(gw))[engine.url]


async def test_dp_aware_rank_rows_have_no_sample():
    cfg = rl_cfg(dp_aware=True)
    async with (
        fake_fleet("sglang", 1, dp_size=2) as fleet,
        gateway_in_process(cfg, worker_urls=fleet.urls) as gw,
    ):
        for key in {group_key(w) for w in gw.gateway.fleet.registry}:
            await gw.gateway.loads.poll_group(key)
        listed = await rows(gw)
        assert len(listed) == 2 and all("engine_load" not in w for w in listed.values())
        assert paths(fleet.engines[0], "/v1/loads") == []


async def test_a_sample_goes_when_its_worker_is_removed_or_leaves_ready():
    """The running monitor drops the sample itself (its group ticks once an hour here: no tick
    replaces it), on the registry change alone."""
    async with (
        fake_fleet("sglang", 2) as fleet,
        gateway_in_process(CFG, worker_urls=fleet.urls) as gw,
        trio.open_nursery() as nursery,
    ):
        monitor = gw.gateway.loads
        monitor.interval_secs = 3600
        await nursery.start(monitor.run)
        leaving, removed = list(gw.gateway.fleet.registry)

        async def until(check) -> None:
            with trio.fail_after(20):
                while not check():
                    await trio.sleep(0.01)

        await until(lambda: monitor.sample(leaving.id) and monitor.sample(removed.id))
        await gw.gateway.registry.set_health(leaving, "not_ready", "test")
        await until(lambda: monitor.sample(leaving.id) is None)
        assert "engine_load" not in (await rows(gw))[leaving.url]
        r = await gw.client.delete(f"/workers/{removed.id}")
        assert r.status_code in (200, 202, 204), r.text
        await until(lambda: monitor.sample(removed.id) is None)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("disable", "policy", "no_overload", "polls"),
    [
        (False, "round_robin", True, True),  # on by default
        (True, "cache_aware", True, True),  # a load-aware policy needs the data
        (True, "least_load", True, True),
        (True, "round_robin", False, True),  # SMG's overload protection is on by default
        (True, "round_robin", True, False),
        (True, "random", True, False),
    ],
)
def test_disable_load_monitoring_follows_smgs_gate(disable, policy, no_overload, polls):
    cfg = Config(
        disable_load_monitoring=disable, policy=policy, disable_worker_overload_protection=no_overload
    )
    assert monitoring_enabled(cfg) is polls


async def test_launch_runs_the_monitor_and_get_workers_shows_the_sample():
    async with fake_fleet("sglang", 1) as fleet:
        cfg = rl_cfg(
            port=0,
            prometheus_port=None,
            health=HealthConfig(enabled=False),
            shutdown_grace_period_secs=0,
            journal=":memory:",
            worker_urls=tuple(fleet.urls),
        )
        async with trio.open_nursery() as nursery:
            shutdown = trio.Event()
            running = await nursery.start(
                lambda task_status: serve(cfg, shutdown=shutdown, task_status=task_status)
            )
            async with httpx.AsyncClient(base_url=running.urls[0]) as client:
                # Discovery, then the group's first tick, happen in the background: bounded wait.
                with trio.fail_after(20):
                    while True:
                        (row,) = (await client.get("/workers")).json()["workers"]
                        if "engine_load" in row:
                            break
                        await trio.sleep(0.05)
            assert row["engine_load"]["loads"][0]["max_total_num_tokens"] == 500000
            shutdown.set()


async def test_get_loads_flattens_the_samples_per_rank_with_totals():
    async with (
        fake_fleet("sglang", 1) as one,
        fake_fleet("sglang", 1, dp_size=2) as two,
        gateway_in_process(CFG, worker_urls=one.urls + two.urls) as gw,
    ):
        empty = await gw.client.get("/get_loads")
        assert empty.status_code == 200
        assert list(empty.json()) == ["timestamp", "version", "dp_rank_count", "loads"]
        assert empty.json()["version"].startswith("smgrl-")
        assert (empty.json()["dp_rank_count"], empty.json()["loads"]) == (0, [])
        for key in {group_key(w) for w in gw.gateway.fleet.registry}:
            await gw.gateway.loads.poll_group(key)
        # Idle engines: the totals are 0 (their arithmetic is tests/unit/test_engine_load.py's).
        body = (await gw.client.get("/get_loads")).json()
        assert body["dp_rank_count"] == 3
        assert [(r["worker"], r["dp_rank"]) for r in body["loads"]] == [
            (one.urls[0], 0),
            (two.urls[0], 0),
            (two.urls[0], 1),
        ]
        assert all(
            r["worker_type"] == "regular" and r["max_total_num_tokens"] == 500000 for r in body["loads"]
        )
        assert body["aggregate"] == {
            "total_running_reqs": 0,
            "total_waiting_reqs": 0,
            "total_reqs": 0,
            "avg_token_usage": 0.0,
            "avg_throughput": 0.0,
            "avg_utilization": 0.0,
        }
        wrong = await gw.client.post("/get_loads")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "GET,HEAD"
        assert wrong.json()["error"]["code"] == "method_not_allowed"


async def test_a_worker_joining_a_polling_group_is_read_at_once():
    """The group's loop ticks once an hour here: only the read on joining can give the newcomer
    its sample."""
    async with (
        fake_fleet("sglang", 2) as fleet,
        gateway_in_process(CFG, worker_urls=fleet.urls[:1]) as gw,
        trio.open_nursery() as nursery,
    ):
        monitor = gw.gateway.loads
        monitor.interval_secs = 3600
        await nursery.start(monitor.run)

        async def sample_of(url: str) -> dict:
            with trio.fail_after(20):
                while (row := (await rows(gw)).get(url)) is None or "engine_load" not in row:
                    await trio.sleep(0.02)
            return row["engine_load"]

        await sample_of(fleet.urls[0])  # the group's first tick
        await gw.register(fleet.urls[1:])
        assert (await sample_of(fleet.urls[1]))["loads"][0]["max_total_num_tokens"] == 500000
        assert len(paths(fleet.engines[1], "/v1/loads")) == 1
        nursery.cancel_scope.cancel()


async def test_an_answer_too_large_to_keep_is_no_sample_and_the_route_is_asked_again():
    # 3 bytes per rank on the wire, about 1 KB each in memory and in every GET /workers: an
    # engine answering a million ranks took the gateway to 1.5 GB and GET /workers to 14 s.
    from smgrl.core.engine_load import MAX_RANKS

    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(CFG, worker_urls=fleet.urls) as gw:
        engine = fleet.engines[0]
        (key,) = {group_key(w) for w in gw.gateway.fleet.registry}
        engine.set_knobs(
            force_status=200, force_body='{"loads": [' + ",".join(["{}"] * (MAX_RANKS + 1)) + "]}"
        )
        await gw.gateway.loads.poll_group(key)
        assert "engine_load" not in (await rows(gw))[engine.url]
        assert paths(engine, "/metrics") == ["/metrics"]  # a failed read: /metrics instead
        # A condition of this answer, not a fact about the route: the next tick asks again.
        engine.set_knobs(force_status=None, force_body=None)
        await gw.gateway.loads.poll_group(key)
        assert paths(engine, "/v1/loads") == ["/v1/loads", "/v1/loads"]
        assert "engine_load" in (await rows(gw))[engine.url]


async def test_a_large_answer_is_parsed_off_the_event_loop(monkeypatch):
    # A 3 MB /metrics took ~290 ms of the event loop per tick, every request waiting: a large
    # answer is parsed in a worker thread (the same sample), a small one on the loop.
    import threading

    from smgrl.core.engine_load import parse_loads
    from smgrl.registry import loads

    threads: list[int] = []

    def spy(data):
        threads.append(threading.get_ident())
        return parse_loads(data)

    monkeypatch.setattr(loads, "parse_loads", spy)
    ranks = ",".join(f'{{"dp_rank": {i}, "num_running_reqs": {i}, "pad": "{"x" * 120}"}}' for i in range(700))
    big = '{"version": "0.5.23", "dp_rank_count": 700, "loads": [' + ranks + "]}"
    assert len(big) > loads.THREAD_PARSE_BYTES
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(CFG, worker_urls=fleet.urls) as gw:
        engine = fleet.engines[0]
        (key,) = {group_key(w) for w in gw.gateway.fleet.registry}
        await gw.gateway.loads.poll_group(key)  # the fake's own small answer
        engine.set_knobs(force_status=200, force_body=big)
        await gw.gateway.loads.poll_group(key)
        load = (await rows(gw))[engine.url]["engine_load"]
        assert [r["dp_rank"] for r in load["loads"]] == list(range(700))
    loop_thread = threading.get_ident()
    assert threads[0] == loop_thread  # small: on the loop
    assert threads[1] != loop_thread  # large: in a worker thread

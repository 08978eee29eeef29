"""Data-plane metrics on the gateway's registry: request counts, the M2 families."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}


def series(gw) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(gw.gateway.metrics.render().decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_request_and_rl_series():
    config = Config(
        rl=RlConfig(enabled=True), policy="round_robin", dataplane=DataPlaneConfig(eligible_wait_secs=0)
    )
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(config, worker_urls=fleet.urls) as gw:
        a, b = (gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls)
        for _ in range(2):
            assert (await gw.client.post("/generate", json=GEN)).status_code == 200
        await gw.client.post(f"/v1/rl/workers/{a}/version", json={"weight_version": "12"})
        await gw.client.post(f"/v1/rl/workers/{b}/state", json={"control": "paused"})
        assert (await gw.client.post("/generate", json=GEN)).status_code == 200
        await gw.client.post(f"/v1/rl/workers/{a}/state", json={"control": "asleep"})
        assert (await gw.client.post("/generate", json=GEN)).status_code == 503
        s = series(gw)
        assert s[("smgrl_dataplane_requests_total", (("route", "/generate"), ("status", "200")))] == 3
        assert s[("smgrl_dataplane_requests_total", (("route", "/generate"), ("status", "503")))] == 1
        assert s[("smgrl_dataplane_request_duration_seconds_count", (("route", "/generate"),))] == 4
        assert s[("smgrl_rl_worker_weight_version", (("worker", fleet.urls[0]),))] == 12
        assert ("smgrl_rl_worker_weight_version", (("worker", fleet.urls[1]),)) not in s  # unversioned
        assert s[("smgrl_rl_worker_control_state", (("worker", fleet.urls[0]),))] == 2
        assert s[("smgrl_rl_worker_control_state", (("worker", fleet.urls[1]),))] == 1
        assert s[("smgrl_rl_candidates_filtered_total", (("reason", "paused"),))] == 2
        assert s[("smgrl_rl_candidates_filtered_total", (("reason", "asleep"),))] == 1
        assert s[("smgrl_rl_requests_unroutable_total", ())] == 1
        assert s[("smgrl_dataplane_waiting_requests", ())] == 0
        assert s[("smgrl_dataplane_inflight_requests", (("worker", fleet.urls[0]),))] == 0


async def test_no_rl_series_without_enable_rl():
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(Config(), worker_urls=fleet.urls) as gw:
        await gw.client.post("/generate", json=GEN)
        text = gw.gateway.metrics.render().decode()
        assert "smgrl_dataplane_requests_total" in text and "_rl_" not in text

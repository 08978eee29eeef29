"""`smg_rl_*` metrics after a mixed session (docs/rl-control-plane.md, "Metrics")."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from rl_api_helpers import rl_cfg, row_ids

from smgrl.core.config import Config, RlConfig
from smgrl.fake import fake_fleet
from smgrl.telemetry.metrics import DURATION_BUCKETS
from smgrl.testing import gateway_in_process

HELP = {
    "smg_rl_control_calls": "RL control-plane calls proxied to engines, by operation and result",
    "smg_rl_control_call_duration_seconds": "Latency of one proxied RL control call, by operation",
    "smg_rl_fanout": "RL fan-out requests, by result",
    "smg_rl_fanout_duration_seconds": "Wall time of one RL fan-out request",
}


def samples(text: str) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("smg_rl_") and not s.name.endswith("_created"):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def test_mixed_session_counts():
    async with (
        fake_fleet("sglang", 3) as fleet,
        gateway_in_process(rl_cfg(timeout=1), worker_urls=fleet.urls) as gw,
    ):
        a, _, _ = await row_ids(gw)
        post = gw.client.post
        assert (await post(f"/v1/rl/workers/{a}/engine/flush_cache")).status_code == 200
        assert (await post(f"/v1/rl/workers/{a}/engine/pause_generation", json={})).status_code == 200
        assert (await post(f"/v1/rl/workers/{a}/engine/continue_generation", json={})).status_code == 200
        assert (await post(f"/v1/rl/workers/{a}/engine/inference/v1/generate", json={})).status_code == 404
        assert (await post(f"/v1/rl/workers/{a}/engine/echo")).status_code == 404
        assert (await post(f"/v1/rl/workers/{a}/engine/generate", json={})).status_code == 400
        # Not counted: validation failures, unknown workers, bad selectors.
        assert (await post(f"/v1/rl/workers/{a}/engine/a/b/c/d/e")).status_code == 400
        assert (await post("/v1/rl/workers/nope/engine/flush_cache")).status_code == 404
        assert (await post("/v1/rl/engine/flush_cache")).status_code == 400
        assert (await post("/v1/rl/engine/flush_cache?selector=engine%3D%3D")).status_code == 400
        assert (await post("/v1/rl/engine/a/b/c/d/e?selector=engine%3Dsglang")).status_code == 400
        # Counted: no_match, ok, partial (one engine down, one hung).
        assert (await post("/v1/rl/engine/flush_cache?selector=engine%3Dvllm")).status_code == 400
        assert (await post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")).status_code == 200
        rows = (await gw.client.get("/v1/rl/workers")).json()["workers"]
        engines = {e.url: e for e in fleet.engines}
        engines[rows[1]["url"]].go_down(30)
        engines[rows[2]["url"]].set_knobs(hang=True)
        assert (await post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")).status_code == 207

        text = gw.gateway.metrics.render().decode()
        got = samples(text)
        calls = {k[1]: v for k, v in got.items() if k[0] == "smg_rl_control_calls_total"}
        assert calls == {
            (("op", "flush_cache"), ("result", "ok")): 5.0,  # 1 call + 3 (ok fan-out) + 1 (partial)
            (("op", "pause_generation"), ("result", "ok")): 1.0,
            (("op", "continue_generation"), ("result", "ok")): 1.0,
            (("op", "other"), ("result", "upstream_error")): 3.0,  # multi-segment, echo, generate
            (("op", "flush_cache"), ("result", "unreachable")): 1.0,
            (("op", "flush_cache"), ("result", "timeout")): 1.0,
        }
        fanouts = {k[1]: v for k, v in got.items() if k[0] == "smg_rl_fanout_total"}
        assert fanouts == {
            (("result", "no_match"),): 1.0,
            (("result", "ok"),): 1.0,
            (("result", "partial"),): 1.0,
        }
        assert got[("smg_rl_fanout_duration_seconds_count", ())] == 3.0
        assert got[("smg_rl_control_call_duration_seconds_count", (("op", "other"),))] == 3.0
        assert got[("smg_rl_control_call_duration_seconds_count", (("op", "flush_cache"),))] == 7.0
        buckets = sorted(
            float(dict(k[1])["le"]) for k in got if k[0] == "smg_rl_fanout_duration_seconds_bucket"
        )
        assert buckets == sorted([*map(float, DURATION_BUCKETS), float("inf")])
        for name, help_text in HELP.items():
            assert f"# HELP {name if name.endswith('seconds') else name + '_total'} {help_text}\n" in text
        names = {f.name for f in text_string_to_metric_families(text) if f.name.startswith("smg_rl")}
        assert names - {n for n in names if n.endswith("_created")} == set(HELP)


async def test_no_rl_series_without_enable_rl():
    async with (
        fake_fleet("sglang", 1) as fleet,
        gateway_in_process(Config(rl=RlConfig(enabled=False)), worker_urls=fleet.urls) as gw,
    ):
        await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
        assert "smg_rl" not in gw.gateway.metrics.render().decode()


async def test_no_created_series():
    """SMG 1.13.0 exposes no *_created series (smgrl/telemetry/metrics.py turns them off)."""
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        await gw.client.post("/v1/rl/engine/flush_cache?selector=engine%3Dsglang")
        assert "_created" not in gw.gateway.metrics.render().decode()

"""SMG's gateway-level engine reads (GET /get_server_info, /get_model_info, /health_generate):
the first ready engine's answer relayed, no key needed (as SMG 1.13.0 answered them)."""

import json

from rl_api_helpers import rl_cfg

from smgrl.core.auth import ControlPlaneKey
from smgrl.core.config import Config
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

KEYS = ("adm:Admin:admin:admin-secret",)


async def test_the_first_ready_engine_answers_and_its_answer_is_relayed():
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        first = fleet.engines[0]
        info = await gw.client.get("/get_server_info")
        assert info.status_code == 200 and info.headers["content-type"] == "application/json"
        assert info.json()["port"] == first.port  # the first registered engine's own document
        model = await gw.client.get("/get_model_info")
        assert model.json()["served_model_name"] == "fake/Qwen3-0.6B"
        health = await gw.client.get("/health_generate")
        assert health.status_code == 200 and health.content == b""
        assert "content-type" not in health.headers  # none from the engine, none relayed
        assert [c.path for c in first.calls if c.path.startswith("/get_")] == [
            "/get_server_info",
            "/get_model_info",
        ]
        assert not [c for c in fleet.engines[1].calls if c.path.startswith(("/get_", "/health_generate"))]
        # The engine's own refusal is relayed (SMG asks its first worker whatever it is).
        first.set_knobs(force_status=503, force_body="{}")
        assert (await gw.client.get("/health_generate")).status_code == 503
        assert (await gw.client.post("/get_server_info")).status_code == 405


async def test_no_worker_is_smgs_503_and_no_key_is_needed():
    # Keys on both planes: these routes still need none (SMG answered them without a key).
    cfg = Config(control_plane_keys=(ControlPlaneKey.parse(KEYS[0]),), api_key="data-secret")
    async with gateway_in_process(cfg) as gw:
        r = await gw.client.get("/get_model_info")
        assert r.status_code == 503 and r.headers["x-smg-error-code"] == "no_workers"
        assert r.json() == json.loads(
            '{"error":{"type":"server_error","code":"no_workers","message":"No workers are available","param":null}}'
        )


ENGINE_KEY = "engine-SECRET-worker-key"
# SGLang 0.5.23's /get_server_info is its ServerArgs as launched (dataclasses.asdict): the keys
# in clear (sgl-project/sglang#30166, #37457), the command line too.
LEAKY_INFO = {
    "model_path": "/m",
    "api_key": ENGINE_KEY,
    "admin_api_key": "engine-ADMIN-key",
    "ssl_keyfile_password": "tls-PASS",
    "launch_command": f"python -m sglang.launch_server --api-key {ENGINE_KEY} --port 1",
    "internal_states": [{"api_key": ENGINE_KEY, "weight_version": "v1"}],
    "max_total_num_tokens": 500000,
    "tokenizer_path": None,
}


async def test_an_engines_keys_never_reach_an_anonymous_caller():
    # These routes need no key (as SMG): an engine's own keys in its answer must not be relayed.
    async with (
        fake_fleet("sglang", 1, api_key=ENGINE_KEY) as fleet,
        gateway_in_process(rl_cfg(), worker_urls=fleet.urls, api_key=ENGINE_KEY) as gw,
    ):
        fleet.engines[0].set_knobs(force_status=200, force_body=json.dumps(LEAKY_INFO))
        r = await gw.client.get("/get_server_info")
        assert r.status_code == 200
        for secret in (ENGINE_KEY, "engine-ADMIN-key", "tls-PASS"):
            assert secret not in r.text
        doc = r.json()
        # The fields stay (a key is configured), their values do not; the rest is untouched.
        assert doc["api_key"] == doc["admin_api_key"] == doc["ssl_keyfile_password"] == "***"
        assert doc["internal_states"] == [{"api_key": "***", "weight_version": "v1"}]
        assert doc["launch_command"] == "python -m sglang.launch_server --api-key *** --port 1"
        assert doc["max_total_num_tokens"] == 500000 and doc["tokenizer_path"] is None
        # Not JSON: the worker's key is still cut out of the relayed text.
        fleet.engines[0].set_knobs(force_body=f"key={ENGINE_KEY};")
        r = await gw.client.get("/get_model_info")
        assert r.status_code == 200 and r.text == "key=***;"


async def test_an_engines_keys_never_reach_the_journal_from_a_control_read():
    # GET .../engine/server_info is journaled (an excerpt of the answer in control.outcome), and
    # the journal is readable with a `user` key: the engine's keys must not be in it.
    async with (
        fake_fleet("sglang", 1, api_key=ENGINE_KEY) as fleet,
        gateway_in_process(rl_cfg(), worker_urls=fleet.urls, api_key=ENGINE_KEY) as gw,
    ):
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        fleet.engines[0].set_knobs(force_status=200, force_body=json.dumps(LEAKY_INFO))
        auth = {"authorization": f"Bearer {ENGINE_KEY}"}
        r = await gw.client.get(f"/v1/rl/workers/{wid}/engine/server_info", headers=auth)
        assert r.status_code == 200, r.text
        (outcome,) = [rec.event for rec in gw.store.read(types=["control.outcome"])]
        assert outcome.excerpt and "model_path" in outcome.excerpt
        for secret in (ENGINE_KEY, "engine-ADMIN-key", "tls-PASS"):
            assert secret not in outcome.excerpt

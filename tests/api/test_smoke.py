from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process


async def test_discovery_lists_fake_workers(rl_config):
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_config, worker_urls=fleet.urls) as gw:
        r = await gw.client.get("/v1/rl/workers")
        assert r.status_code == 200
        body = r.json()
        assert body["total"] == 2 and {w["engine"] for w in body["workers"]} == {"sglang"}

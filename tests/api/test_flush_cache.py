"""SMG's gateway-level POST /flush_cache: every engine flushed, SMG 1.13.0's summary, and (smgrl)
a journaled fan-out."""

from rl_api_helpers import rl_cfg

from smgrl.core.auth import ControlPlaneKey
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process


async def test_every_engine_is_flushed_and_the_fanout_is_journaled():
    async with fake_fleet("sglang", 3) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        r = await gw.client.post("/flush_cache")
        assert r.status_code == 200
        assert r.json() == {
            "status": "success",
            "message": "Successfully flushed cache on all 3 workers",
            "workers_flushed": 3,
            "total_http_workers": 3,
            "total_grpc_workers": 0,
            "total_zmq_workers_skipped": 0,
            "total_workers": 3,
        }
        for engine in fleet.engines:
            assert [c.method for c in engine.calls if c.path == "/flush_cache"] == ["POST"]
        op = (await gw.client.get(f"/v1/rl/operations/{r.headers['x-smgrl-operation-id']}")).json()
        assert op["total"] == 3 and op["succeeded"] == 3
        # One engine refuses: 206, SMG's partial shape.
        fleet.engines[1].set_knobs(force_status=400, force_body="busy")
        r = await gw.client.post("/flush_cache")
        assert r.status_code == 206
        body = r.json()
        assert (body["status"], body["workers_flushed"], body["message"]) == (
            "partial_success",
            2,
            "Cache flush: 2 succeeded, 1 failed",
        )
        assert sorted(body["successful"]) == sorted([fleet.urls[0], fleet.urls[2]])
        assert body["failed"] == [{"worker": fleet.urls[1], "error": "HTTP 400"}]
        assert (await gw.client.get("/flush_cache")).status_code == 405


async def test_no_worker_and_the_admin_role():
    keys = (
        ControlPlaneKey.parse("adm:Admin:admin:admin-secret"),
        ControlPlaneKey.parse("usr:User:user:user-secret"),
    )
    async with gateway_in_process(rl_cfg(control_plane_keys=keys)) as gw:
        user = await gw.client.post("/flush_cache", headers={"authorization": "Bearer user-secret"})
        assert user.status_code == 403 and user.text == "Admin role required for this control plane operation"
        r = await gw.client.post("/flush_cache", headers={"authorization": "Bearer admin-secret"})
        assert r.status_code == 200 and r.json()["message"] == "No workers available for cache flush"
        assert r.json()["total_workers"] == 0

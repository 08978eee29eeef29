"""gRPC/ZMQ workers behind their control endpoint: TokenSpeed (docs/tokenspeed.md; SMG's
``rl_adapter.rs`` cases, ``rl_tokenspeed_control_endpoint_test.rs`` and the TokenSpeed e2e cases).

A TokenSpeed engine serves rollouts over gRPC, so its registry URL (``grpc://...``) takes no HTTP
control calls; its in-engine RL control app does, at the URL in the worker's ``rl.control_url``
label. The fakes here are that control app (with the sidecar's discovery routes merged in); the
``grpc://`` data URLs point at nothing, which also proves that no control call goes there.
"""

from __future__ import annotations

import contextlib
import json

import attrs
import trio
from rl_api_helpers import (
    ADMIN,
    KEYS,
    MS,
    RawEngine,
    assert_json,
    journal,
    op_events,
    rl_cfg,
    rl_error,
    sent_headers,
)

from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

TS_KEY = "ts-secret"
OP_HEADERS = {"content-type", "content-length", "x-request-id", "x-smgrl-operation-id"}
NO_LABEL = (
    "no `rl.control_url` label: set it at registration or through the worker update route "
    "(a TokenSpeed gRPC engine advertises it when launched with a routable --rl-control-host)"
)
ADVERTISED_CAPS = {
    "source": "label",
    "pause_modes": ["wait", "abort", "keep"],
    "update_from": ["distributed"],
    "abort": True,
    "flush_cache": True,
    "sleep_wake": True,
    "reports_weight_version": True,
}
STATIC_TS_CAPS = {**ADVERTISED_CAPS, "source": "static", "pause_modes": ["wait", "abort"]}
DISK_REFUSED = (
    "update_weights_from_disk is not implemented by this build's scheduler; supported sources: distributed"
)


def no_endpoint(wid: str, url: str, mode: str = "grpc") -> dict:
    return rl_error(
        "no_control_endpoint",
        f"worker `{wid}` has no control endpoint ({mode}): {NO_LABEL}",
        worker_id=wid,
        url=url,
        connection_mode=mode,
    )


async def post_worker(gw, url: str, **spec) -> str:
    r = await gw.client.post("/workers", json={"url": url, **spec}, headers=ADMIN)
    assert r.status_code == 202, r.text
    return r.json()["worker_id"]


async def row(gw, wid: str) -> dict:
    r = await gw.client.get(f"/v1/rl/workers/{wid}", headers=ADMIN)
    assert r.status_code == 200, r.text
    return r.json()


@attrs.frozen
class Mixed:
    """SMG's fixture: one advertising TokenSpeed, one silent TokenSpeed, one SGLang HTTP worker."""

    gw: object
    advertising: object  # the fake control app of the advertising engine
    silent: object  # the silent engine's control app (never registered as its endpoint)
    sglang: object
    ts: str  # worker ids
    quiet: str
    sg: str


@contextlib.asynccontextmanager
async def mixed_fleet(**cfg):
    async with (
        fake_fleet("tokenspeed", 2, api_key=TS_KEY) as ts,
        fake_fleet("sglang", 1) as sg,
        gateway_in_process(rl_cfg(control_plane_keys=KEYS, **cfg)) as gw,
    ):
        # A wildcard bind advertised as-is: the worker's own host stands in for it.
        ts_id = await post_worker(
            gw,
            "grpc://127.0.0.1:30000",
            runtime="tokenspeed",
            api_key=TS_KEY,
            labels={"rl.control_url": f"http://0.0.0.0:{ts[0].port}/", "weight_version": "registered"},
        )
        quiet_id = await post_worker(gw, "grpc://127.0.0.1:30001", runtime="tokenspeed", api_key=TS_KEY)
        sg_id = await post_worker(gw, sg.urls[0])
        await gw.wait_visible(3)
        for engine in (*ts.engines, *sg.engines):
            engine.clear_calls()
        yield Mixed(gw, ts[0], ts[1], sg[0], ts_id, quiet_id, sg_id)


# -- discovery ---------------------------------------------------------------------------------


async def test_discovery_reports_the_advertised_endpoint_and_capabilities():
    async with mixed_fleet() as m:
        ts = await row(m.gw, m.ts)
        assert ts["url"] == ts["base_url"] == "grpc://127.0.0.1:30000"
        assert (ts["engine"], ts["connection_mode"]) == ("tokenspeed", "grpc")
        assert ts["control_url"] == m.advertising.url  # 0.0.0.0 -> the worker's host, port kept
        assert ts["capabilities"] == ADVERTISED_CAPS
        assert ts["weight_version"] == "registered"  # the registration label beats the engine's
        assert (ts["engine_version"], ts["tp_size"], ts["dp_size"], ts["health"]) == ("0.1.1", 1, 1, "ready")
        # Advertised rl.* labels become labels; the caller's rl.control_url wins over the engine's.
        assert ts["labels"]["rl.control_url"] == f"http://0.0.0.0:{m.advertising.port}/"
        assert ts["labels"]["rl.update_from"] == "distributed"
        assert ts["model_id"] == m.advertising.served_model_name

        quiet = await row(m.gw, m.quiet)
        assert (quiet["control_url"], quiet["engine"], quiet["connection_mode"]) == (
            None,
            "tokenspeed",
            "grpc",
        )
        assert quiet["capabilities"] == STATIC_TS_CAPS
        assert (quiet["labels"], quiet["tp_size"], quiet["weight_version"]) == ({}, None, None)

        sg = await row(m.gw, m.sg)
        assert sg["control_url"] == sg["base_url"] == m.sglang.url
        # Discovery asked the advertising control app only (with the worker key), nobody else.
        assert [c.path for c in m.silent.calls] == []


async def test_discovery_reads_the_control_app_with_the_worker_key():
    async with fake_fleet("tokenspeed", 1, api_key=TS_KEY) as ts, gateway_in_process(rl_cfg()) as gw:
        await post_worker(gw, "grpc://127.0.0.1:30000", api_key=TS_KEY, labels={"rl.control_url": ts.urls[0]})
        await gw.wait_visible(1)
        (probe,) = ts[0].calls
        assert (probe.method, probe.path) == ("GET", "/get_server_info")
        assert sent_headers(probe) == {"accept": "*/*", "authorization": f"Bearer {TS_KEY}"}
        # No runtime hint: the server info's tokenspeed_version tells the engine.
        (w,) = (await gw.client.get("/v1/rl/workers")).json()["workers"]
        assert w["engine"] == "tokenspeed" and w["capabilities"]["source"] == "label"


async def test_attn_tp_size_fills_tp_size_and_sizes_are_topology():
    async with fake_fleet("tokenspeed", 1, tp_size=2) as ts, gateway_in_process(rl_cfg()) as gw:
        wid = await post_worker(gw, "grpc://127.0.0.1:30000", labels={"rl.control_url": ts.urls[0]})
        await gw.wait_visible(1)
        w = await row(gw, wid)
        assert w["tp_size"] == 2 and "attn_tp_size" not in w["labels"]


async def test_in_engine_control_app_without_server_info_is_discovered_through_model_info():
    # The in-engine RL control app (--rl-control-port) has no /get_server_info (only the ts serve
    # sidecar does): discovery falls back to /model_info and keeps the static TokenSpeed row.
    app = RawEngine()
    app.PROBE = {"/model_info": json.dumps({"model_path": "/m/ts", "weight_version": "5"}).encode()}
    app.answer(404, b'{"detail":"Not Found"}', "application/json")
    async with trio.open_nursery() as nursery:
        await nursery.start(app.serve)
        async with gateway_in_process(rl_cfg()) as gw:
            wid = await post_worker(
                gw, "grpc://127.0.0.1:30000", runtime="tokenspeed", labels={"rl.control_url": app.url}
            )
            await gw.wait_visible(1)
            w = await row(gw, wid)
            assert (w["model_id"], w["weight_version"], w["control_url"]) == ("/m/ts", "5", app.url)
            assert w["capabilities"] == STATIC_TS_CAPS
            assert app.targets == ["GET /get_server_info", "GET /server_info"]
        nursery.cancel_scope.cancel()


async def test_a_control_app_that_is_not_up_yet_keeps_the_worker_pending():
    async with (
        fake_fleet("tokenspeed", 1) as ts,
        gateway_in_process(rl_cfg(registration_backoff_initial_secs=0.01)) as gw,
    ):
        engine = ts[0]
        engine.go_down(None)
        wid = await post_worker(gw, "grpc://127.0.0.1:30000", labels={"rl.control_url": engine.url})
        with trio.fail_after(10):
            while not journal(gw, "worker.probe_failed"):
                await trio.sleep(0.005)
        assert (await gw.client.get(f"/v1/rl/workers/{wid}")).status_code == 404  # pending: invisible
        engine.come_up()
        await gw.wait_visible(1)
        assert (await row(gw, wid))["engine"] == "tokenspeed"


async def test_worker_urls_without_a_label_register_grpc_and_zmq_workers_without_an_endpoint():
    urls = ["grpc://127.0.0.1:30000", "grpcs://127.0.0.1:30001", "ipc://127.0.0.1:30002"]
    async with gateway_in_process(rl_cfg(), worker_urls=urls) as gw:
        rows = (await gw.client.get("/v1/rl/workers")).json()["workers"]
        got = [(w["url"], w["connection_mode"], w["engine"], w["control_url"], w["health"]) for w in rows]
        assert got == [
            ("grpc://127.0.0.1:30000", "grpc", "unknown", None, "ready"),
            ("grpcs://127.0.0.1:30001", "grpc", "unknown", None, "ready"),
            ("ipc://127.0.0.1:30002", "zmq", "unknown", None, "ready"),
        ]
        zmq = rows[2]
        r = await gw.client.post(f"/v1/rl/workers/{zmq['id']}/engine/flush_cache")
        assert_json(r, 422, no_endpoint(zmq["id"], zmq["url"], "zmq"), OP_HEADERS)


async def test_setting_the_label_later_discovers_through_the_new_endpoint():
    async with fake_fleet("tokenspeed", 1) as ts, gateway_in_process(rl_cfg()) as gw:
        (wid,) = await gw.register(["grpc://127.0.0.1:30000"])
        assert (await row(gw, wid))["control_url"] is None
        r = await gw.client.patch(f"/workers/{wid}", json={"labels": {"rl.control_url": ts.urls[0]}})
        assert r.status_code == 202
        with trio.fail_after(10):
            while (await row(gw, wid))["engine"] != "tokenspeed":
                await trio.sleep(0.005)
        w = await row(gw, wid)
        assert w["control_url"] == ts.urls[0] and w["capabilities"] == ADVERTISED_CAPS
        r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/pause_generation", json={})
        assert r.status_code == 200 and r.json()["body"]["mode"] == "wait"


async def test_http_worker_controls_itself_and_ignores_the_label():
    async with fake_fleet("sglang", 2) as sg, gateway_in_process(rl_cfg()) as gw:
        wid = await post_worker(gw, sg.urls[0], labels={"rl.control_url": sg.urls[1]})
        await gw.wait_visible(1)
        assert (await row(gw, wid))["control_url"] == sg.urls[0]
        sg[0].clear_calls()
        r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache")
        assert r.status_code == 200
        assert [c.path for c in sg[0].calls] == ["/flush_cache"]
        assert not sg[1].calls


# -- calls through the control endpoint --------------------------------------------------------


async def test_proxy_reaches_the_control_endpoint_with_the_worker_bearer():
    async with mixed_fleet() as m:
        body = b'{"mode":"abort"}'
        r = await m.gw.client.post(
            f"/v1/rl/workers/{m.ts}/engine/pause_generation?selector=x&a=1",
            content=body,
            headers={
                **ADMIN,
                "content-type": "application/json",
                "x-request-id": "rid-7",
                "cookie": "c=1",
                "x-smg-routing-key": "k",
            },
        )
        expected = {
            "worker_id": m.ts,
            "url": "grpc://127.0.0.1:30000",
            "status": 200,
            "latency_ms": MS,
            "body": {"success": True, "message": "Paused generation.", "mode": "abort"},
        }
        assert_json(r, 200, expected, OP_HEADERS)
        (call,) = m.advertising.calls
        assert (call.method, call.path, call.query, call.body) == ("POST", "/pause_generation", "a=1", body)
        # The worker's key as bearer; of the caller's headers only the request id and trace context.
        assert sent_headers(call) == {
            "accept": "*/*",
            "content-type": "application/json",
            "content-length": "16",
            "x-request-id": "rid-7",
            "authorization": f"Bearer {TS_KEY}",
        }
        assert m.advertising.paused == "abort"


async def test_single_worker_proxy_model_info_reports_the_weight_version():
    async with mixed_fleet() as m:
        r = await m.gw.client.get(f"/v1/rl/workers/{m.ts}/engine/model_info", headers=ADMIN)
        assert r.status_code == 200
        assert r.json()["body"] == {"model_path": m.advertising.model_path, "weight_version": "default"}


async def test_a_worker_without_an_endpoint_is_422_and_its_engine_untouched():
    async with mixed_fleet() as m:
        for method in ("GET", "POST", "HEAD"):
            r = await m.gw.client.request(
                method, f"/v1/rl/workers/{m.quiet}/engine/flush_cache", headers=ADMIN
            )
            if method == "HEAD":
                assert r.status_code == 422 and r.content == b""
            else:
                assert_json(r, 422, no_endpoint(m.quiet, "grpc://127.0.0.1:30001"), OP_HEADERS)
        # A blank label is no label.
        await m.gw.client.patch(
            f"/workers/{m.quiet}", json={"labels": {"rl.control_url": " \t"}}, headers=ADMIN
        )
        r = await m.gw.client.post(f"/v1/rl/workers/{m.quiet}/engine/flush_cache", headers=ADMIN)
        assert_json(r, 422, no_endpoint(m.quiet, "grpc://127.0.0.1:30001"), OP_HEADERS)
        assert (await row(m.gw, m.quiet))["control_url"] is None
        assert not m.silent.calls


async def test_fanout_over_workers_with_endpoints_is_200_and_hits_each_once():
    async with mixed_fleet() as m:
        r = await m.gw.client.post(
            f"/v1/rl/engine/flush_cache?selector=id in ({m.ts},{m.sg})", json={}, headers=ADMIN
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["total"], body["succeeded"], body["failed"]) == (2, 2, [])
        assert sorted(body["results"]) == sorted([m.ts, m.sg])
        assert body["results"][m.ts]["body"] == {"success": True, "message": "Cache flushed."}
        assert [c.path for c in m.advertising.calls] == ["/flush_cache"]
        assert [c.path for c in m.sglang.calls] == ["/flush_cache"]
        assert m.advertising.calls[0].body == b"{}" and m.advertising.calls[0].query == ""


async def test_fanout_names_the_worker_without_an_endpoint():
    async with mixed_fleet() as m:
        r = await m.gw.client.post(
            "/v1/rl/engine/pause_generation?selector=worker_type=regular", json={}, headers=ADMIN
        )
        assert r.status_code == 207, r.text
        body = r.json()
        assert (body["total"], body["succeeded"]) == (3, 2)
        assert sorted(body["results"]) == sorted([m.ts, m.sg])
        assert body["failed"] == [{**no_endpoint(m.quiet, "grpc://127.0.0.1:30001"), "worker_id": m.quiet}]
        assert body["failed"][0]["connection_mode"] == "grpc"
        assert not m.silent.calls
        # A control-call failure is not a health signal.
        assert (await row(m.gw, m.quiet))["health"] == "ready"
        await m.gw.client.post(
            "/v1/rl/engine/continue_generation?selector=worker_type=regular", json={}, headers=ADMIN
        )


async def test_disk_refit_is_refused_per_worker_and_the_engine_keeps_serving():
    async with mixed_fleet() as m:
        sel = "?selector=engine=tokenspeed,connection_mode=grpc"
        refit = {"model_path": "/ckpt/step-1", "weight_version": "1", "flush_cache": True}
        paused = await m.gw.client.post(f"/v1/rl/engine/pause_generation{sel}", json={}, headers=ADMIN)
        assert paused.status_code == 207  # the silent worker has no endpoint
        r = await m.gw.client.post(f"/v1/rl/engine/update_weights_from_disk{sel}", json=refit, headers=ADMIN)
        assert r.status_code == 207
        body = r.json()
        assert (body["total"], body["succeeded"]) == (2, 0)
        refused = next(f for f in body["failed"] if f["worker_id"] == m.ts)
        assert refused == {
            "worker_id": m.ts,
            "url": "grpc://127.0.0.1:30000",
            "error": "upstream_error",
            "message": "HTTP 501",
            "status": 501,
        }
        outcome = body["results"][m.ts]
        assert outcome["status"] == 501
        assert outcome["body"] == {"success": False, "message": DISK_REFUSED}
        assert "distributed" in outcome["body"]["message"]
        # Refused before the body was read, weights untouched; the engine resumes and serves.
        digest = m.advertising.weights_digest
        resumed = await m.gw.client.post(
            f"/v1/rl/workers/{m.ts}/engine/continue_generation", json={}, headers=ADMIN
        )
        assert resumed.status_code == 200
        gen = await m.gw.client.post(
            f"/v1/rl/workers/{m.ts}/engine/generate",
            headers=ADMIN,
            json={"text": "Hi", "sampling_params": {"max_new_tokens": 2}},
        )
        assert gen.status_code == 200 and gen.json()["body"]["meta_info"]["weight_version"] == "default"
        assert m.advertising.weights_digest == digest and m.advertising.weight_version == "default"
        assert (await row(m.gw, m.ts))["weight_version"] == "registered"


async def test_pause_continue_and_distributed_refit_through_the_control_endpoint():
    async with mixed_fleet() as m:
        sel = f"?selector=id={m.ts}"
        group = {
            "master_address": "127.0.0.1",
            "master_port": 29999,
            "rank_offset": 1,
            "world_size": 2,
            "group_name": "g",
            "backend": "gloo",
        }
        update = {
            "names": ["w"],
            "dtypes": ["float32"],
            "shapes": [[2]],
            "group_name": "g",
            "weight_version": "7",
        }
        for path, payload in [
            ("pause_generation", {}),
            ("init_weights_update_group", group),
            ("update_weights_from_distributed", update),
            ("destroy_weights_update_group", {"group_name": "g"}),
            ("continue_generation", {}),
        ]:
            r = await m.gw.client.post(f"/v1/rl/engine/{path}{sel}", json=payload, headers=ADMIN)
            assert r.status_code == 200, (path, r.text)
        assert m.advertising.weight_version == "7" and m.advertising.paused is None
        assert m.advertising.transfers.updates[0]["names"] == ["w"]
        w = await row(m.gw, m.ts)
        assert (w["weight_version"], w["version_source"], w["control"]) == ("7", "passthrough", "active")


async def test_zmq_worker_with_a_label_is_controlled_through_it():
    async with fake_fleet("tokenspeed", 1) as ts, gateway_in_process(rl_cfg()) as gw:
        wid = await post_worker(
            gw, "ipc://127.0.0.1:30002", runtime="tokenspeed", labels={"rl.control_url": ts.urls[0]}
        )
        await gw.wait_visible(1)
        w = await row(gw, wid)
        assert (w["connection_mode"], w["control_url"], w["engine"]) == ("zmq", ts.urls[0], "tokenspeed")
        r = await gw.client.post("/v1/rl/engine/flush_cache?selector=connection_mode=zmq", json={})
        assert r.status_code == 200 and r.json()["succeeded"] == 1


async def test_an_unusable_control_url_keeps_the_worker_pending_and_names_the_error():
    async with gateway_in_process(rl_cfg()) as gw:
        wid = await post_worker(gw, "grpc://127.0.0.1:30000", labels={"rl.control_url": "ftp://127.0.0.1:1"})
        with trio.fail_after(10):
            while not journal(gw, "worker.probe_failed"):
                await trio.sleep(0.005)
        (failed, *_) = journal(gw, "worker.probe_failed")
        assert "ftp://127.0.0.1:1" in failed.error  # the probe names the bad URL
        assert (await gw.client.get(f"/v1/rl/workers/{wid}")).status_code == 404


async def test_control_timeout_applies_to_control_endpoints():
    async with fake_fleet("tokenspeed", 1) as ts, gateway_in_process(rl_cfg(timeout=1)) as gw:
        wid = await post_worker(gw, "grpc://127.0.0.1:30000", labels={"rl.control_url": ts.urls[0]})
        await gw.wait_visible(1)
        ts[0].set_knobs(hang=True)
        r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache")
        assert_json(
            r,
            504,
            rl_error(
                "upstream_timeout",
                "upstream `grpc://127.0.0.1:30000` timed out after 1s",
                worker_id=wid,
                url="grpc://127.0.0.1:30000",
            ),
            OP_HEADERS,
        )
        ts[0].set_knobs(hang=False)
        ts[0].go_down(None)
        r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache")
        message = (
            f"upstream `grpc://127.0.0.1:30000` unreachable: error sending request for url "
            f"({ts.urls[0]}/flush_cache)"
        )
        assert_json(
            r,
            502,
            rl_error("upstream_unreachable", message, worker_id=wid, url="grpc://127.0.0.1:30000"),
            OP_HEADERS,
        )


# -- the control client cache ------------------------------------------------------------------


async def test_workers_sharing_a_control_origin_share_one_pool_and_removal_releases_it():
    async with fake_fleet("tokenspeed", 1) as ts, gateway_in_process(rl_cfg()) as gw:
        a = await post_worker(gw, "grpc://127.0.0.1:30000", labels={"rl.control_url": ts.urls[0]})
        b = await post_worker(gw, "grpc://127.0.0.1:30001", labels={"rl.control_url": f"{ts.urls[0]}/"})
        await gw.wait_visible(2)
        pools = gw.gateway.pools
        pool = pools.get(ts.urls[0])
        opened = pool.connections_opened  # by the two discovery probes
        for wid in (a, b, a):
            assert (await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache")).status_code == 200
        assert pool.connections_opened == opened  # one keep-alive client serves both workers
        assert len(pools) == 1
        assert (await gw.client.delete(f"/workers/{a}")).status_code == 202
        assert ts.urls[0] in pools  # still used by b
        assert (await gw.client.delete(f"/workers/{b}")).status_code == 202
        assert ts.urls[0] not in pools


# -- journal -----------------------------------------------------------------------------------


async def test_the_control_url_used_is_part_of_every_recorded_call():
    async with mixed_fleet() as m:
        r = await m.gw.client.post(
            "/v1/rl/engine/flush_cache?selector=worker_type=regular", json={}, headers=ADMIN
        )
        started, *outcomes, finished = op_events(m.gw, r.headers["x-smgrl-operation-id"])
        targets = {t["worker_id"]: t["control_url"] for t in started.targets}
        assert targets == {m.ts: m.advertising.url, m.quiet: None, m.sg: m.sglang.url}
        got = {o.worker_id: (o.control_url, o.status, o.error) for o in outcomes}
        assert got == {
            m.ts: (m.advertising.url, 200, None),
            m.quiet: (None, None, "no_control_endpoint"),
            m.sg: (m.sglang.url, 200, None),
        }
        assert (finished.result, finished.http_status) == ("partial", 207)
        one = await m.gw.client.post(f"/v1/rl/workers/{m.ts}/engine/flush_cache", headers=ADMIN)
        started, outcome, _ = op_events(m.gw, one.headers["x-smgrl-operation-id"])
        assert started.targets == (
            {"worker_id": m.ts, "url": "grpc://127.0.0.1:30000", "control_url": m.advertising.url},
        )
        assert outcome.control_url == m.advertising.url


async def test_a_tokenspeed_refit_groups_into_one_cycle_like_an_sglang_one():
    from smgrl.events import encode
    from smgrl.state.refits import OpsFold, group_cycles

    async with mixed_fleet() as m:
        c = m.gw.client
        sel = f"?selector=id in ({m.ts},{m.sg})"
        group = {"master_address": "127.0.0.1", "master_port": 29999, "world_size": 3, "group_name": "g"}
        chunks = [
            {"names": ["a"], "dtypes": ["float32"], "shapes": [[1]], "group_name": "g"},
            {
                "names": ["b"],
                "dtypes": ["float32"],
                "shapes": [[1]],
                "group_name": "g",
                "weight_version": "v1",
            },
        ]
        steps = [("fanout", "pause_generation", {}),
                 ("call", m.ts, "init_weights_update_group", {**group, "rank_offset": 1}),
                 ("call", m.sg, "init_weights_update_group", {**group, "rank_offset": 2}),
                 ("one", f"?selector=id={m.sg}", "begin_weight_update", {}),
                 *[("fanout", "update_weights_from_distributed", chunk) for chunk in chunks],
                 ("one", f"?selector=id={m.sg}", "end_weight_update", {}),
                 ("fanout", "destroy_weights_update_group", {"group_name": "g"}),
                 ("fanout", "continue_generation", {})]  # fmt: skip
        for kind, *rest in steps:
            if kind == "call":
                wid, path, body = rest
                r = await c.post(f"/v1/rl/workers/{wid}/engine/{path}", json=body, headers=ADMIN)
            else:
                query, path, body = (sel, *rest) if kind == "fanout" else rest
                r = await c.post(f"/v1/rl/engine/{path}{query}", json=body, headers=ADMIN)
            assert r.status_code == 200, (path, r.text)
        fold = OpsFold()
        for rec in m.gw.store.read(types=["control.started", "control.outcome", "control.finished"]):
            type_, _, payload = encode(rec.event)
            fold.apply(rec.seq, rec.ts, type_, json.loads(payload))
        (cycle,) = group_cycles(fold.in_order())
        assert (cycle.status, cycle.paused, cycle.version) == ("ok", True, "v1")
        assert set(cycle.engines) == {"grpc://127.0.0.1:30000", m.sglang.url}
        assert list(cycle.phases()) == ["pause", "setup", "update", "teardown", "resume"]
        assert len(cycle.ops) == len(steps)

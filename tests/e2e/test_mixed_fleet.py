"""A mixed fleet of real processes, 2 SGLang (HTTP) + 2 TokenSpeed (gRPC, controlled through
``rl.control_url``), refit end to end with ``smgrl.rl``: one API for both kinds of engine."""

from __future__ import annotations

import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from smgrl.demo.procs import wait_for_workers
from smgrl.rl import RL, paused

TS_KEY = "ts-secret"


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def test_mixed_fleet_refits_end_to_end(fakes, gateway):
    sg_urls = fakes("sglang", 2)
    ts_urls = fakes("tokenspeed", 2, "--api-key", TS_KEY)
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *sg_urls)
    for i, url in enumerate(ts_urls):
        # One label as the engine would advertise a wildcard bind, one concrete.
        host = "0.0.0.0" if i == 0 else "127.0.0.1"
        spec = {
            "url": f"grpc://127.0.0.1:{40000 + i}",
            "runtime": "tokenspeed",
            "api_key": TS_KEY,
            "labels": {"rl.control_url": f"http://{host}:{url.rsplit(':', 1)[1]}"},
        }
        assert http.request("POST", "/workers", spec)[0] == 202
    wait_for_workers(http.base, 4, child=gw)

    rl = RL(http.base, timeout=60)
    workers = rl.workers()
    by_engine = {e: [w for w in workers if w.engine == e] for e in ("sglang", "tokenspeed")}
    assert [len(v) for v in by_engine.values()] == [2, 2]
    for w in by_engine["tokenspeed"]:
        assert (w.connection_mode, w.capabilities["source"]) == ("grpc", "label")
        assert w.control_url in ts_urls and w.tp_size == 1
    for w in by_engine["sglang"]:
        assert (w.connection_mode, w.control_url) == ("http", w.base_url)

    # The trainer-driven refit, every call through the gateway.
    everyone = "health=ready"
    sessions = "engine=sglang"
    names, dtypes, shapes = ["w.0", "w.1", "w.2"], ["float32", "bfloat16", "float32"], [[4], [2, 2], [3]]
    with paused(rl, everyone) as pause:
        assert (pause.total, pause.succeeded) == (4, 4)
        ts_ids = [w.id for w in by_engine["tokenspeed"]]
        assert [pause.results[i].body["mode"] for i in ts_ids] == ["wait", "wait"]  # its default pause mode
        group = {
            "master_address": "127.0.0.1",
            "master_port": 29500,
            "world_size": 5,
            "group_name": "g",
            "backend": "gloo",
        }
        with ThreadPoolExecutor(4) as pool:
            inits = list(
                pool.map(
                    lambda iw: rl.call(
                        iw[1].id, "init_weights_update_group", {**group, "rank_offset": iw[0] + 1}
                    ),
                    enumerate(workers),
                )
            )
        assert [r.status for r in inits] == [200] * 4
        rl.fanout("begin_weight_update", {}, selector=sessions)
        for chunk in ([0, 1], [2]):
            last = chunk == [2]
            body = {
                "names": [names[i] for i in chunk],
                "dtypes": [dtypes[i] for i in chunk],
                "shapes": [shapes[i] for i in chunk],
                "group_name": "g",
                "flush_cache": last,
            }
            if last:
                body["weight_version"] = "v2"
            result = rl.fanout("update_weights_from_distributed", body, selector=everyone)
            assert (result.total, result.succeeded) == (4, 4)
        rl.fanout("end_weight_update", {}, selector=sessions)
        rl.fanout("destroy_weights_update_group", {"group_name": "g"}, selector=everyone)

    after = {w.id: w for w in rl.workers()}
    assert {w.weight_version for w in after.values()} == {"v2"}
    assert {w.extra.get("control") for w in after.values()} == {"active"}
    for url in [*sg_urls, *ts_urls]:
        state = get(url + "/_fake/state")
        assert (state["weight_version"], state["paused"], state["groups"]) == ("v2", None, [])
    for w in workers:
        gen = rl.call(w.id, "generate", {"text": "Hi", "sampling_params": {"max_new_tokens": 2}})
        assert gen.status == 200 and gen.body["meta_info"]["weight_version"] == "v2"

    # A disk refit is SGLang-only: every TokenSpeed engine refuses it (501), and keeps serving.
    refused = rl.fanout(
        "update_weights_from_disk",
        {"model_path": "/nope", "weight_version": "v3"},
        selector="engine=tokenspeed",
        allow_partial=True,
    )
    assert (refused.total, refused.succeeded) == (2, 0)
    assert {(f.error, f.status) for f in refused.failed} == {("upstream_error", 501)}
    assert all("distributed" in o.body["message"] for o in refused.results.values())
    assert rl.fanout("continue_generation", {}, selector="engine=tokenspeed").succeeded == 2

    # A gRPC worker registered without a control endpoint is named in the fan-out, not skipped.
    assert (
        http.request("POST", "/workers", {"url": "grpc://127.0.0.1:40009", "runtime": "tokenspeed"})[0] == 202
    )
    wait_for_workers(http.base, 5, child=gw)
    partial = rl.fanout("flush_cache", {}, selector="engine=tokenspeed", allow_partial=True)
    assert (partial.total, partial.succeeded) == (3, 2)
    (failure,) = partial.failed
    assert (failure.error, failure.connection_mode, failure.url) == (
        "no_control_endpoint",
        "grpc",
        "grpc://127.0.0.1:40009",
    )

    # The journal has the control URL of every call it recorded.
    events = http.request("GET", "/v1/rl/journal?limit=1000")[2]["events"]
    ts_ids = {w.id: w.control_url for w in by_engine["tokenspeed"]}
    outcomes = [
        e["payload"] for e in events if e["type"] == "control.outcome" and e["payload"]["worker_id"] in ts_ids
    ]
    assert outcomes and all(o["control_url"] == ts_ids[o["worker_id"]] for o in outcomes)
    started = [e["payload"] for e in events if e["type"] == "control.started"]
    targets = [t for s in started for t in s["targets"] if t["worker_id"] in ts_ids]
    assert targets and all(t["control_url"] == ts_ids[t["worker_id"]] for t in targets)

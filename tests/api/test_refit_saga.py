"""Refit sagas through the gateway (POST /v1/rl/refits; docs/refits.md), against fake engines."""

from __future__ import annotations

import json

import attrs
import pytest
import trio
import trio.testing
from rl_api_helpers import ADMIN, KEYS, USER, journal, rl_cfg

from smgrl.fake import fake_fleet
from smgrl.fake.checkpoint import make_checkpoint
from smgrl.fake.transfer import declared_checksum
from smgrl.testing import gateway_in_process

GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}


async def wait_done(gw, refit_id: str, timeout: float = 20.0) -> dict:
    with trio.fail_after(timeout):
        while True:
            saga = gw.gateway.fleet.sagas.get(refit_id)
            if saga is not None and not saga.is_open:
                break
            await gw.gateway.refits.change_event().wait()
    r = await gw.client.get(f"/v1/rl/refits/{refit_id}")
    assert r.status_code == 200, r.text
    return r.json()


async def wait_state(gw, refit_id: str, state: str, timeout: float = 20.0) -> None:
    with trio.fail_after(timeout):
        while gw.gateway.fleet.sagas.get(refit_id).state != state:
            await gw.gateway.refits.change_event().wait()


async def refit(gw, headers=None, **body) -> tuple[int, dict]:
    body.setdefault("selector", "engine in (sglang,vllm,tokenspeed)")
    r = await gw.client.post("/v1/rl/refits", json=body, headers=headers or {})
    return r.status_code, r.json()


async def rows(gw) -> dict[str, dict]:
    return {w["id"]: w for w in (await gw.client.get("/v1/rl/workers")).json()["workers"]}


async def served_versions(gw, n: int) -> list[str]:
    out = []
    for _ in range(n):
        r = await gw.client.post("/generate", json=GEN)
        assert r.status_code == 200, r.text
        out.append(r.json()["meta_info"]["weight_version"])
    return out


@pytest.fixture
def ckpt(tmp_path):
    return str(make_checkpoint(tmp_path / "step-7", "fake/model", seed=7))


async def test_one_of_eight_fails_its_load_and_is_quarantined(ckpt):
    async with fake_fleet("sglang", 8) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        # Its weights changed although the load answered an error: unknown, so quarantined.
        fleet[3].set_knobs(fail_loads_after_swap=1)
        status, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="7")
        assert status == 202, body
        done = await wait_done(gw, body["refit_id"])
        bad = next(w for w in (await rows(gw)).values() if w["url"] == fleet[3].url)
        assert done["result"] == "quarantined" and done["quarantined"] == [bad["id"]]
        assert bad["quarantined"] is True and bad["quarantine"]["refit_id"] == body["refit_id"]
        assert "load failed" in bad["quarantine"]["reason"]
        # Never resumed: after the failed load only its version was read (no flush, no continue).
        paths = [c.path for c in fleet[3].calls]
        assert paths[paths.index("/update_weights_from_disk") + 1 :] == ["/model_info"]
        assert fleet[3].paused is not None
        for i, e in enumerate(fleet):
            if i != 3:
                assert e.weight_version == "7" and e.paused is None
        fleet.clear_calls()
        assert set(await served_versions(gw, 21)) == {"7"}
        assert fleet[3].calls_to("/generate") == []
        engines = {e["worker_id"]: e for e in done["engines"]}
        assert engines[bad["id"]]["status"] == "quarantined"
        assert {e["verification"] for i, e in engines.items() if i != bad["id"]} == {"verified"}


async def test_an_engine_that_refused_its_load_is_resumed_on_its_old_version_not_quarantined(ckpt):
    """A load the engine refused before touching its weights (SGLang answers ``success: false``;
    its version, read back, is still the old one) leaves it on its old weights: it is resumed on
    them, not quarantined, and the refit's answer names its refusal."""
    async with (
        fake_fleet("sglang", 3, weight_version="6") as fleet,
        gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw,
    ):
        fleet[1].set_knobs(fail_loads=1)
        status, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="7")
        assert status == 202, body
        done = await wait_done(gw, body["refit_id"])
        assert done["result"] == "partial" and done["quarantined"] == [], done
        row = next(w for w in (await rows(gw)).values() if w["url"] == fleet[1].url)
        engine = next(e for e in done["engines"] if e["url"] == fleet[1].url)
        assert engine["status"] == "refused" and engine["reported_version"] == "6", engine
        assert "load failed (fake knob fail_loads)" in engine["failure"], engine
        assert "resume" in engine["done"]
        assert not row.get("quarantined") and row["weight_version"] == "6"
        assert fleet[1].paused is None and fleet[1].weight_version == "6"
        assert {e.weight_version for i, e in enumerate(fleet) if i != 1} == {"7"}
        # Routable on its old version (the version policy then decides who gets what).
        assert row["version_status"] == "consistent" and row.get("control", "active") == "active", row
        assert all(not slot.held for slot in gw.gateway.dataplane.table().models.values())


async def test_a_load_refused_everywhere_fails_the_refit_and_the_fleet_serves_on(ckpt):
    """Every engine refused the load (a checkpoint none can read): the refit is ``failed``, no
    engine is quarantined or left paused, and rollouts go on at the old version at once."""
    async with (
        fake_fleet("sglang", 3, weight_version="6") as fleet,
        gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw,
    ):
        for e in fleet:
            e.set_knobs(fail_loads=1)
        _, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="7")
        done = await wait_done(gw, body["refit_id"])
        assert done["result"] == "failed" and done["quarantined"] == [], done
        assert {e["status"] for e in done["engines"]} == {"refused"}
        assert all("load failed" in e["failure"] for e in done["engines"]), done["engines"]
        assert all(e.paused is None and e.weight_version == "6" for e in fleet)
        assert {w["control"] for w in (await rows(gw)).values()} == {"active"}
        assert set(await served_versions(gw, 6)) == {"6"}
        ops = gw.gateway.fleet.operations
        load = next(
            op
            for op in (*ops.recent.values(), *ops.open.values())
            if op.path.endswith("update_weights_from_disk")
        )
        assert load.result == "failed", load  # not partial: it failed on every engine


async def test_a_checkpoint_path_missing_on_a_local_fleet_is_refused_before_any_pause(ckpt):
    """A typo in the checkpoint path is refused before anything is journaled or called when
    every engine runs on this host (so it reads the same filesystem)."""
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        fleet.clear_calls()
        status, body = await refit(gw, source={"disk": {"model_path": "/no/such/dir"}}, weight_version="7")
        assert status == 409 and body["error"] == "checkpoint_not_found", body
        assert "/no/such/dir" in body["message"]
        assert [c.path for e in fleet for c in e.calls if c.method == "POST"] == []
        assert gw.gateway.fleet.sagas.open == {} and not gw.gateway.fleet.sagas.recent


async def test_rollback_names_the_load_failure_it_rolled_back_from(ckpt):
    async with (
        fake_fleet("sglang", 2, weight_version="6") as fleet,
        gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw,
    ):
        fleet[0].set_knobs(fail_loads_after_swap=1)
        _, body = await refit(
            gw, source={"disk": {"model_path": ckpt}}, weight_version="7", on_failure="rollback"
        )
        done = await wait_done(gw, body["refit_id"])
        assert done["result"] == "rolled_back", done
        engine = next(e for e in done["engines"] if e["url"] == fleet[0].url)
        assert engine["status"] == "rolled_back" and "internal error after the load" in engine["failure"]


async def test_get_refits_lists_the_sagas_newest_first(ckpt, tmp_path):
    other = str(make_checkpoint(tmp_path / "b", "fake/model", seed=2))
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        ids = []
        for version, path in (("8", ckpt), ("9", other)):
            _, body = await refit(gw, source={"disk": {"model_path": path}}, weight_version=version)
            ids.append(body["refit_id"])
            await wait_done(gw, body["refit_id"])
        r = await gw.client.get("/v1/rl/refits")
        assert r.status_code == 200, r.text
        listed = r.json()["refits"]
        assert [x["refit_id"] for x in listed] == ids[::-1]
        assert listed[0]["state"] == "succeeded" and listed[0]["engines"] == {"resumed": 2}
        assert listed[0]["weight_version"] == "9" and "plan" not in listed[0]
        r = await gw.client.get("/v1/rl/refits?limit=1&state=succeeded")
        assert [x["refit_id"] for x in r.json()["refits"]] == ids[-1:]
        assert (await gw.client.get("/v1/rl/refits?state=failed")).json()["refits"] == []
        for bad in ("limit=0", "limit=x", "limit=100000", "state=nope", "other=1"):
            r = await gw.client.get(f"/v1/rl/refits?{bad}")
            assert r.status_code == 400 and r.json()["error"] == "invalid_query", (bad, r.text)
        r = await gw.client.put("/v1/rl/refits")
        assert r.status_code == 405 and r.headers["allow"] == "POST,GET,HEAD"


async def test_rollback_resumes_all_eight_on_the_old_version(ckpt):
    async with (
        fake_fleet("sglang", 8, weight_version="6") as fleet,
        gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw,
    ):
        fleet[5].set_knobs(fail_loads=1)
        status, body = await refit(
            gw, source={"disk": {"model_path": ckpt}}, weight_version="7", on_failure="rollback"
        )
        assert status == 202, body
        done = await wait_done(gw, body["refit_id"])
        assert done["result"] == "rolled_back", done
        assert all(e.paused is None for e in fleet)
        assert {e.weight_version for e in fleet} - {"6"} == set()
        assert set(await served_versions(gw, 16)) == {"6"}


async def test_abort_leaves_everything_paused(ckpt):
    async with fake_fleet("sglang", 3) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        fleet[0].set_knobs(fail_loads=1)
        _, body = await refit(
            gw, source={"disk": {"model_path": ckpt}}, weight_version="7", on_failure="abort"
        )
        done = await wait_done(gw, body["refit_id"])
        assert done["result"] == "aborted"
        assert all(e.paused is not None for e in fleet)
        assert {w["control"] for w in (await rows(gw)).values()} == {"paused"}


async def test_mixed_disk_refit_and_tokenspeed_refused(ckpt):
    async with (
        fake_fleet("sglang", 2) as sg,
        fake_fleet("vllm", 2) as vl,
        fake_fleet("tokenspeed", 1) as ts,
        gateway_in_process(rl_cfg(), worker_urls=sg.urls + vl.urls) as gw,
    ):
        vl.clear_calls()
        status, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="3")
        assert status == 202, body
        done = await wait_done(gw, body["refit_id"])
        assert done["result"] == "succeeded", done
        assert {e.weight_version for e in [*sg, *vl]} == {"3"}
        assert [c.path for c in vl[0].calls] == [
            "/pause",
            "/collective_rpc",
            "/update_weight_version",
            "/reset_prefix_cache",
            "/weight_info",
            "/resume",
        ]
        r = await gw.client.post(
            "/workers",
            json={
                "url": "grpc://127.0.0.1:30001",
                "runtime": "tokenspeed",
                "labels": {"rl.control_url": ts.urls[0]},
            },
        )
        assert r.status_code == 202
        ts_id = r.json()["worker_id"]
        await gw.wait_visible(5)
        sg[0].clear_calls()
        status, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="4")
        assert status == 409 and body["error"] == "refit_unsupported", body
        assert [e["worker_id"] for e in body["engines"]] == [ts_id]
        assert ts_id in body["message"]
        assert list(sg[0].calls) == [] and len(journal(gw, "refit.started")) == 1


async def test_distributed_refit_of_a_mixed_fleet_through_commit():
    async with (
        fake_fleet("sglang", 1) as sg,
        fake_fleet("vllm", 1, weight_transfer_backend="gloo") as vl,
        fake_fleet("tokenspeed", 1) as ts,
        gateway_in_process(rl_cfg(), worker_urls=sg.urls + vl.urls) as gw,
    ):
        r = await gw.client.post(
            "/workers",
            json={
                "url": "grpc://127.0.0.1:30001",
                "runtime": "tokenspeed",
                "labels": {"rl.control_url": ts.urls[0]},
            },
        )
        await gw.wait_visible(3)
        source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500, "backend": "gloo"}}
        status, body = await refit(gw, source=source, weight_version="9")
        assert status == 202, body
        rid = body["refit_id"]
        await wait_state(gw, rid, "awaiting_transfer")
        info = (await gw.client.get(f"/v1/rl/refits/{rid}")).json()["transfer"]
        assert info["world_size"] == 4 and sorted(info["ranks"].values()) == [1, 2, 3]
        r = await gw.client.post(
            f"/v1/rl/refits/{rid}/transfer",
            json={"names": ["w"], "dtypes": ["float32"], "shapes": [[2, 2]]},
        )
        assert r.status_code == 200, r.text
        assert {x["result"] for x in r.json()["results"]} == {"ok"}
        r = await gw.client.post(f"/v1/rl/refits/{rid}/commit")
        assert r.status_code == 202, r.text
        done = await wait_done(gw, rid)
        assert done["result"] == "succeeded", done
        assert {sg[0].weight_version, vl[0].weight_version, ts[0].weight_version} == {"9"}
        assert all(e.paused is None for e in (sg[0], vl[0], ts[0]))
        # A commit retried (its first answer lost) is told it was taken; a fail now is refused.
        r = await gw.client.post(f"/v1/rl/refits/{rid}/commit")
        assert r.status_code == 202 and r.json()["result"] == "succeeded", r.text
        r = await gw.client.post(f"/v1/rl/refits/{rid}/fail")
        assert r.status_code == 409 and r.json()["error"] == "refit_state"


async def test_trainer_checksums_are_compared_where_the_engine_has_a_checksum_route():
    """vLLM's /weight_checker is compared with ``source.distributed.checksums``: a mismatch is a
    failed load (quarantined, never resumed); SGLang has no per-tensor route: ``unverified``."""
    names, dtypes, shapes = ["w.0", "w.1"], ["float32", "bfloat16"], [[2, 2], [3]]
    sums = {n: declared_checksum(n, d, s) for n, d, s in zip(names, dtypes, shapes, strict=True)}
    async with (
        fake_fleet("sglang", 1) as sg,
        fake_fleet("vllm", 2, weight_transfer_backend="gloo") as vl,
        gateway_in_process(rl_cfg(), worker_urls=sg.urls + vl.urls) as gw,
    ):
        vl[1].set_knobs(corrupt_transfers=True)
        ids = {w["url"]: w["id"] for w in (await rows(gw)).values()}
        source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500, "checksums": sums}}
        status, body = await refit(gw, source=source, weight_version="9")
        assert status == 202, body
        rid = body["refit_id"]
        await wait_state(gw, rid, "awaiting_transfer")
        r = await gw.client.post(
            f"/v1/rl/refits/{rid}/transfer", json={"names": names, "dtypes": dtypes, "shapes": shapes}
        )
        assert r.status_code == 200, r.text
        assert (await gw.client.post(f"/v1/rl/refits/{rid}/commit")).status_code == 202
        done = await wait_done(gw, rid)
        engines = {e["worker_id"]: e for e in done["engines"]}
        good, bad, plain = engines[ids[vl[0].url]], engines[ids[vl[1].url]], engines[ids[sg[0].url]]
        assert done["result"] == "quarantined" and done["quarantined"] == [bad["worker_id"]], done
        assert (good["checksums"], good["status"]) == ("verified", "resumed")
        assert (plain["checksums"], plain["status"]) == ("unverified", "resumed")
        assert bad["checksums"] == "mismatch" and bad["status"] == "quarantined"
        assert "checksum mismatch on 2 of 2 tensor(s): w.0, w.1" in bad["detail"]
        assert vl[1].paused is not None and vl[0].paused is None and sg[0].paused is None
        assert [c.path for c in sg[0].calls if "checker" in c.path] == []
        assert len(vl[0].calls_to("/weight_checker")) == 1
        (step,) = [e for e in journal(gw, "refit.step_done") if e.phase == "checksum"]
        assert sorted(x["checksums"] for x in step.results) == ["mismatch", "verified"]
        (started,) = journal(gw, "refit.started")
        assert sorted(e["plan"]["checksums"] for e in started.engines) == ["checked", "checked", "unverified"]


async def test_a_transfer_that_never_commits_times_out_into_quarantine():
    async with fake_fleet("sglang", 2) as sg, gateway_in_process(rl_cfg(), worker_urls=sg.urls) as gw:
        source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500}}
        _, body = await refit(gw, source=source, weight_version="9", transfer_timeout_secs=0.2)
        done = await wait_done(gw, body["refit_id"])
        # Every engine failed (none reached the new version): the refit failed, both quarantined.
        assert done["result"] == "failed" and len(done["quarantined"]) == 2
        assert "did not commit" in done["engines"][0]["detail"]
        assert all(e.paused is not None for e in sg)


async def test_trainer_fail_with_abort():
    async with fake_fleet("sglang", 1) as sg, gateway_in_process(rl_cfg(), worker_urls=sg.urls) as gw:
        source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500}}
        _, body = await refit(gw, source=source, weight_version="9", on_failure="abort")
        await wait_state(gw, body["refit_id"], "awaiting_transfer")
        r = await gw.client.post(f"/v1/rl/refits/{body['refit_id']}/fail", json={"reason": "nccl timeout"})
        assert r.status_code == 202
        done = await wait_done(gw, body["refit_id"])
        assert done["result"] == "aborted" and "nccl timeout" in done["engines"][0]["detail"]


async def test_a_version_the_fleet_left_is_refused_unless_forced(ckpt, tmp_path):
    other = str(make_checkpoint(tmp_path / "b", "fake/model", seed=2))
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        # "10" < "9" as strings; publication order is what counts.
        for version, path in (("9", ckpt), ("10", other)):
            _, body = await refit(gw, source={"disk": {"model_path": path}}, weight_version=version)
            assert (await wait_done(gw, body["refit_id"]))["result"] == "succeeded"
        status, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="9")
        assert status == 409 and body["error"] == "version_left" and body["current_version"] == "10"
        status, body = await refit(gw, source={"disk": {"model_path": other}}, weight_version="10")
        assert status == 202  # the current version again is not going backwards
        await wait_done(gw, body["refit_id"])
        status, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="9", force=True)
        assert status == 202
        assert (await wait_done(gw, body["refit_id"]))["result"] == "succeeded"


async def test_quarantine_by_hand_is_journaled_and_holds_out_of_routing():
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        wid = next(w["id"] for w in (await rows(gw)).values() if w["url"] == fleet[0].url)
        r = await gw.client.post(f"/v1/rl/workers/{wid}/quarantine", json={"reason": "bad gpu"})
        assert r.status_code == 200 and r.json() == {
            "worker_id": wid,
            "quarantined": True,
            "reason": "bad gpu",
        }
        assert (await rows(gw))[wid]["quarantine"] == {"reason": "bad gpu", "refit_id": None}
        fleet.clear_calls()
        await served_versions(gw, 6)
        assert fleet[0].calls_to("/generate") == [] and len(fleet[1].calls_to("/generate")) == 6
        r = await gw.client.delete(f"/v1/rl/workers/{wid}/quarantine")
        assert r.status_code == 200 and r.json()["quarantined"] is False
        assert "quarantined" not in (await rows(gw))[wid]
        types = [type(e).TYPE for e in journal(gw, "worker.quarantined", "worker.released")]
        assert types == ["worker.quarantined", "worker.released"]
        r = await gw.client.post("/v1/rl/workers/nope/quarantine")
        assert r.status_code == 404


@pytest.mark.parametrize(
    "body, code",
    [
        ({}, "invalid_body"),
        ({"selector": "engine=sglang", "weight_version": "1", "source": {"s3": {}}}, "invalid_body"),
        ({"selector": "engine=sglang", "weight_version": "1", "source": {"disk": {}}}, "invalid_body"),
        ({"selector": "engine=", "weight_version": "1", "source": {"disk": {"model_path": "/x"}}}, "invalid_selector"),
        ({"selector": "engine=sglang", "weight_version": " ", "source": {"disk": {"model_path": "/x"}}}, "invalid_version"),
        ({"selector": "engine=sglang", "weight_version": "1", "source": {"disk": {"model_path": "/x"}}, "on_failure": "pray"}, "invalid_body"),
        ({"selector": "engine=trtllm", "weight_version": "1", "source": {"disk": {"model_path": "/x"}}}, "no_workers_match"),
        ({"selector": "engine=sglang", "weight_version": "1", "source": {"disk": {"model_path": "/x"}}, "pause_mode": "keep"}, "refit_unsupported"),
    ],
)  # fmt: skip
async def test_bad_requests_get_stable_codes(body, code):
    async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        r = await gw.client.post("/v1/rl/refits", json=body)
        assert r.status_code in (400, 409), r.text
        assert r.json()["error"] == code
        assert fleet[0].calls_to("/pause_generation") == []


async def test_refits_need_the_admin_role_and_unknown_ids_are_404(ckpt):
    async with (
        fake_fleet("sglang", 1) as fleet,
        gateway_in_process(rl_cfg(control_plane_keys=KEYS), worker_urls=fleet.urls) as gw,
    ):
        body = {"selector": "engine=sglang", "weight_version": "1", "source": {"disk": {"model_path": ckpt}}}
        r = await gw.client.post("/v1/rl/refits", json=body, headers=USER)
        assert r.status_code == 403
        r = await gw.client.post("/v1/rl/refits", json=body)
        assert r.status_code == 401
        r = await gw.client.post("/v1/rl/refits", json=body, headers=ADMIN)
        assert r.status_code == 202
        r = await gw.client.get("/v1/rl/refits/nope", headers=USER)
        assert r.status_code == 404 and r.json()["error"] == "refit_not_found"


async def test_events_stream_ends_with_the_finished_record(ckpt):
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        _, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="5")
        r = await gw.client.get(f"/v1/rl/refits/{body['refit_id']}/events")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        records = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        assert records[-1]["result"] == "succeeded"
        seqs = [x["last_seq"] for x in records]
        assert seqs == sorted(set(seqs))


async def test_restart_mid_load_rechecks_and_never_resumes_an_engine_on_unknown_weights(ckpt):
    """The gateway stops while engine 0 is still loading; at the restart engine 0 cannot say which
    weights it holds (it answers nothing): quarantined, still paused. The others read back the
    new version and resume."""
    from journal import MemoryStore

    store = MemoryStore()
    cfg = rl_cfg(timeout=1)
    async with fake_fleet("sglang", 3) as fleet:
        fleet[0].set_knobs(load_delay_ms=3000)
        async with gateway_in_process(cfg, store=store, worker_urls=fleet.urls) as gw:
            _, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="7")
            rid = body["refit_id"]
            with trio.fail_after(10):
                while (gw.gateway.fleet.sagas.get(rid).open_step or ("",))[0] != "load":
                    await gw.gateway.refits.change_event().wait()
                while fleet[1].weight_version != "7" or fleet[2].weight_version != "7":
                    await trio.sleep(0.01)
        fleet[0].set_knobs(hang=True)  # its read-back will time out: weights unknown
        async with gateway_in_process(cfg, store=store) as gw:
            done = await wait_done(gw, rid)
            engines = {e["url"]: e for e in done["engines"]}
            assert done["result"] == "quarantined", done
            assert engines[fleet[0].url]["status"] == "quarantined"
            assert "unknown" in engines[fleet[0].url]["detail"]
            assert fleet[0].paused is not None
            assert [e.paused for e in fleet[1:]] == [None, None]
            assert all(engines[e.url]["status"] == "resumed" for e in fleet[1:])
            assert fleet[0].calls_to("/continue_generation") == []
            states = [e.state for e in journal(gw, "refit.state")]
            assert "recovering" in states
        fleet[0].set_knobs(hang=False)


async def test_a_recovered_engine_is_held_out_until_refitted_or_confirmed(ckpt):
    """Unreachable for at least one health interval, then back: quarantined (reason
    ``recovered``) until a version write confirms it; the same after a second outage until a
    refit loads it."""
    from smgrl.core.config import HealthConfig
    from smgrl.registry.health import HealthChecker

    health = HealthConfig(interval_secs=1, timeout_secs=1, failure_threshold=1, success_threshold=1)
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        g = gw.gateway
        hc = HealthChecker(fleet=g.fleet, registry=g.registry, pools=g.pools, keys=g.keys, cfg=health)
        engine = fleet[0]
        wid = next(w["id"] for w in (await rows(gw)).values() if w["url"] == engine.url)

        async def outage():
            engine.go_down(60)
            await hc.check_once()
            engine.come_up()
            with trio.fail_after(10):
                while True:
                    try:
                        await (await trio.open_tcp_stream("127.0.0.1", engine.port)).aclose()
                        break
                    except OSError:
                        await trio.sleep(0.01)
            await hc.check_once()

        await outage()
        row = (await rows(gw))[wid]
        assert row["health"] == "ready" and row["quarantine"]["reason"].startswith("recovered")
        fleet.clear_calls()
        await served_versions(gw, 4)
        assert engine.calls_to("/generate") == []
        r = await gw.client.post(f"/v1/rl/workers/{wid}/version", json={"weight_version": "default"})
        assert r.status_code == 200
        assert "quarantined" not in (await rows(gw))[wid]
        await outage()
        assert (await rows(gw))[wid]["quarantined"] is True
        _, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="8")
        assert (await wait_done(gw, body["refit_id"]))["result"] == "succeeded"
        assert "quarantined" not in (await rows(gw))[wid]
        types = [type(e).TYPE for e in journal(gw, "worker.quarantined", "worker.released")]
        assert types == ["worker.quarantined", "worker.quarantined", "worker.released"]


async def test_two_refits_of_the_same_engines_at_once_one_is_refused(ckpt):
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        fleet[0].set_knobs(load_delay_ms=300)
        answers = []

        async def one(version):
            answers.append(await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version=version))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, "1")
            nursery.start_soon(one, "2")
        codes = sorted(status for status, _ in answers)
        assert codes == [202, 409], answers
        (refused,) = [b for s, b in answers if s == 409]
        assert refused["error"] == "refit_in_progress"
        (ok,) = [b for s, b in answers if s == 202]
        assert (await wait_done(gw, ok["refit_id"]))["result"] == "succeeded"


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_a_refit_never_aborts_generation_in_flight_by_default(ckpt, kind):
    """Each kind's default pause mode keeps the work, and the version write does not abort it
    (SGLang's update_weight_version would by default)."""
    async with (
        fake_fleet(kind, 1, token_latency_ms=30) as fleet,
        gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet[0]
        out = {}

        async def rollout():
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 30}}
            if kind == "vllm":
                body = {"model": engine.served_model_name, "prompt": "hi", "max_tokens": 30}
                out["r"] = await gw.client.post("/v1/completions", json=body)
            else:
                out["r"] = await gw.client.post("/generate", json=body)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            with trio.fail_after(10):
                while engine.inflight == 0:
                    await trio.sleep(0.005)
            _, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="7")
            done = await wait_done(gw, body["refit_id"])
        assert done["result"] == "succeeded", done
        r = out["r"]
        assert r.status_code == 200, r.text
        if kind == "sglang":
            assert r.json()["meta_info"]["finish_reason"]["type"] != "abort"
        else:
            assert r.json()["choices"][0]["finish_reason"] != "abort"


@pytest.mark.parametrize(
    "body",
    [
        {"source": {"disk": {"model_path": "/ckpt/" + "x" * 5000}}},
        {"source": {"disk": {"model_path": "/ckpt"}}, "pause_mode": "r" * 5000},
        {"source": {"distributed": {"master_address": "h" * 5000, "master_port": 1}}},
        {
            "source": {
                "distributed": {"master_address": "h", "master_port": 1, "checksums": {"w": "c" * 5000}}
            }
        },
        {"source": {"disk": {"model_path": "/ckpt"}}, "k" * 100_000: 1},
    ],
)
async def test_refit_text_fields_are_bounded_and_nothing_is_journaled(body):
    # Found against a live gateway: a 100,000-character model_path was accepted and repeated in
    # the plan per engine and per call (a 302 KB refit.started for two engines; any field could
    # be up to --max-payload-size, 512 MiB).
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        status, answer = await refit(gw, weight_version="5", **body)
        assert status == 400 and answer["error"] == "invalid_body", answer
        assert len(answer["message"]) < 300
        sagas = gw.gateway.fleet.sagas
        assert not sagas.open and not sagas.recent  # no refit.started (only the write's audit record)


async def test_a_quarantine_set_by_hand_during_a_refit_outlives_it(ckpt):
    # Found against a live gateway: an operator quarantined an engine while a refit held it (the
    # refit was loading); the refit then resumed the engine and released the quarantine
    # ("refitted"), putting an engine the operator had just held out back into routing. A refit
    # ends only quarantines older than itself.
    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        wid = next(w["id"] for w in (await rows(gw)).values() if w["url"] == fleet[0].url)
        fleet[0].set_knobs(load_delay_ms=1500)
        _, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="5")
        refit_id = body["refit_id"]
        with trio.fail_after(20):
            while gw.gateway.fleet.sagas.get(refit_id).engines[wid].phase != "load":
                await gw.gateway.refits.change_event().wait()
        r = await gw.client.post(f"/v1/rl/workers/{wid}/quarantine", json={"reason": "bad gpu"})
        assert r.status_code == 200 and r.json()["quarantined"] is True
        done = await wait_done(gw, refit_id)
        assert done["result"] == "succeeded"
        assert (await rows(gw))[wid]["quarantine"] == {"reason": "bad gpu", "refit_id": None}
        assert [type(e).TYPE for e in journal(gw, "worker.quarantined", "worker.released")] == [
            "worker.quarantined"
        ]
        fleet.clear_calls()
        await served_versions(gw, 4)
        assert fleet[0].calls_to("/generate") == []  # still held out of routing


async def test_a_client_that_leaves_while_its_refit_is_journaled_does_not_orphan_the_refit(ckpt, tmp_path):
    # Found against a live gateway: clients that sent POST /v1/rl/refits and reset the
    # connection at once left, 1 time in 80, a refit.started in the journal whose saga never ran
    # (cancelled between the append and the spawn): open for ever, every later refit of those
    # engines refused with refit_in_progress until a restart. Here the journal's write lock is
    # held by another connection (as `smgrl journal compact` does) so that the client leaves
    # while refit.started waits to be written.
    import sqlite3

    from asgi_call import AsgiCall

    from journal import SqliteStore

    path = tmp_path / "j.db"
    store = SqliteStore.open(path)
    config = attrs.evolve(rl_cfg(), journal_lock_wait_secs=30.0)
    body = json.dumps(
        {"selector": "engine=sglang", "source": {"disk": {"model_path": ckpt}}, "weight_version": "5"}
    ).encode()
    async with (
        fake_fleet("sglang", 2) as fleet,
        gateway_in_process(config, store=store, worker_urls=fleet.urls) as gw,
    ):
        blocker = sqlite3.connect(path, timeout=30)
        blocker.execute("BEGIN IMMEDIATE")  # the journal's write lock, held
        call = AsgiCall(gw.app, "/v1/rl/refits", method="POST", body=body)
        async with trio.open_nursery() as nursery:
            await nursery.start(call.run)
            with trio.fail_after(20):  # the handler is in its append (engines reserved) ...
                while not gw.gateway.refits._starting:
                    await trio.sleep(0.005)
            # ... and refit.started is queued: the handler waits for the commit, the writer for
            # the lock; nothing else runs.
            await trio.testing.wait_all_tasks_blocked(0.05)
            call.gone.set()  # the client leaves; its disconnect is delivered
            await trio.testing.wait_all_tasks_blocked(0.05)
            blocker.rollback()  # the lock comes free: refit.started is written
            blocker.close()
            with trio.fail_after(20):
                await call.done.wait()
        with trio.fail_after(20):
            while not gw.gateway.fleet.sagas.open and not gw.gateway.fleet.sagas.recent:
                await gw.gateway.refits.change_event().wait()
        saga = next(iter({**gw.gateway.fleet.sagas.open, **gw.gateway.fleet.sagas.recent}.values()))
        done = await wait_done(gw, saga.refit_id)
        assert done["result"] == "succeeded"
    store.close()


async def test_journal_refits_tells_the_sagas_and_quarantines(ckpt, tmp_path):
    """`smgrl journal refits` shows, with the cycles, each saga behind them (result, per-phase
    counts, the engine held out and why) and the quarantines set outside sagas."""
    from click.testing import CliRunner

    from journal import SqliteStore
    from smgrl.cli.journal import journal_group

    path = tmp_path / "j.db"
    store = SqliteStore.open(path)
    try:
        async with (
            fake_fleet("sglang", 3) as fleet,
            gateway_in_process(rl_cfg(), store=store, worker_urls=fleet.urls) as gw,
        ):
            fleet[1].set_knobs(fail_loads_after_swap=1)
            _, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="5")
            rid = body["refit_id"]
            assert (await wait_done(gw, rid))["result"] == "quarantined"
            held = next(w for w in (await rows(gw)).values() if w["url"] == fleet[1].url)["id"]
            other = next(w for w in (await rows(gw)).values() if w["url"] == fleet[2].url)["id"]
            r = await gw.client.post(f"/v1/rl/workers/{other}/quarantine", json={"reason": "odd logits"})
            assert r.status_code == 200, r.text
    finally:
        store.close()

    def run(*args):
        result = CliRunner().invoke(journal_group, ["--journal", str(path), *args], catch_exceptions=False)
        assert result.exit_code == 0, result.output
        return result.output

    for args in ((), ("--all",)):
        data = json.loads(run("--json", "refits", *args))
        (saga,) = data["sagas"]
        assert (saga["refit_id"], saga["state"], saga["weight_version"]) == (rid, "quarantined", "5")
        engines = {e["worker_id"]: e for e in saga["engines"]}
        assert engines[held]["status"] == "quarantined" and "load failed" in engines[held]["detail"]
        assert engines[held]["done"] == ["pause"]
        assert {e["status"] for w, e in engines.items() if w != held} == {"resumed"}
        assert [(q["worker"], q["action"]) for q in saga["quarantines"]] == [(held, "held")]
        assert [(q["worker"], q["action"], q["reason"]) for q in data["quarantines"]] == [
            (other, "held", "odd logits")
        ]
        # One vocabulary: the saga's cycle says what the saga says, with the saga's reason.
        (cycle,) = data["cycles"]
        assert cycle["status"] == "quarantined", cycle
        assert list(cycle["failed"].values()) == [[engines[held]["status"] + ": " + engines[held]["failure"]]]
    text = run("refits", "--wide")
    assert (
        "refit sagas" in text and "pause 3/3 load 2/3" in text and f"{held} quarantined: load failed" in text
    )
    assert "quarantines outside sagas" in text and "odd logits" in text


async def test_the_event_stream_always_ends_with_the_final_record(ckpt):
    """A reader slow to take a record (the generator waits at its yield while the saga runs on
    to its end) still gets the final record: the stream once ended on the saga's later state
    without sending it (seen with 64 engines' records through hypercorn)."""
    from smgrl.http.routes.event_streams import EventStreams
    from smgrl.http.routes.refits import RefitsApi

    async with fake_fleet("sglang", 2) as fleet, gateway_in_process(rl_cfg(), worker_urls=fleet.urls) as gw:
        _, body = await refit(gw, source={"disk": {"model_path": ckpt}}, weight_version="3")
        stream = RefitsApi(gw.gateway, EventStreams(limit=1))._sse(body["refit_id"])
        first = await stream.__anext__()  # the generator now waits at its yield
        assert b'"result":null' in first
        await wait_done(gw, body["refit_id"])  # the saga ends meanwhile
        rest = [chunk async for chunk in stream]
        assert rest and b'"result":"succeeded"' in rest[-1], rest
        # Each record is the GET record: the same JSON (its plan included), parsed back.
        last = json.loads(rest[-1].split(b"data: ", 1)[1])
        shown = (await gw.client.get(f"/v1/rl/refits/{body['refit_id']}")).json()
        expected = gw.gateway.refits.view(gw.gateway.refits.get(body["refit_id"]))
        assert last == shown == expected and set(shown["plan"]) == {e["worker_id"] for e in shown["engines"]}

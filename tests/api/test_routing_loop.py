"""PSRL's coordinator controls (docs/data-plane.md, "Coordinator controls of the routing loop"): pause/resume dispatch, status, per-instance
stats and version writes, all journaled and backed by the same projections."""

from __future__ import annotations

import json

import trio
import trio.testing

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

GEN = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}


def cfg(group_sticky: bool = False) -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        dp_aware=True,
        dataplane=DataPlaneConfig(eligible_wait_secs=30, psrl_group_sticky=group_sticky),
    )


def events(gw, kind):
    return [rec.event for rec in gw.store.read() if rec.event.TYPE == kind]


async def test_pause_holds_new_requests_until_resume_and_is_journaled():
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        r = await gw.client.post("/routing_loop/pause")
        assert r.status_code == 200 and r.json()["paused"] is True and r.json()["changed"] is True
        assert (await gw.client.post("/routing_loop/pause")).json()["changed"] is False  # idempotent
        dp = gw.app.dataplane
        answers = []

        async def one():
            answers.append((await gw.client.post("/generate", json=GEN)).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one)
            await trio.testing.wait_all_tasks_blocked()  # the request waits in the gateway
            assert dp.waiting == 1
            status = (await gw.client.get("/routing_loop/status")).json()
            assert status["paused"] and status["queue_len"] == 1 and status["routing_epoch"] == 1
            assert not fleet.engines[0].calls_to("/generate")
            r = await gw.client.post("/routing_loop/resume")
            assert r.json()["paused"] is False
        assert answers == [200]
        assert [e.paused for e in events(gw, "dataplane.dispatch_set")] == [True, False]
        assert gw.gateway.fleet.routing.revision == 2


async def test_worker_stats_and_per_instance_version_writes():
    async with (
        fake_fleet("sglang", n=2, dp_size=2) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        await gw.wait_visible(4)
        for _ in range(4):
            assert (await gw.client.post("/generate", json=GEN)).status_code == 200
        rows = (await gw.client.get("/workers/stats")).json()["workers"]
        assert len(rows) == 4 and sum(r["dispatched"] for r in rows) == 4
        assert {(r["dp_rank"], r["in_flight"]) for r in rows} == {(0, 0), (1, 0)}
        base = rows[0]["base_worker_id"]
        other = next(r["base_worker_id"] for r in rows if r["base_worker_id"] != base)
        items = [
            {"worker_id": base, "dp_rank": 0, "weight_version": 7},
            {"worker_id": base, "dp_rank": 1, "weight_version": 7},
            {"worker_id": other, "dp_rank": 0, "weight_version": "8"},  # rank 1 missing
            {"worker_id": "nope", "weight_version": "1"},
        ]
        r = await gw.client.post("/workers/update_weight_version", json=items)
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["total"], body["updated"], body["rejected"]) == (4, 2, 2)
        assert [x["status"] for x in body["results"]] == ["updated", "updated", "rejected", "rejected"]
        assert "all 2 DP ranks" in body["results"][2]["reason"]
        # The same version table routing and /v1/rl read: journaled as engine.version_set.
        (written,) = events(gw, "engine.version_set")
        assert written.weight_version == "7"
        versions = {
            (r["base_worker_id"], r["weight_version"])
            for r in (await gw.client.get("/workers/stats")).json()["workers"]
        }
        assert versions == {(base, "7"), (other, None)}
        r = await gw.client.post("/workers/update_weight_version", json={"worker_id": base})
        assert r.status_code == 400 and r.json()["error"] == "invalid_body"


async def test_worker_stats_count_generated_tokens_per_instance():
    """Buffered and streamed /generate (meta_info.completion_tokens), OpenAI (usage): each
    instance's tokens are what its answers reported."""
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        await gw.wait_visible(2)
        reported: dict[str, int] = {}

        def add(r, n):
            assert r.status_code == 200, r.text
            wid = r.headers["x-smgrl-worker-id"]
            reported[wid] = reported.get(wid, 0) + n

        for i in range(3):
            gen = {"input_ids": [1, 2, i], "sampling_params": {"max_new_tokens": 3 + i}}
            r = await gw.client.post("/generate", json=gen)
            add(r, r.json()["meta_info"]["completion_tokens"])
            r = await gw.client.post("/generate", json={**gen, "stream": True})
            last = [b for b in r.text.split("\n\n") if b.startswith("data: {")][-1]
            add(r, json.loads(last[6:])["meta_info"]["completion_tokens"])
            chat = {"model": "fake/Qwen3-0.6B", "messages": [{"role": "user", "content": "hi"}]}
            r = await gw.client.post("/v1/chat/completions", json={**chat, "max_tokens": 2 + i})
            add(r, r.json()["usage"]["completion_tokens"])
        rows = (await gw.client.get("/workers/stats")).json()["workers"]
        assert {r["worker_id"]: r["tokens"] for r in rows} == {
            r["worker_id"]: reported.get(r["worker_id"], 0) for r in rows
        }
        assert sum(reported.values()) > 0


async def test_worker_stats_show_requests_queued_for_an_instance():
    """A sticky request waiting (dispatch paused) for its instance is that instance's queue."""
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        await gw.wait_visible(2)
        rows = (await gw.client.get("/workers/stats")).json()["workers"]
        target = rows[0]["base_worker_id"]
        sticky = {"x-base-worker-id": target, "x-target-dp-rank": "0", "x-is-sticky": "true"}
        await gw.client.post("/routing_loop/pause")
        answers = []

        async def one(headers):
            answers.append((await gw.client.post("/generate", json=GEN, headers=headers)).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, sticky)
            nursery.start_soon(one, sticky)
            nursery.start_soon(one, {})  # waits for any instance: in `waiting`, no one's queue
            await trio.testing.wait_all_tasks_blocked()
            body = (await gw.client.get("/workers/stats")).json()
            assert body["waiting"] == 3
            assert {r["base_worker_id"]: r["queued"] for r in body["workers"]} == {
                r["base_worker_id"]: 2 if r["base_worker_id"] == target else 0 for r in rows
            }
            await gw.client.post("/routing_loop/resume")
        assert answers == [200, 200, 200]
        assert [r["queued"] for r in (await gw.client.get("/workers/stats")).json()["workers"]] == [0, 0]


async def test_worker_stats_show_a_prompt_groups_waiting_requests_on_its_pinned_instance():
    async with (
        fake_fleet("sglang", n=2, token_latency_ms=2) as fleet,
        gateway_in_process(cfg(group_sticky=True), worker_urls=fleet.urls) as gw,
    ):
        await gw.wait_visible(2)
        group = {"x-prompt-id": "g"}
        long = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1000}}
        answers = []

        async def one(body):
            answers.append((await gw.client.post("/generate", json=body, headers=group)).status_code)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(one, long)  # runs: writes the group's pin
            await trio.testing.wait_all_tasks_blocked()
            pinned = gw.app.dataplane.groups.pin("g")
            assert pinned is not None
            await gw.client.post("/routing_loop/pause")
            nursery.start_soon(one, GEN)
            nursery.start_soon(one, GEN)
            await trio.testing.wait_all_tasks_blocked()
            rows = (await gw.client.get("/workers/stats")).json()["workers"]
            assert {(r["base_worker_id"], r["queued"]) for r in rows} == {
                (r["base_worker_id"], 2 if r["base_worker_id"] == pinned.worker else 0) for r in rows
            }
            await gw.client.post("/routing_loop/resume")
        assert answers == [200, 200, 200]


async def test_pause_with_wait_drain_answers_once_in_flight_requests_finished_or_says_it_timed_out():
    """``wait=drain`` is smgrl's wait for the generations (``wait=true`` is PSRL's fork's: it
    waits for selection only, and answers at once)."""
    async with (
        fake_fleet("sglang", n=1, token_latency_ms=5) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet.engines[0]
        order = []
        long = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 60, "ignore_eos": True}}

        async def rollout():
            r = await gw.client.post("/generate", json=long)
            order.append(("rollout", r.status_code))

        async def pause(query: str):
            r = await gw.client.post("/routing_loop/pause" + query)
            order.append(("pause", r.status_code, r.json()))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            assert await engine.wait_until(lambda: bool(engine.scheduler.jobs), timeout=30)
            # A timeout shorter than the generation: a clear 504, dispatch paused all the same.
            await pause("?wait=drain&timeout=0.05")
            kind, status, body = order[-1]
            assert (kind, status, body["error"]) == ("pause", 504, "pause_wait_timeout")
            assert body["running_request_num"] == 1 and gw.gateway.fleet.routing.paused
            nursery.start_soon(pause, "?wait=drain")
        assert [o[0] for o in order] == ["pause", "rollout", "pause"]  # answered after the rollout
        assert order[-1][1] == 200 and order[-1][2]["drained"] is True
        assert order[-1][2]["running_request_num"] == 0
        for query in ("?wait=maybe", "?wait=drain&timeout=0", "?wait=true&timeout=nan"):
            r = await gw.client.post("/routing_loop/pause" + query)
            assert r.status_code == 400 and r.json()["error"] == "invalid_query", query


async def test_workers_pause_and_resume_hold_instances_out_of_routing():
    async with (
        fake_fleet("sglang", n=2, dp_size=2) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        await gw.wait_visible(4)
        rows = (await gw.client.get("/workers/stats")).json()["workers"]
        base = rows[0]["base_worker_id"]
        items = [{"base_worker_id": base}, {"worker_id": "nope"}]
        r = await gw.client.post("/workers/pause", json=items)
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["action"], body["total"], body["updated"], body["rejected"]) == ("pause", 2, 1, 1)
        assert [x["status"] for x in body["results"]] == ["paused", "rejected"]
        held = {
            row["base_worker_id"]: row["held"]
            for row in (await gw.client.get("/workers/stats")).json()["workers"]
        }
        assert held[base] == "paused" and list(held.values()).count(None) == 1
        for _ in range(4):  # every request goes to the other replica
            r = await gw.client.post("/generate", json=GEN)
            assert r.status_code == 200 and r.headers["x-base-worker-id"] != base
        # smgrl holds out whole engines: some DP ranks of a replica is refused with the reason.
        r = await gw.client.post("/workers/resume", json=[{"worker_id": base, "dp_rank": [0]}])
        assert (
            r.json()["results"][0]["status"] == "rejected"
            and "all 2 DP ranks" in r.json()["results"][0]["reason"]
        )
        r = await gw.client.post("/workers/resume", json=[{"worker_id": base, "dp_rank": [0, 1]}])
        assert r.json()["updated"] == 1 and r.json()["results"][0]["status"] == "resumed"
        rows = (await gw.client.get("/workers/stats")).json()["workers"]
        assert all(row["held"] is None for row in rows)
        assert [e.control for e in events(gw, "engine.state_set")] == ["paused", "active"]
        for bad in (
            b"{}",
            b"[]",
            b'[{"dp_rank": 0}]',
            b'[{"worker_id": "x", "dp_rank": -1}]',
            # Found by schemathesis: a null where the schema says string (or int) was served.
            b'[{"worker_id": "x", "base_worker_id": null}]',
            b'[{"worker_id": "x", "base_worker_id": "y"}]',
            b'[{"worker_id": "x", "dp_rank": null}]',
        ):
            r = await gw.client.post("/workers/pause", data=bad)
            assert r.status_code == 400 and r.json()["error"] == "invalid_body", bad


async def test_waiting_lists_the_waiting_requests_at_or_below_a_version():
    """``/routing_loop/waiting`` (smgrl's view, every waiting request; PSRL's ``/filter`` lists
    those with routing metadata: tests/psrl)."""
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        await gw.client.post("/routing_loop/pause")
        dp = gw.app.dataplane

        async def one(tag):
            headers = {"x-request-id": f"r{tag}"} | ({"x-version-tag": tag} if tag else {})
            await gw.client.post("/generate", json=GEN, headers=headers)

        async with trio.open_nursery() as nursery:
            for tag in ("3", "5", None):
                nursery.start_soon(one, tag)
            await trio.testing.wait_all_tasks_blocked()
            assert dp.waiting == 3

            async def listed(bound):
                r = await gw.client.get(f"/routing_loop/waiting?version_tag={bound}")
                assert r.status_code == 200, r.text
                return sorted((x["request_id"], x["version_tag"]) for x in r.json()["requests"])

            assert await listed("4") == [("r3", "3"), ("rNone", "-1")]
            assert await listed("5") == [("r3", "3"), ("r5", "5"), ("rNone", "-1")]
            assert await listed("-1") == [("rNone", "-1")]
            for bad in ("", "a%20b"):
                for route in ("waiting", "filter"):
                    r = await gw.client.get(f"/routing_loop/{route}?version_tag={bad}")
                    assert r.status_code == 400 and r.json()["error"] == "invalid_query"
            assert (await gw.client.get("/routing_loop/waiting")).status_code == 400
            assert (await gw.client.get("/routing_loop/filter")).status_code == 400
            await gw.client.post("/routing_loop/resume")


async def test_a_chunked_version_write_over_the_limit_is_refused_and_audited_with_its_413():
    async def chunks():
        for _ in range(3):
            yield b"x" * 50

    config = Config(rl=RlConfig(enabled=True), max_payload_size=100)
    async with gateway_in_process(config) as gw:
        r = await gw.client.post("/workers/update_weight_version", content=chunks())
        assert r.status_code == 413
        assert r.text == "Failed to buffer the request body: length limit exceeded"
        await gw.writer.flush()  # the guard queues the audit event
        audits = [e for e in events(gw, "audit.control_plane") if e.path == "/workers/update_weight_version"]
        assert [e.status for e in audits] == [413]


# One item each route takes (its required fields); each optional field is then sent as null.
_LIST_ROUTES = {
    "/workers/update_weight_version": {"worker_id": "nope", "weight_version": "1"},
    "/workers/update_stats": {"worker_id": "nope"},
    "/workers/pause": {"worker_id": "nope"},
    "/workers/resume": {"worker_id": "nope"},
}


async def test_a_null_item_field_is_taken_exactly_where_the_schema_says_nullable():
    # The OpenAPI document is what clients and the schemathesis run hold the routes to: a field
    # the route reads null as absent must say nullable, and one it refuses null for must not.
    from smgrl.http.openapi.document import document

    paths = document()["paths"]
    async with gateway_in_process(cfg()) as gw:
        for path, item in _LIST_ROUTES.items():
            schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]["items"]
            for name, prop in schema["properties"].items():
                r = await gw.client.post(path, json=[{**item, name: None}])
                taken = r.status_code < 400
                assert taken == bool(prop.get("nullable")), (path, name, r.status_code, r.text[:200])

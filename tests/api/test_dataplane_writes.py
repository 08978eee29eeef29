"""Explicit version and state writes (docs/data-plane.md, "The version table and explicit writes"): bodies, validation
order, errors, journal events, and the engine projection (``version_source: api``) that routing
reads."""

from __future__ import annotations

import attrs
import pytest
from rl_api_helpers import ADMIN, KEYS, USER

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.fake import fake_fleet
from smgrl.history.replay import replay
from smgrl.state.fleet import FleetState
from smgrl.testing import gateway_in_process

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}


def cfg(**kw) -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        dataplane=DataPlaneConfig(eligible_wait_secs=0),
        **kw,
    )


def events(gw, type_name: str) -> list:
    return [
        rec.event for rec in gw.store.read(types=[type_name]) if getattr(rec.event, "TYPE", None) == type_name
    ]


async def test_per_worker_version_write_updates_the_row_the_journal_and_the_stamp():
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        a = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        r = await gw.client.post(f"/v1/rl/workers/{a}/version", json={"weight_version": "  step-5 "})
        assert r.status_code == 200
        row = r.json()
        assert (row["id"], row["weight_version"], row["version_source"], row["control"]) == (
            a, "step-5", "api", "active"
        )  # fmt: skip
        [event] = events(gw, "engine.version_set")
        assert event.weight_version == "step-5" and event.selector is None
        assert [t["worker_id"] for t in event.targets] == [a]
        listed = {w["id"]: w for w in (await gw.client.get("/v1/rl/workers")).json()["workers"]}
        assert listed[a]["weight_version"] == "step-5" and listed[a]["version_source"] == "api"
        # Streams are stamped from the table.
        for _ in range(2):
            r = await gw.client.post("/generate", json={**GEN, "stream": True})
            if r.headers["x-smgrl-worker-id"] == a:
                assert r.headers["x-smg-weight-version"] == "step-5"


async def test_per_worker_state_write_drives_routing():
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        a, b = (gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls)
        r = await gw.client.post(f"/v1/rl/workers/{a}/state", json={"control": "asleep"})
        assert r.status_code == 200 and r.json()["control"] == "asleep"
        for _ in range(4):
            r = await gw.client.post("/generate", json=GEN)
            assert r.headers["x-smgrl-worker-id"] == b
        await gw.client.post(f"/v1/rl/workers/{b}/state", json={"control": "paused"})
        r = await gw.client.post("/generate", json=GEN)
        assert r.status_code == 503 and r.json()["error"]["reasons"] == {"asleep": 1, "paused": 1}
        await gw.client.post(f"/v1/rl/workers/{a}/state", json={"control": "active"})
        assert (await gw.client.post("/generate", json=GEN)).headers["x-smgrl-worker-id"] == a
        assert [e.control for e in events(gw, "engine.state_set")] == ["asleep", "paused", "active"]


async def test_fleet_forms_write_one_entry_per_engine_and_answer_the_targets_rows():
    config = cfg(dp_aware=True)
    async with fake_fleet("sglang", n=2, dp_size=2) as fleet, gateway_in_process(config) as gw:
        await gw.register(fleet.urls)
        await gw.wait_visible(4)
        r = await gw.client.post(
            "/v1/rl/version",
            params={"selector": "engine=sglang"},
            json={"weight_version": "7"},
        )
        assert r.status_code == 200
        body = r.json()
        assert body["total"] == 2 and body["protocol_version"] == 1
        assert {w["weight_version"] for w in body["workers"]} == {"7"}
        assert {w["dp_ranks"] for w in body["workers"]} == {2}
        [event] = events(gw, "engine.version_set")
        assert len(event.targets) == 2 and event.selector == "engine=sglang"
        assert {t["base_url"] for t in event.targets} == set(fleet.urls)
        # One selected engine only.
        r = await gw.client.post(
            "/v1/rl/state", params={"selector": f"base_url={fleet.urls[1]}"}, json={"control": "paused"}
        )
        assert r.status_code == 200 and [w["base_url"] for w in r.json()["workers"]] == [fleet.urls[1]]
        assert r.json()["workers"][0]["control"] == "paused"
        facts = gw.gateway.fleet.facts()
        assert facts[fleet.urls[1]].control == "paused" and facts[fleet.urls[0]].control == "active"


async def test_a_version_write_confirms_a_mixed_engine():
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        fleet_state = gw.gateway.fleet
        base = fleet.urls[0]
        fleet_state.engines.engines[base] = attrs.evolve(
            fleet_state.facts()[base], mixed=True, version_known=False
        )
        r = await gw.client.post(f"/v1/rl/workers/{wid}/version", json={"weight_version": "9"})
        assert r.json()["version_status"] == "consistent"
        assert (await gw.client.post("/generate", json=GEN)).status_code == 200


BAD_BODIES = [
    ("version", b"{not json", "invalid_body", "Failed to parse the request body as JSON: "),
    ("version", b"{}", "invalid_body", "Failed to deserialize the JSON body into the target type: missing field `weight_version`"),
    ("version", b'{"weight_version": 5}', "invalid_body", "invalid type: integer `5`, expected a string"),
    ("state", b'{"control": "napping"}', "invalid_body", "unknown variant `napping`, expected one of `active`, `paused`, `asleep`"),
    ("state", b"[]", "invalid_body", "Failed to deserialize the JSON body into the target type: "),
    ("version", b'{"weight_version": "   "}', "invalid_version", "weight_version is empty"),
    ("version", b'{"weight_version": "' + b"x" * 129 + b'"}', "invalid_version", "weight_version exceeds 128 bytes"),
    ("version", b'{"weight_version": "a b"}', "invalid_version", "weight_version contains a byte outside printable ASCII"),
    # Past Python's 4,300-digit int() limit: answered 500 before (serde makes it an f64, out of range).
    ("version", b'{"weight_version": ' + b"9" * 5000 + b"}", "invalid_body", "weight_version: number out of range"),
    ("state", b'{"control": "paused", "x": ' + b"9" * 5000 + b"}", "invalid_body", "x: number out of range"),
]  # fmt: skip


@pytest.mark.parametrize("kind, body, code, message", BAD_BODIES)
async def test_bodies_are_checked_before_the_worker_and_the_selector(kind, body, code, message):
    async with gateway_in_process(cfg()) as gw:
        headers = {"content-type": "application/json"}
        for path in (f"/v1/rl/workers/no-such-worker/{kind}", f"/v1/rl/{kind}"):  # no selector either
            r = await gw.client.post(path, content=body, headers=headers)
            assert r.status_code == 400, path
            assert r.json()["error"] == code and message in r.json()["message"], r.json()


async def test_lookup_and_selector_errors():
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        good = {"weight_version": "v1"}
        r = await gw.client.post("/v1/rl/workers/nope/version", json=good)
        assert r.status_code == 404 and r.json() == {
            "error": "worker_not_found",
            "message": "worker `nope` not found",
            "id": "nope",
        }
        r = await gw.client.post("/v1/rl/version", json=good)
        assert r.status_code == 400 and r.json()["error"] == "selector_required"
        r = await gw.client.post("/v1/rl/version", params={"selector": "  "}, json=good)
        assert r.json()["error"] == "selector_required"
        r = await gw.client.post("/v1/rl/state", params={"selector": "engine=="}, json={"control": "active"})
        assert r.json()["error"] == "invalid_selector" and r.json()["offset"] == 7
        r = await gw.client.post("/v1/rl/version", params={"selector": "engine=vllm"}, json=good)
        assert r.status_code == 400 and r.json() == {
            "error": "no_workers_match", "message": "no workers match selector `engine=vllm`", "selector": "engine=vllm"
        }  # fmt: skip
        r = await gw.client.post("/v1/rl/version?selector=a%3Db&selector=c%3Dd", content=b"{")
        assert (
            r.status_code == 400
            and r.text == "Failed to deserialize query string: duplicate field `selector`"
        )
        assert events(gw, "engine.version_set") == [] and events(gw, "engine.state_set") == []
        r = await gw.client.get("/v1/rl/version")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        r = await gw.client.get(f"/v1/rl/workers/{gw.gateway.fleet.registry.id_for_url(fleet.urls[0])}/state")
        assert r.status_code == 405


async def test_writes_need_an_admin_key_and_are_audited():
    config = cfg(control_plane_keys=KEYS)
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(config, worker_urls=fleet.urls) as gw:
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        body = {"control": "paused"}
        assert (await gw.client.post(f"/v1/rl/workers/{wid}/state", json=body)).status_code == 401
        assert (
            await gw.client.post(f"/v1/rl/workers/{wid}/state", json=body, headers=USER)
        ).status_code == 403
        r = await gw.client.post(f"/v1/rl/workers/{wid}/state", json=body, headers=ADMIN)
        assert r.status_code == 200
        [event] = events(gw, "engine.state_set")
        assert event.principal == "adm"
        # D2: the allowed write is an event of its own; the two denials are counted.
        audits = [e for e in events(gw, "audit.control_plane") if e.path.endswith("/state")]
        assert [a.outcome for a in audits] == ["success"]
        await gw.gateway.audit.flush(gw.writer)
        (counts,) = events(gw, "audit.control_plane_counts")
        assert sorted((c["principal"], c["family"], c["reason"], c["count"]) for c in counts.counts) == [
            ("unauthenticated", "rl.writes", "missing or malformed authorization", 1),
            ("usr", "rl.writes", "admin role required", 1),
        ]


async def test_writes_survive_replay():
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        await gw.client.post(f"/v1/rl/workers/{wid}/version", json={"weight_version": "v3"})
        await gw.client.post(f"/v1/rl/workers/{wid}/state", json={"control": "asleep"})
        again = FleetState()
        replay(gw.store, again)
        facts = again.facts()[fleet.urls[0]]
        assert (facts.weight_version, facts.version_source, facts.control) == ("v3", "api", "asleep")

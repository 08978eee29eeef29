"""The recovered-engine rule with real processes: a fake engine restarted on the same port, too fast
for any health round to see it down, reports a new startup identity (SGLang ``startup_time``,
TokenSpeed ``start_time``); the gateway holds it out of routing until its version is confirmed,
an operator releases it or a refit loads it (docs/refits.md, docs/deviations.md)."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest

import smgrl.events  # noqa: F401 - registers the event catalogue, so that read() decodes its types
from journal import SqliteStore
from smgrl.demo.procs import start_fake_engines, wait_for_workers

pytestmark = pytest.mark.e2e

BOUND = 30.0
TS_KEY = "ts-secret"
GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}


def wait_until(predicate, what: str):
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"not within {BOUND:g}s: {what}")


def events(journal: str, *types: str) -> list:
    store = SqliteStore.open(journal, readonly=True)
    try:
        return [r.event for r in store.read(types=list(types))]
    finally:
        store.close()


def fake_calls(url: str, path: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/_fake/calls?path={path}", timeout=10) as r:
        return json.loads(r.read())["calls"]


def rows(http) -> dict[str, dict]:
    return {w["id"]: w for w in http.request("GET", "/v1/rl/workers")[2]["workers"]}


def restart(children, kind: str, child, url: str, *extra: str):
    """Stop the engine's process and start a new one on the same port."""
    child.stop()
    port = url.rsplit(":", 1)[1]
    new, urls = start_fake_engines(kind, 1, [*extra, "--ports", port])
    children.append(new)
    assert urls == [url]
    return new


def test_engines_restarted_on_the_same_port_are_held_out_until_confirmed_or_released(
    children, gateway, tmp_path
):
    sg_child, (sg_url,) = start_fake_engines("sglang", 1)
    children.append(sg_child)
    other_child, (other_url,) = start_fake_engines("sglang", 1)
    children.append(other_child)
    ts_child, (ts_control,) = start_fake_engines("tokenspeed", 1, ["--api-key", TS_KEY])
    children.append(ts_child)
    journal = str(tmp_path / "recovered.db")
    # Health rounds every second, but an outage would need 1000 failed rounds: only the changed
    # identity can catch these restarts.
    gw, http, _ = gateway(
        "--enable-rl",
        "--health-check-interval-secs",
        "1",
        "--health-failure-threshold",
        "1000",
        "--worker-urls",
        sg_url,
        other_url,
        journal=journal,
    )
    ts_spec = {
        "url": "grpc://127.0.0.1:40001",
        "runtime": "tokenspeed",
        "api_key": TS_KEY,
        "labels": {"rl.control_url": ts_control},
    }
    assert http.request("POST", "/workers", ts_spec)[0] == 202
    wait_for_workers(http.base, 3, child=gw)
    ids = {w["url"]: w["id"] for w in rows(http).values()}
    sg_id, ts_id = ids[sg_url], ids["grpc://127.0.0.1:40001"]

    # Each engine's identity is recorded once.
    wait_until(lambda: len(events(journal, "worker.identity_seen")) == 3, "three identities seen")
    assert not events(journal, "worker.quarantined")

    sg_child = restart(children, "sglang", sg_child, sg_url)
    ts_child = restart(children, "tokenspeed", ts_child, ts_control, "--api-key", TS_KEY)
    wait_until(lambda: rows(http)[sg_id].get("quarantined") and rows(http)[ts_id].get("quarantined"), "held")
    for wid in (sg_id, ts_id):
        reason = rows(http)[wid]["quarantine"]["reason"]
        assert reason.startswith("recovered: its startup identity changed"), reason
    assert rows(http)[sg_id]["health"] == "ready"
    assert not events(journal, "worker.health_changed")  # no health round saw an outage
    held = events(journal, "worker.quarantined")
    assert sorted(e.worker_id for e in held) == sorted([sg_id, ts_id])
    seen = [e for e in events(journal, "worker.identity_seen") if e.previous is not None]
    assert sorted(e.worker_id for e in seen) == sorted([sg_id, ts_id])
    assert all(e.previous != e.identity for e in seen)

    # Held out of routing: every rollout goes to the engine that did not restart.
    for _ in range(4):
        status, _, body = http.request("POST", "/generate", GEN)
        assert status == 200, body
    assert fake_calls(sg_url, "/generate") == []

    # A version write confirms the SGLang engine; an operator releases the TokenSpeed one.
    st, _, _ = http.request("POST", f"/v1/rl/workers/{sg_id}/version", {"weight_version": "default"})
    assert st == 200
    st, _, _ = http.request("DELETE", f"/v1/rl/workers/{ts_id}/quarantine", {"reason": "checked by hand"})
    assert st == 200
    assert "quarantined" not in rows(http)[sg_id] and "quarantined" not in rows(http)[ts_id]

    # Rounds after that read the same identity again: nothing more is journaled.
    count = len(events(journal, "worker.identity_seen"))
    reads = len(fake_calls(sg_url, "/server_info"))
    wait_until(lambda: len(fake_calls(sg_url, "/server_info")) >= reads + 2, "two more identity reads")
    assert len(events(journal, "worker.identity_seen")) == count
    assert "quarantined" not in rows(http)[sg_id]
    assert gw.stop() == 0

"""The journal's promise: SIGKILL the gateway, restart it on the same journal, get the same fleet back,
and the worker key still reaches its engine as a bearer."""

import json
import urllib.request

from smgrl.demo.procs import wait_for_workers


def fake_calls(url: str, path: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/_fake/calls?path={path}", timeout=10) as r:
        data = json.loads(r.read())
    return data["calls"] if isinstance(data, dict) else data


def comparable(workers: list[dict]) -> list[tuple]:
    return sorted(
        (
            w["id"],
            w["url"],
            json.dumps(w["labels"], sort_keys=True),
            w.get("dp_rank"),
            w.get("dp_size"),
            w.get("dp_base_url"),
        )
        for w in workers
    )


def test_sigkill_and_restart_keep_the_fleet_and_the_worker_key(fakes, gateway, tmp_path):
    plain = fakes("sglang", 2)
    dp = fakes("sglang", 1, "--dp-size", "2")
    journal = str(tmp_path / "fleet.db")
    gw, http, port = gateway(
        "--enable-rl", "--dp-aware", "--disable-health-check", "--worker-urls", dp[0], journal=journal
    )
    st, hdrs, body = http.request("POST", "/workers", {"url": plain[0], "labels": {"role": "policy"}})
    assert st == 202 and hdrs["location"] == f"/workers/{body['worker_id']}"
    st, _, keyed = http.request("POST", "/workers", {"url": plain[1], "api_key": "engine-secret"})
    assert st == 202
    wait_for_workers(http.base, 3, child=gw)  # rows: the DP group collapses to one row
    st, _, before = http.request("GET", "/workers")
    assert st == 200 and before["total"] == 4  # 2 ranks + 2 plain workers
    assert "engine-secret" not in json.dumps(before)

    gw.kill()  # SIGKILL: no shutdown bookkeeping at all

    gw2, http2, _ = gateway(
        "--enable-rl",
        "--dp-aware",
        "--disable-health-check",
        "--worker-urls",
        dp[0],
        journal=journal,
        port=port,
    )
    wait_for_workers(http2.base, 3, child=gw2)
    st, _, after = http2.request("GET", "/workers")
    assert st == 200
    assert comparable(after["workers"]) == comparable(before["workers"])

    st, _, res = http2.request("POST", f"/v1/rl/workers/{keyed['worker_id']}/engine/flush_cache", b"")
    assert st == 200 and res["worker_id"] == keyed["worker_id"]
    calls = fake_calls(plain[1], "/flush_cache")
    assert calls and calls[-1]["headers"].get("authorization") == "Bearer engine-secret"
    other = fake_calls(plain[0], "/health")
    assert all("authorization" not in c["headers"] for c in other)

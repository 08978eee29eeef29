"""``examples/refit_from_trainer.py`` run as a user would, against a mixed SGLang/TokenSpeed fleet of
real processes: the control sequence alone, and (where torch is importable) with real tensors
broadcast over a gloo group that every fake engine joins, one engine per process."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from smgrl.demo.procs import wait_for_workers

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "refit_from_trainer.py"
TS_KEY = "ts-secret"
# Looked up, not imported: importing torch here would cost every test run a second or two.
HAS_TORCH = importlib.util.find_spec("torch") is not None


def run_example(gateway: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--gateway", gateway, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def start_fleet(fakes, gateway, *, sglang, tokenspeed):
    """SGLang engines through --worker-urls, TokenSpeed ones through POST /workers with their
    control URL (the gRPC data URL is a placeholder: nothing listens there)."""
    sg_urls = [u for extra in sglang for u in fakes("sglang", 1, *extra)]
    ts_urls = [u for extra in tokenspeed for u in fakes("tokenspeed", 1, "--api-key", TS_KEY, *extra)]
    gw, http, _ = gateway("--enable-rl", "--disable-health-check", "--worker-urls", *sg_urls)
    for i, url in enumerate(ts_urls):
        port = url.rsplit(":", 1)[1]
        st, _, _ = http.request(
            "POST",
            "/workers",
            {
                "url": f"grpc://127.0.0.1:{40000 + i}",
                "runtime": "tokenspeed",
                "api_key": TS_KEY,
                "labels": {"rl.control_url": f"http://0.0.0.0:{port}"},
            },
        )
        assert st == 202
    wait_for_workers(http.base, len(sg_urls) + len(ts_urls), child=gw)
    return http, sg_urls, ts_urls


def test_refuses_a_loopback_master_with_a_remote_gateway():
    run = run_example("http://10.0.0.1:30000", "--weight-version", "1", "--master-address", "127.0.0.1")
    assert run.returncode == 2, run.stdout + run.stderr
    assert "refusing loopback --master-address 127.0.0.1" in run.stderr


def test_control_sequence_without_tensors(fakes, gateway):
    http, sg_urls, ts_urls = start_fleet(fakes, gateway, sglang=[()], tokenspeed=[("--tp-size", "2"), ()])
    run = run_example(
        http.base,
        "--weight-version",
        "11",
        "--master-address",
        "127.0.0.1",
        "--skip-tensors",
        "--chunks",
        "3",
        "--tensors",
        "5",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "tensors skipped" in run.stdout and "refit done" in run.stdout
    rows = {w["base_url"]: w for w in http.request("GET", "/v1/rl/workers")[2]["workers"]}
    assert {w["weight_version"] for w in rows.values()} == {"11"}
    assert {w["control"] for w in rows.values()} == {"active"}
    # Rank offsets follow row order (sorted by base_url: grpc://... before http://...);
    # the tp 2 TokenSpeed engine takes two ranks, so world_size = 1 + 2 + 1 + 1.
    order = sorted(rows.values(), key=lambda w: w["base_url"])
    assert [w["tp_size"] for w in order] == [2, 1, 1]
    offsets = []
    for w in order:
        control = w["control_url"]  # the SGLang engine's own URL, the TokenSpeed control apps
        (call,) = get(control + "/_fake/calls?path=/init_weights_update_group")["calls"]
        body = json.loads(call["body"])
        offsets.append((body["rank_offset"], body["world_size"], body["group_name"]))
        updates = get(control + "/_fake/weights")["updates"]
        # 5 tensors in 3 chunks; the version rides on the last chunk only.
        assert [len(u["names"]) for u in updates] == [2, 2, 1]
        assert [u["weight_version"] for u in updates] == [None, None, "11"]
        assert get(control + "/_fake/state")["groups"] == []  # destroyed
    assert offsets == [(1, 5, "smgrl-refit"), (3, 5, "smgrl-refit"), (4, 5, "smgrl-refit")]

    def weight_paths(url: str) -> list[str]:
        calls = get(url + "/_fake/calls")["calls"]
        return [c["path"] for c in calls if c["path"].endswith(("weight_update", "weights_update_group"))]

    # SGLang 0.5.23 needs a begin/end session around distributed updates; TokenSpeed has no such route.
    assert weight_paths(sg_urls[0]) == [
        "/init_weights_update_group",
        "/begin_weight_update",
        "/end_weight_update",
        "/destroy_weights_update_group",
    ]
    for url in ts_urls:
        assert weight_paths(url) == ["/init_weights_update_group", "/destroy_weights_update_group"]

    # A worker the refit cannot reach fails the pause fan-out: nothing is refit, all are resumed.
    assert (
        http.request("POST", "/workers", {"url": "grpc://127.0.0.1:40009", "runtime": "tokenspeed"})[0] == 202
    )
    wait_for_workers(http.base, 4)
    failed = run_example(
        http.base, "--weight-version", "12", "--master-address", "127.0.0.1", "--skip-tensors"
    )
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "no_control_endpoint" in failed.stderr
    rows = http.request("GET", "/v1/rl/workers")[2]["workers"]
    assert {(w["weight_version"], w["control"]) for w in rows if w["control_url"]} == {("11", "active")}


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install 'smgrl[torch]')")
def test_real_tensors_reach_every_engine(fakes, gateway):
    real = ("--real-distributed",)
    http, _, _ = start_fleet(fakes, gateway, sglang=[real, real], tokenspeed=[real, real])
    run = run_example(
        http.base,
        "--weight-version",
        "12",
        "--master-address",
        "127.0.0.1",
        "--dist-timeout",
        "60",
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "broadcast over gloo" in run.stdout
    # The defaults (8 tensors in 3 chunks) print what docs/tokenspeed.md shows for this run.
    doc = (ROOT / "docs" / "tokenspeed.md").read_text()
    (sample,) = [line for line in doc.splitlines() if line.startswith("# ... chunk ")]
    for piece in sample.removeprefix("# ").split("..."):
        assert piece.strip() in run.stdout, (piece, run.stdout)
    assert "checksums verified on 4/4 engines (8 tensors)" in run.stdout
    rows = http.request("GET", "/v1/rl/workers")[2]["workers"]
    assert {w["weight_version"] for w in rows} == {"12"}
    for w in rows:
        received = get(w["control_url"] + "/_fake/weights")
        assert received["real"] is True and len(received["checksums"]) == 8


def test_saga_drives_the_engine_side_of_a_transfer(fakes, gateway):
    """``--saga``: the gateway's refit saga pauses, inits, begins, takes each chunk on every kind,
    then finishes, versions, verifies and resumes on commit (docs/refits.md)."""
    http, _, _ = start_fleet(fakes, gateway, sglang=[()], tokenspeed=[("--tp-size", "2"), ()])
    run = run_example(
        http.base, "--weight-version", "21", "--master-address", "127.0.0.1", "--skip-tensors", "--saga"
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "saga: succeeded" in run.stdout and "refit done" in run.stdout
    rows = {w["base_url"]: w for w in http.request("GET", "/v1/rl/workers")[2]["workers"]}
    assert {(w["weight_version"], w["control"]) for w in rows.values()} == {("21", "active")}
    for w in rows.values():
        assert len(get(w["control_url"] + "/_fake/weights")["updates"]) == 3  # one per chunk
        assert get(w["control_url"] + "/_fake/state")["groups"] == []  # destroyed


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install 'smgrl[torch]')")
def test_saga_with_real_tensors(fakes, gateway):
    real = ("--real-distributed",)
    http, _, _ = start_fleet(fakes, gateway, sglang=[real], tokenspeed=[real])
    run = run_example(
        http.base, "--weight-version", "22", "--master-address", "127.0.0.1", "--saga", "--tensors", "4",
        "--chunks", "2", "--dist-timeout", "60",
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "checksums verified on 2/2 engines (4 tensors)" in run.stdout

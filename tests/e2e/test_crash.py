"""Crash safety with real processes: SIGKILL the gateway at random (seeded) points while a client
drives fan-outs, registrations and removals, restart it on the same journal, and prove:

* every event whose HTTP response the client received is in the journal (fan-outs by the op id
  of their ``x-smgrl-operation-id`` header, registrations and removals by worker id);
* the hash chain verifies after every kill;
* every operation the kill cut short is recorded ``interrupted`` at restart, naming exactly the
  targets whose outcomes were recorded and those that were not (also through the HTTP route);
* the registry after restart equals the registry the journal held at the kill;
* at the end, ``smgrl journal verify`` passes, including a full replay compared with the
  snapshots the gateway took along the way (every 40 events here).

Bounded: ``ROUNDS`` kills, each after at most ``MAX_RUN_SECS`` of traffic.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request

import attrs
import pytest

from journal import SqliteStore
from smgrl.history.replay import restore

pytestmark = pytest.mark.e2e

ROUNDS = 8
SEED = 20261129
MAX_RUN_SECS = 0.9
ENGINES = 10
SELECTOR = urllib.parse.quote("engine=sglang")


class Http:
    """A stdlib client with a short timeout: a killed gateway must end a request quickly."""

    def __init__(self, base: str) -> None:
        self.base = base

    def request(self, method: str, path: str, body=None):
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        headers = {"content-type": "application/json"} if data else {}
        req = urllib.request.Request(self.base + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                raw = r.read()
                return r.status, dict(r.headers), json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, dict(e.headers), json.loads(raw) if raw else None
            except ValueError:
                return e.code, dict(e.headers), raw.decode(errors="replace")


@attrs.define
class Seen:
    """What the client got an answer for (so the journal must have it)."""

    ops: set[str] = attrs.Factory(set)
    registered: dict[str, str] = attrs.Factory(dict)  # worker id -> url
    removed: set[str] = attrs.Factory(set)


def drive(http: Http, urls: list[str], rng: random.Random, seen: Seen, stop: threading.Event) -> None:
    """Client traffic until the gateway dies (or ``stop``): each loop is one request."""
    version = 0
    for _ in range(10_000):  # bounded; in practice the kill ends it within a second
        if stop.is_set():
            return
        live = [w for w in seen.registered if w not in seen.removed]
        roll = rng.random()
        try:
            if roll < 0.2 or len(live) < 3:
                free = [u for u in urls if u not in {seen.registered[w] for w in live}]
                if not free:
                    continue
                st, _, body = http.request(
                    "POST", "/workers", {"url": rng.choice(free), "labels": {"n": str(version)}}
                )
                if st == 202:
                    seen.registered[body["worker_id"]] = body["url"]
            elif roll < 0.3:
                wid = rng.choice(live)
                st, _, _ = http.request("DELETE", f"/workers/{wid}")
                if st == 202:
                    seen.removed.add(wid)
            else:
                version += 1
                path, body = rng.choice(
                    [
                        ("pause_generation", {}),
                        ("update_weight_version", {"new_version": f"v{version}"}),
                        ("continue_generation", {}),
                        ("flush_cache", None),
                    ]
                )
                st, headers, _ = http.request(
                    "POST", f"/v1/rl/engine/{path}?selector={SELECTOR}", body or b""
                )
                op_id = headers.get("x-smgrl-operation-id")
                if op_id:
                    seen.ops.add(op_id)
        except OSError:
            return  # the gateway was killed: this request got no answer


def journal_state(path: str) -> dict:
    """Read the journal after a kill: chain, every op's events, the registry it holds."""
    with SqliteStore.open(path, readonly=True) as store:
        report = store.verify()
        assert report.ok, report
        ops: dict[str, dict] = {}
        registered, removed = set(), set()
        for rec in store.read():
            e = rec.event
            kind = getattr(e, "TYPE", "")
            if kind == "control.started":
                ops[e.op_id] = {
                    "targets": [t["worker_id"] for t in e.targets],
                    "outcomes": set(),
                    "end": None,
                }
            elif kind == "control.outcome":
                ops[e.op_id]["outcomes"].add(e.worker_id)
            elif kind == "control.finished":
                ops[e.op_id]["end"] = "finished"
            elif kind == "control.interrupted":
                ops[e.op_id]["end"] = e
            elif kind == "worker.registered":
                registered.add(e.worker_id)
            elif kind == "worker.removed":
                removed.add(e.worker_id)
        fleet, _ = restore(store)
        registry = {w.id: (w.url, dict(w.caller_labels)) for w in fleet.registry}
    return {"ops": ops, "registered": registered, "removed": removed, "registry": registry}


def test_sigkill_at_random_points_loses_nothing_answered(fakes, gateway, tmp_path):
    rng = random.Random(SEED)
    urls = fakes("sglang", ENGINES, "--latency-ms", "15")
    journal = str(tmp_path / "crash.db")
    env = {"SMGRL_SNAPSHOT_EVERY": "40"}
    args = ["--enable-rl", "--disable-health-check", "--rl-fanout-concurrency", "2"]
    seen = Seen()
    interrupted_total = 0
    before_kill: dict | None = None
    for round_no in range(ROUNDS + 1):
        # A fresh port each round, retried if another test takes it first (the fixture's start).
        gw, _, port = gateway(*args, journal=journal, env=env)
        http = Http(f"http://127.0.0.1:{port}")

        if before_kill is not None:
            after = journal_state(journal)
            # Every operation the kill left open is now interrupted, naming its recorded targets.
            for op_id, op in before_kill["ops"].items():
                if op["end"] is not None:
                    continue
                end = after["ops"][op_id]["end"]
                assert end is not None and end != "finished", op_id
                assert end.reason == "gateway_restart"
                assert set(end.recorded_targets) == op["outcomes"]
                assert set(end.missing_targets) == set(op["targets"]) - op["outcomes"]
                interrupted_total += 1
                st, _, body = http.request("GET", f"/v1/rl/operations/{op_id}")
                assert st == 200 and body["result"] == "interrupted", body
            # The registry the restarted gateway serves is the one the journal held at the kill.
            st, _, listed = http.request("GET", "/workers")
            assert st == 200
            served = {w["id"]: (w["url"], w["labels"].get("n")) for w in listed["workers"]}
            assert served == {
                wid: (url, labels.get("n")) for wid, (url, labels) in before_kill["registry"].items()
            }
            assert after["registry"] == before_kill["registry"]

        if round_no == ROUNDS:
            break
        stop = threading.Event()
        client = threading.Thread(target=drive, args=(http, urls, random.Random(rng.random()), seen, stop))
        client.start()
        client.join(timeout=rng.uniform(0.25, MAX_RUN_SECS))
        gw.kill()  # SIGKILL, mid-traffic: no shutdown bookkeeping at all
        stop.set()
        client.join(timeout=30)
        assert not client.is_alive()

        before_kill = journal_state(journal)
        # Every answer the client received is in the journal.
        assert seen.ops <= {op for op, o in before_kill["ops"].items() if o["end"] == "finished"}
        assert set(seen.registered) <= before_kill["registered"]
        assert seen.removed <= before_kill["removed"]

    assert interrupted_total > 0, "no kill landed inside an operation: the test proved too little"
    gw.stop()
    result = subprocess.run(
        [sys.executable, "-m", "smgrl", "journal", "--journal", journal, "verify", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    report = json.loads(result.stdout)
    assert result.returncode == 0 and report["ok"], result.stdout + result.stderr
    assert any("equals a full replay" in note for note in report["notes"]), report

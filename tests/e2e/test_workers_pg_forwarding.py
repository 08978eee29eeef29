"""Two gateways as if on two hosts (separate ``smgrl launch`` processes and ports, each with
``--advertise-url``) on one PostgreSQL journal: a session created through A and a distributed
refit started through A are used through B, which forwards to A (docs/scale-out.md,
"Forwarding"); SIGKILL A: B answers 410 ``session_gone``, every answered turn is journaled, the
chain verifies. (Both run on this host, so B reaches A over A's private loopback listener; the
choice of the advertised URL for another host is tests/unit/test_forwarding_rules.py's.)"""

from __future__ import annotations

import json
import os
import signal

import pytest
from test_workers import request, wait_until
from test_workers_forwarding import raw_post, turn
from test_workers_pg import pg_url  # noqa: F401 - the module's PostgreSQL server fixture

from journal.postgres import PgStore
from smgrl.demo.procs import free_port, start_gateway, wait_listening
from smgrl.tito.testkit import make_model_dir

pytestmark = pytest.mark.e2e


def start(children, tmp_path, url: str, *args):
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / f"gateway-{port}.log", "w")  # noqa: SIM115 - held by the child for its lifetime
    child = start_gateway(
        ["--prometheus-port", str(free_port()), "--advertise-url", base, *args],
        port=port,
        env={"SMGRL_JOURNAL": url},
        log=log,
    )
    children.append(child)
    wait_listening(base, child=child)
    return child, base


def journal_events(url: str) -> list:
    store = PgStore.open(url, readonly=True)
    try:
        return [r.event for r in store.read()]
    finally:
        store.close()


def test_sessions_and_refit_hand_offs_are_forwarded_between_hosts(fakes, children, tmp_path, pg_url):  # noqa: F811
    tok = make_model_dir(tmp_path / "tok")
    urls = fakes("sglang", 2, "--tokenizer-path", str(tok), "--weight-version", "1")
    flags = ["--enable-rl", "--disable-health-check", "--tokenizer-path", str(tok), "--worker-urls", *urls]
    a, base_a = start(children, tmp_path, pg_url, *flags)
    _b, base_b = start(children, tmp_path, pg_url, *flags)
    for base in (base_a, base_b):
        wait_until(
            "both engines visible in both gateways",
            lambda base=base: len(request(base, "GET", "/v1/rl/workers")[2]["workers"]) == 2,
        )
    peers = {e.gateway: e for e in journal_events(pg_url) if e.TYPE == "gateway.peer"}
    assert sorted(p.advertise_url for p in peers.values()) == sorted([base_a, base_b])

    st, _, body = request(base_a, "POST", "/sessions")
    assert st == 201, body
    sid = body["session_id"]
    st, _, text = raw_post(base_b, f"/sessions/{sid}/v1/chat/completions", turn(1))
    assert st == 200 and json.loads(text)["choices"][0]["message"]["content"] == "answer 1", text
    st, _, text = raw_post(base_b, f"/sessions/{sid}/v1/chat/completions", turn(2, stream=True))
    assert st == 200 and "answer 2" in text and text.rstrip().endswith("data: [DONE]"), text

    source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500}}
    st, _, body = request(
        base_a,
        "POST",
        "/v1/rl/refits",
        {"selector": "engine=sglang", "source": source, "weight_version": "2"},
    )
    assert st == 202, body
    rid = body["refit_id"]
    wait_until(
        "awaiting_transfer",
        lambda: request(base_a, "GET", f"/v1/rl/refits/{rid}")[2]["state"] == "awaiting_transfer",
    )
    st, _, body = request(base_b, "POST", f"/v1/rl/refits/{rid}/commit", {})
    assert st == 202, body

    def finished():
        record = request(base_b, "GET", f"/v1/rl/refits/{rid}")[2]
        return record if record["result"] else None

    assert wait_until("the refit to finish", finished)["result"] == "succeeded"

    os.kill(a.pid, signal.SIGKILL)
    st, headers, text = raw_post(base_b, f"/sessions/{sid}/v1/chat/completions", turn(3))
    assert st == 410 and headers["x-smg-error-code"] == "session_gone", text
    events = journal_events(pg_url)
    assert [e.turn for e in events if e.TYPE == "session.turn" and e.session_id == sid] == [1, 2]
    store = PgStore.open(pg_url, readonly=True)
    try:
        assert store.verify().ok
    finally:
        store.close()

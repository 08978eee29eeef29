"""Two gateway processes on one SQLite journal, run in one trio process (``serve`` with a
``Sharing`` each, as two ``--workers`` processes are): a request for a session or a refit saga
that lands on the process not holding it is forwarded to its owner (smgrl/cluster/forwarding.py,
docs/scale-out.md "Forwarding"). Real loopback ports, real fake engines, a real journal file.
"""

from __future__ import annotations

import contextlib
import functools
import json

import httpx
import pytest
import trio

from journal import SqliteStore
from smgrl.cluster.sharing import PRESENCE, Sharing
from smgrl.core.config import Config, HealthConfig, RlConfig, SessionsConfig
from smgrl.fake import fake_fleet, model
from smgrl.runtime.server import serve
from smgrl.tito.testkit import make_model_dir

KEY = "data-plane-secret-key"
AUTH = {"authorization": f"Bearer {KEY}"}


def say(n: int, text: str) -> str:
    return f"[[fake-say:{n}:{json.dumps(text)}]]"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(tmp_path_factory.mktemp("fwd-model") / "chatml", "chatml")


def config(model_dir, urls, **kw) -> Config:
    return Config(
        port=0,
        prometheus_port=None,
        worker_urls=tuple(urls),
        policy="round_robin",
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        health=HealthConfig(enabled=False),
        sessions=SessionsConfig(tokenizer_path=str(model_dir)),
        shutdown_grace_period_secs=0,
        **kw,
    )


class Proc:
    def __init__(self, running, stop: trio.Event, done: trio.Event) -> None:
        self.gateway = running.gateway
        self.base = running.urls[0]
        self.stop = stop
        self.done = done
        self.client = httpx.AsyncClient(base_url=self.base, timeout=30)


@contextlib.asynccontextmanager
async def two_gateways(path: str, cfg: Config, cfg_b: Config | None = None):
    """Gateways A and B on the journal file ``path`` (B with ``cfg_b`` when given); each stops
    when its ``stop`` is set."""
    stores = [SqliteStore.open(path), SqliteStore.open(path)]
    procs: list[Proc] = []
    try:
        async with trio.open_nursery() as nursery:
            for store, tag, each in zip(stores, "ab", (cfg, cfg_b or cfg), strict=True):
                stop, done = trio.Event(), trio.Event()

                async def run(
                    store=store, tag=tag, cfg=each, stop=stop, done=done, task_status=trio.TASK_STATUS_IGNORED
                ):
                    try:
                        sharing = Sharing(identity=f"test-host:{tag}:{id(stop):x}")
                        await serve(cfg, shutdown=stop, store=store, sharing=sharing, task_status=task_status)
                    finally:
                        done.set()

                procs.append(Proc(await nursery.start(run), stop, done))
            try:
                yield procs
            finally:
                for p in procs:
                    await p.client.aclose()
                    p.stop.set()
    finally:
        for store in stores:
            store.close()


async def wait_visible(procs, count: int) -> None:
    with trio.fail_after(20):
        for p in procs:
            while sum(1 for w in p.gateway.fleet.registry if w.is_visible) < count:
                await trio.sleep(0.01)


def turn_body(n: int, stream: bool = False) -> dict:
    content = f"turn {n} " + say(1, f"answer {n}")
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 50}
    if stream:
        body["stream"] = True
    return body


async def test_a_session_is_served_whichever_process_a_request_lands_on(model_dir, tmp_path):
    """Created through A, used through B (a turn, a streamed turn, the snapshot, a TITO header
    turn, DELETE): B forwards to A, which holds it; the caller's key is checked by both. Once A
    stopped, B answers 410 session_gone naming why."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 2) as engines:
            cfg = config(model_dir, engines.urls, api_key=KEY)
            async with two_gateways(str(tmp_path / "j.db"), cfg) as (a, b):
                await wait_visible((a, b), 2)
                r = await a.client.post("/sessions", headers=AUTH)
                assert r.status_code == 201, r.text
                sid = r.json()["session_id"]
                assert sid in a.gateway.sessions.sessions

                # A plain turn and a streamed one, through B.
                r = await b.client.post(
                    f"/sessions/{sid}/v1/chat/completions", json=turn_body(1), headers=AUTH
                )
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["message"]["content"] == "answer 1"
                r = await b.client.post(
                    f"/sessions/{sid}/v1/chat/completions", json=turn_body(2, stream=True), headers=AUTH
                )
                assert r.status_code == 200, r.text
                assert r.headers["content-type"].startswith("text/event-stream")
                assert "answer 2" in r.text and r.text.rstrip().endswith("data: [DONE]")
                assert sid not in b.gateway.sessions.sessions  # held by A only
                assert a.gateway.sessions.sessions[sid].turns == 2

                # The caller's key: B refuses a request without it before forwarding; A (its
                # private port, as B reaches it) checks it again.
                r = await b.client.get(f"/sessions/{sid}")
                assert r.status_code == 401
                private = a.gateway.forwarder.me.url
                async with httpx.AsyncClient(base_url=private, timeout=30) as direct:
                    assert (await direct.get(f"/sessions/{sid}")).status_code == 401
                    assert (await direct.get(f"/sessions/{sid}", headers=AUTH)).status_code == 200
                snap = (await b.client.get(f"/sessions/{sid}", headers=AUTH)).json()
                assert snap["session_id"] == sid
                assert sum(len(t["records"]) for t in snap["trajectories"]) == 2

                # SMG's TITO header with a client-chosen id: created through A, a turn through B.
                tito = {**AUTH, "x-smg-tito-session-id": "agent-7"}
                r = await a.client.post("/v1/chat/completions", json=turn_body(3), headers=tito)
                assert r.status_code == 200, r.text
                r = await b.client.post("/v1/chat/completions", json=turn_body(4), headers=tito)
                assert r.status_code == 200, r.text
                assert "agent-7" not in b.gateway.sessions.sessions
                assert a.gateway.sessions.sessions["agent-7"].turns == 2

                # The session control routes through B cover A's sessions too.
                r = await b.client.post("/control/hang", json=[sid, "agent-7", "nobody"], headers=AUTH)
                assert r.status_code == 200, r.text
                assert sorted(r.json()["hung"]) == sorted([sid, "agent-7"]) and r.json()["missing"] == [
                    "nobody"
                ]
                assert a.gateway.sessions.sessions[sid].hang_state == "hung"
                r = await b.client.get("/control/sessions", headers=AUTH)
                listed = {x["session_id"]: x for x in r.json()["sessions"]}
                assert listed[sid]["hang_state"] == "hung" and "agent-7" in listed
                pin = {"session_id": sid, "base_worker_id": "w", "target_dp_rank": 0}
                r = await b.client.post("/control/continue", json=[pin, "agent-7"], headers=AUTH)
                assert sorted(r.json()["continued"]) == sorted([sid, "agent-7"]), r.text
                assert a.gateway.sessions.sessions[sid].hang_state != "hung"

                # DELETE through B drains and drops A's session.
                r = await b.client.delete(f"/sessions/{sid}", headers=AUTH)
                assert r.status_code == 204, r.text
                assert sid not in a.gateway.sessions.sessions
                r = await b.client.get(f"/sessions/{sid}", headers=AUTH)
                assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"

                # A stops: its sessions are gone; B says so (410), and never creates one in
                # A's place for the TITO id.
                r = await a.client.post("/sessions", headers=AUTH)
                other = r.json()["session_id"]
                a.stop.set()
                await a.done.wait()
                r = await b.client.post(
                    f"/sessions/{other}/v1/chat/completions", json=turn_body(5), headers=AUTH
                )
                assert r.status_code == 410, r.text
                assert r.json()["error"]["code"] == "session_gone"
                assert "does not answer" in r.json()["error"]["message"]
                r = await b.client.post("/v1/chat/completions", json=turn_body(6), headers=tito)
                assert r.status_code == 410 and r.json()["error"]["code"] == "session_gone", r.text
                assert "agent-7" not in b.gateway.sessions.sessions
    with SqliteStore.open(str(tmp_path / "j.db"), readonly=True) as store:
        turns = [rec.event for rec in store.read(types=["session.turn"])]
        assert [t.session_id for t in turns] == [sid, sid, "agent-7", "agent-7"]
        peers = [rec.event for rec in store.read(types=["gateway.peer"])]
        assert len(peers) == 2 and all(p.url.startswith("http://127.0.0.1:") for p in peers)
        raw = "\n".join(row[5] for row in store.read_raw())
        assert KEY not in raw  # the caller's key never reaches the journal
        assert store.verify().ok


async def test_a_refit_commit_reaches_the_process_driving_the_saga(model_dir, tmp_path):
    """A distributed refit started through A; the trainer's transfer chunk and commit land on B:
    B forwards them to A (which holds the hand-off), the saga succeeds. A commit to a saga whose
    process stopped is a retryable 503 refit_driver_unavailable until B's recovery resumes the
    saga (no chunk was cut short: it waits for the trainer again); then it commits."""
    source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500}}
    body = {"selector": "engine=sglang", "source": source, "weight_version": "9"}
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 2) as engines:
            cfg = config(model_dir, engines.urls)
            async with two_gateways(str(tmp_path / "j.db"), cfg) as (a, b):
                await wait_visible((a, b), 2)
                r = await a.client.post("/v1/rl/refits", json=body)
                assert r.status_code == 202, r.text
                rid = r.json()["refit_id"]
                while a.gateway.fleet.sagas.get(rid).state != "awaiting_transfer":
                    await a.gateway.refits.change_event().wait()
                assert a.gateway.refits.drives(rid) and not b.gateway.refits.drives(rid)
                chunk = {"names": ["w"], "dtypes": ["float32"], "shapes": [[2, 2]]}
                r = await b.client.post(f"/v1/rl/refits/{rid}/transfer", json=chunk)
                assert r.status_code == 200, r.text
                assert {x["result"] for x in r.json()["results"]} == {"ok"}
                r = await b.client.post(f"/v1/rl/refits/{rid}/commit")
                assert r.status_code == 202, r.text
                while a.gateway.fleet.sagas.get(rid).is_open:
                    await a.gateway.refits.change_event().wait()
                assert a.gateway.fleet.sagas.get(rid).result == "succeeded"
                assert {e.weight_version for e in engines} == {"9"}
                # The trainer retrying its commit (its first answer lost) is told it was taken;
                # a fail after it is refused.
                r = await b.client.post(f"/v1/rl/refits/{rid}/commit")
                assert r.status_code == 202 and r.json()["result"] == "succeeded", r.text
                r = await b.client.post(f"/v1/rl/refits/{rid}/fail")
                assert r.status_code == 409 and r.json()["error"] == "refit_state", r.text
                # Each forwarded hand-off is audited once (by A, which served it), one request id.
                await b.gateway.journal.catch_up()
                with SqliteStore.open(str(tmp_path / "j.db"), readonly=True) as store:
                    audited = [
                        r.event
                        for r in store.read(types=["audit.control_plane"])
                        if r.event.path.startswith(f"/v1/rl/refits/{rid}/")
                    ]
                assert sorted(e.path.rsplit("/", 1)[1] for e in audited) == [
                    "commit",
                    "commit",
                    "fail",
                    "transfer",
                ]

                # A second refit, then A stops before the trainer commits: B answers a retryable
                # 503 until its recovery resumes the saga; then the trainer's commit succeeds.
                body["weight_version"] = "10"
                r = await a.client.post("/v1/rl/refits", json=body)
                assert r.status_code == 202, r.text
                rid2 = r.json()["refit_id"]
                while a.gateway.fleet.sagas.get(rid2).state != "awaiting_transfer":
                    await a.gateway.refits.change_event().wait()
                a.stop.set()
                await a.done.wait()
                await b.gateway.journal.catch_up()
                r = await b.client.post(f"/v1/rl/refits/{rid2}/commit")
                assert r.status_code == 503, r.text
                assert r.json()["error"] == "refit_driver_unavailable"
                assert "does not answer" in r.json()["message"]
                saga = b.gateway.fleet.sagas.get(rid2)
                while not (b.gateway.refits.drives(rid2) and saga.state == "awaiting_transfer"):
                    await b.gateway.refits.change_event().wait()
                r = await b.client.post(f"/v1/rl/refits/{rid2}/commit")
                assert r.status_code == 202, r.text
                while saga.is_open:
                    await b.gateway.refits.change_event().wait()
                assert saga.result == "succeeded", saga.to_json()
                assert {e.weight_version for e in engines} == {"10"}
    with SqliteStore.open(str(tmp_path / "j.db"), readonly=True) as store:
        assert store.verify().ok


async def test_a_chunk_cut_short_by_the_drivers_stop_leaves_the_transfer_unknown(model_dir, tmp_path):
    """The driver A stops while a transfer chunk's engine calls are in flight (the engines hang):
    what the engines received is unknown, so B's recovery, resuming the saga, does not wait for
    the trainer again: it reads the versions back (the old one: no commit yet), quarantines, and
    the trainer's commit gets a final 409 refit_state (never a resume on unknown weights)."""
    source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500}}
    body = {"selector": "engine=sglang", "source": source, "weight_version": "9"}
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 2) as engines:
            cfg = config(model_dir, engines.urls)
            async with two_gateways(str(tmp_path / "j.db"), cfg) as (a, b):
                await wait_visible((a, b), 2)
                r = await a.client.post("/v1/rl/refits", json=body)
                assert r.status_code == 202, r.text
                rid = r.json()["refit_id"]
                while a.gateway.fleet.sagas.get(rid).state != "awaiting_transfer":
                    await a.gateway.refits.change_event().wait()
                for engine in engines:
                    engine.set_knobs(hang=True)
                chunk = {"names": ["w"], "dtypes": ["float32"], "shapes": [[2, 2]]}

                async def trainer_chunk():
                    with contextlib.suppress(httpx.HTTPError):  # its driver stops mid-call
                        await a.client.post(f"/v1/rl/refits/{rid}/transfer", json=chunk)

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(trainer_chunk)
                    for engine in engines:
                        await engine.wait_until(
                            lambda e=engine: e.calls_to("/update_weights_from_distributed"), 10
                        )
                    a.stop.set()
                    await a.done.wait()
                for engine in engines:
                    engine.set_knobs(hang=False)
                await b.gateway.journal.catch_up()
                saga = b.gateway.fleet.sagas.get(rid)
                while saga.is_open:
                    await b.gateway.refits.change_event().wait()
                # Neither engine reached the new version: the saga failed, both engines quarantined
                # (docs/refits.md, the results table).
                assert saga.result == "failed", saga.to_json()
                assert all(run.status == "quarantined" for run in saga.engines.values()), saga.to_json()
                r = await b.client.post(f"/v1/rl/refits/{rid}/commit")
                assert r.status_code == 409 and r.json()["error"] == "refit_state", r.text
                assert "9" not in {e.weight_version for e in engines}
    with SqliteStore.open(str(tmp_path / "j.db"), readonly=True) as store:
        assert store.verify().ok


async def test_a_tito_id_created_by_two_processes_at_once_is_one_session(model_dir, tmp_path):
    """SMG creates a TITO session on its first turn. B decides to create `agent-9` on a journal
    position read before A created it (the two first turns at once): B's conditional append is
    refused, and B forwards the turn to A instead of holding a second session of the same id."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 1) as engines:
            path = str(tmp_path / "j.db")
            async with two_gateways(path, config(model_dir, engines.urls)) as (a, b):
                await wait_visible((a, b), 1)
                fwd = b.gateway.forwarder
                before = await fwd.session_owner("agent-9")  # B's read: not created yet
                assert before[0] is None
                tito = {"x-smg-tito-session-id": "agent-9"}
                r = await a.client.post("/v1/chat/completions", json=turn_body(1), headers=tito)
                assert r.status_code == 200, r.text
                real = fwd.session_owner
                # B's two reads (whom to forward to; then, creating, the position it decides on)
                # ran before A's creation, B's append after it.
                stale = [before, before]

                async def first_stale(sid):
                    return stale.pop() if stale and sid == "agent-9" else await real(sid)

                fwd.session_owner = first_stale
                r = await b.client.post("/v1/chat/completions", json=turn_body(2), headers=tito)
                assert r.status_code == 200, r.text
                assert not stale
                assert "agent-9" not in b.gateway.sessions.sessions
                assert a.gateway.sessions.sessions["agent-9"].turns == 2
    with SqliteStore.open(path, readonly=True) as store:
        created = [r.event for r in store.read(types=["session.created"])]
        assert [(c.session_id, c.owner) for c in created] == [("agent-9", a.gateway.sessions.owner)]


async def test_first_turns_of_one_tito_id_at_once_on_one_process_are_one_session(model_dir, tmp_path):
    """Several first turns of one client-chosen TITO id reach the same process at once. Each
    reads the journal (whom does it belong to?) before creating it: the first creation must be
    found by the others, never replaced by a second `session.created`, nor lost (410)."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 1) as engines:
            path = str(tmp_path / "j.db")
            async with two_gateways(path, config(model_dir, engines.urls)) as (a, b):
                await wait_visible((a, b), 1)
                tito = {"x-smg-tito-session-id": "agent-7"}
                answers = []

                async def first_turn(n):
                    r = await a.client.post("/v1/chat/completions", json=turn_body(n), headers=tito)
                    answers.append(r.status_code)

                async with trio.open_nursery() as nursery:
                    for n in range(6):
                        nursery.start_soon(first_turn, n)
                assert answers == [200] * 6
                assert a.gateway.sessions.sessions["agent-7"].turns == 6
    with SqliteStore.open(path, readonly=True) as store:
        created = [r.event for r in store.read(types=["session.created"])]
        assert [c.session_id for c in created] == ["agent-7"]


async def test_a_control_request_from_another_host_reaches_the_process_it_was_meant_for(model_dir, tmp_path):
    """A gateway on another host sends a /control request to A's --advertise-url, shared by
    every process of A's host (one port, or its load balancer): it lands on B, marked as sent
    once (`x-smgrl-forwarded: 1`) for A (`x-smgrl-forwarded-to`). B passes it to A over
    loopback (the second hop), instead of answering with its own sessions: A's would be
    `missing`, and B's listed as A's."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 1) as engines:
            cfg = config(model_dir, engines.urls, api_key=KEY)
            async with two_gateways(str(tmp_path / "j.db"), cfg) as (a, b):
                await wait_visible((a, b), 1)
                sid = (await a.client.post("/sessions", headers=AUTH)).json()["session_id"]
                mine = (await b.client.post("/sessions", headers=AUTH)).json()["session_id"]
                hop = {**AUTH, "x-smgrl-forwarded": "1", "x-smgrl-forwarded-to": a.gateway.sessions.owner}
                r = await b.client.post("/control/hang", json=[sid], headers=hop)
                assert r.status_code == 200, r.text
                assert r.json()["hung"] == [sid] and r.json()["missing"] == []
                assert a.gateway.sessions.sessions[sid].hang_state == "hung"
                r = await b.client.get("/control/sessions", headers=hop)
                assert [x["session_id"] for x in r.json()["sessions"]] == [sid]  # A's, not B's
                assert mine in b.gateway.sessions.sessions


async def test_an_owner_breaking_off_mid_answer_ends_the_answer_without_an_error_logged(
    model_dir, tmp_path, caplog
):
    """The owning process starts its answer, then its connection breaks (killed mid-stream): the
    client's answer ends cut off (its connection closed), with the one warning line of the
    forwarder, never an "unhandled error" traceback (it is not a bug of this process)."""
    import logging

    from smgrl.cluster.forwarding import Peer, owner_key

    async def breaks_off(stream):
        await stream.receive_some()
        await stream.send_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: \r\n")
        await stream.aclose()

    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 1) as engines, trio.open_nursery() as nursery:
            (listener,) = await nursery.start(
                functools.partial(trio.serve_tcp, breaks_off, 0, host="127.0.0.1")
            )
            async with two_gateways(str(tmp_path / "j.db"), config(model_dir, engines.urls)) as (_, b):
                host = b.gateway.forwarder.me.host
                gone = "test-host:gone:1"
                peer = Peer(
                    gone, owner_key(gone), host, f"http://127.0.0.1:{listener.socket.getsockname()[1]}"
                )
                with SqliteStore.open(str(tmp_path / "j.db")) as store:
                    store.take_lease(PRESENCE + gone, gone, 60)  # alive, as far as leases tell
                await b.gateway.journal.append(f"peer:{peer.owner}", peer.event())
                sid = f"{peer.owner}-{'0' * 32}"
                with caplog.at_level(logging.WARNING), pytest.raises(httpx.RemoteProtocolError):
                    await b.client.post(f"/sessions/{sid}/v1/chat/completions", json=turn_body(1))
                errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
                assert not errors, [r.getMessage() for r in errors]
                assert any("forwarding failed" in r.getMessage() for r in caplog.records)
            nursery.cancel_scope.cancel()

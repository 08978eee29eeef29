"""Forwarding between gateway processes attacked as a client would (docs/scale-out.md,
"Forwarding"): two gateways on one SQLite journal in one trio process, real loopback ports, real
fake engines, a real journal file (the fixtures of test_forwarding_in_process.py).
"""

from __future__ import annotations

from functools import partial

import trio
from test_forwarding_in_process import AUTH, KEY, config, model_dir, turn_body, two_gateways, wait_visible

from journal import SqliteStore
from smgrl.cluster.forwarding import owner_key
from smgrl.cluster.sharing import PRESENCE
from smgrl.events import GatewayPeer, RefitState
from smgrl.fake import fake_fleet, model

__all__ = ["model_dir"]  # the module-scoped fixture, shared


async def _listener(nursery, seen: list[bytes], hold: float = 5) -> int:
    """A loopback server that is not a gateway (what a dead process's port may be reused by):
    records every byte it receives, answers nothing."""

    async def handler(stream) -> None:
        with trio.move_on_after(hold):
            async for data in stream:
                seen.append(bytes(data))

    listeners = await nursery.start(partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    return listeners[0].socket.getsockname()[1]


async def test_a_stale_peer_of_an_earlier_process_never_gets_the_callers_key(model_dir, tmp_path):
    """A session id naming the owner of a process that is gone (its ``gateway.peer`` still in the
    journal, its presence lease not held), whose loopback port is now another program's: the
    request is answered 410 ``session_gone`` here, and nothing (the caller's key least of all)
    is sent to that port."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 1) as engines, trio.open_nursery() as nursery:
            seen: list[bytes] = []
            port = await _listener(nursery, seen)
            cfg = config(model_dir, engines.urls, api_key=KEY)
            async with two_gateways(str(tmp_path / "j.db"), cfg) as (a, b):
                await wait_visible((a, b), 1)
                me = a.gateway.forwarder.me
                owner = "abcdefabcdef"
                stale = GatewayPeer(
                    gateway=f"{me.host}:999999:deadbeef",
                    owner=owner,
                    host=me.host,
                    url=f"http://127.0.0.1:{port}",
                    advertise_url=None,
                )
                await a.gateway.journal.append(f"peer:{owner}", stale)
                sid = f"{owner}-{'0' * 32}"
                r = await a.client.post(
                    f"/sessions/{sid}/v1/chat/completions", json=turn_body(1), headers=AUTH
                )
                assert KEY.encode() not in b"".join(seen)
                assert seen == []  # not even a connection's first bytes
                assert r.status_code == 410, r.text
                assert r.headers["x-smg-error-code"] == "session_gone"
                assert "is not running" in r.json()["error"]["message"]
            nursery.cancel_scope.cancel()


async def test_a_hung_driver_does_not_hold_the_trainers_hand_off(model_dir, tmp_path):
    """The saga's driver (per the journal) is alive (its presence lease held) but never answers:
    the trainer's commit through B answers 503 ``refit_driver_unavailable`` once the control
    timeout plus a margin passed, instead of hanging."""
    source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500}}
    body = {"selector": "engine=sglang", "source": source, "weight_version": "9"}
    path = str(tmp_path / "j.db")
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 1) as engines, trio.open_nursery() as nursery:
            seen: list[bytes] = []
            port = await _listener(nursery, seen, hold=60)
            async with two_gateways(path, config(model_dir, engines.urls)) as (a, b):
                await wait_visible((a, b), 1)
                r = await a.client.post("/v1/rl/refits", json=body)
                assert r.status_code == 202, r.text
                rid = r.json()["refit_id"]
                while a.gateway.fleet.sagas.get(rid).state != "awaiting_transfer":
                    await a.gateway.refits.change_event().wait()
                me = a.gateway.forwarder.me
                hung = f"{me.host}:999998:0badc0de"
                with SqliteStore.open(path) as store:
                    store.take_lease(PRESENCE + hung, hung, 60)  # alive, as far as leases tell
                peer = GatewayPeer(
                    gateway=hung,
                    owner=owner_key(hung),
                    host=me.host,
                    url=f"http://127.0.0.1:{port}",
                    advertise_url=None,
                )
                await a.gateway.journal.append(f"peer:{owner_key(hung)}", peer)
                resumed = RefitState(refit_id=rid, state="recovering", gateway=hung)
                await a.gateway.journal.append(f"refit:{rid}", resumed)
                await b.gateway.journal.catch_up()
                r = await b.client.post(f"/v1/rl/refits/{rid}/commit", timeout=50)
                assert r.status_code == 503, r.text
                assert r.json()["error"] == "refit_driver_unavailable"
                assert "did not answer within" in r.json()["message"]
                assert seen  # it was asked
            nursery.cancel_scope.cancel()


async def test_a_client_leaving_a_forwarded_stream_cancels_the_owners_engine_call(model_dir, tmp_path):
    """A streamed turn of A's session sent through B; the engine holds it (never answers). The
    client leaves: B closes the forwarded exchange, A sees its connection close and cancels the
    turn, and the engine's connection for it is closed (nothing left running anywhere)."""
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 1) as engines:
            (engine,) = engines
            async with two_gateways(str(tmp_path / "j.db"), config(model_dir, engines.urls)) as (a, b):
                await wait_visible((a, b), 1)
                r = await a.client.post("/sessions")
                assert r.status_code == 201, r.text
                sid = r.json()["session_id"]
                engine.set_knobs(hang=True)
                calls = len(engine.calls)

                async def client() -> None:
                    url = f"/sessions/{sid}/v1/chat/completions"
                    async with b.client.stream("POST", url, json=turn_body(1, stream=True)) as resp:
                        async for _ in resp.aiter_bytes():
                            pass

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(client)
                    assert await engine.wait_until(lambda: len(engine.calls) > calls, 20)
                    held = engine.server.open_connections  # the turn's among them
                    nursery.cancel_scope.cancel()  # the client leaves mid-stream
                # The owner cancelled the engine call: the turn's connection is closed.
                # (polled: the fake notifies no event when a connection closes)
                with trio.move_on_after(20):
                    while engine.server.open_connections >= held:
                        await trio.sleep(0.02)
                assert engine.server.open_connections < held, (held, engine.server.open_connections)
                engine.set_knobs(hang=False)
                # The session still serves its next turn (the cancelled one left it usable).
                r = await b.client.post(f"/sessions/{sid}/v1/chat/completions", json=turn_body(2))
                assert r.status_code == 200, r.text


async def test_forwarded_hand_offs_log_no_key_and_each_process_checks_its_own(model_dir, tmp_path, caplog):
    """Control-plane keys rotated between the processes (A knows only the old admin key, B only
    the new): a trainer's commit through B with the new key is accepted by B and refused by A,
    the driver (its 401 passes through); with the old key B refuses it itself. Forging the
    internal headers changes none of that. No key appears in any log line of either process,
    at DEBUG."""
    import logging

    from smgrl.core.auth import ControlPlaneKey

    old, new = "old-admin-secret-0001", "new-admin-secret-0002"
    source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500}}
    body = {"selector": "engine=sglang", "source": source, "weight_version": "9"}
    caplog.set_level(logging.DEBUG)
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with fake_fleet("sglang", 1) as engines:
            cfg_a = config(
                model_dir, engines.urls, control_plane_keys=(ControlPlaneKey("k1", "t", "admin", old),)
            )
            cfg_b = config(
                model_dir, engines.urls, control_plane_keys=(ControlPlaneKey("k2", "t", "admin", new),)
            )
            async with two_gateways(str(tmp_path / "j.db"), cfg_a, cfg_b) as (a, b):
                await wait_visible((a, b), 1)
                r = await a.client.post(
                    "/v1/rl/refits", json=body, headers={"authorization": f"Bearer {old}"}
                )
                assert r.status_code == 202, r.text
                rid = r.json()["refit_id"]
                while a.gateway.fleet.sagas.get(rid).state != "awaiting_transfer":
                    await a.gateway.refits.change_event().wait()
                url = f"/v1/rl/refits/{rid}/commit"
                forged = {"x-smgrl-forwarded": "1", "x-smgrl-forwarded-to": a.gateway.forwarder.me.owner}
                for headers in ({}, forged):
                    r = await b.client.post(url, headers={**headers, "authorization": f"Bearer {new}"})
                    assert r.status_code == 401, r.text  # A, the driver, does not know it
                    r = await b.client.post(url, headers={**headers, "authorization": f"Bearer {old}"})
                    assert r.status_code == 401, r.text  # B does not know it
                    r = await b.client.post(url, headers=headers)
                    assert r.status_code == 401, r.text
                assert a.gateway.fleet.sagas.get(rid).state == "awaiting_transfer"
                r = await a.client.post(url, headers={"authorization": f"Bearer {old}"})
                assert r.status_code == 202, r.text
    text = "\n".join(rec.getMessage() + repr(rec.__dict__) for rec in caplog.records)
    assert "smgrl.forwarding" in text or "forward" in text
    assert old not in text and new not in text


async def test_a_driver_that_was_taken_over_stops_at_its_next_record(model_dir, tmp_path):
    """A stalls long enough to be judged gone, and another process resumes its saga (journals a
    ``recovering`` naming itself). When A goes on (here: its transfer timeout fires), it records
    nothing more and stops driving: never two drivers of one saga."""
    source = {"distributed": {"master_address": "127.0.0.1", "master_port": 29500}}
    body = {"selector": "engine=sglang", "source": source, "weight_version": "9", "transfer_timeout_secs": 1}
    with model.tokenizer_scope(model_dir), trio.fail_after(60):
        async with (
            fake_fleet("sglang", 1) as engines,
            two_gateways(str(tmp_path / "j.db"), config(model_dir, engines.urls)) as (a, b),
        ):
            await wait_visible((a, b), 1)
            r = await a.client.post("/v1/rl/refits", json=body)
            assert r.status_code == 202, r.text
            rid = r.json()["refit_id"]
            saga = a.gateway.fleet.sagas.get(rid)
            while saga.state != "awaiting_transfer":
                await a.gateway.refits.change_event().wait()
            other = b.gateway.forwarder.me.gateway
            await b.gateway.journal.append(
                f"refit:{rid}", RefitState(refit_id=rid, state="recovering", gateway=other)
            )
            while a.gateway.refits.drives(rid):  # until its timeout fired and it stopped
                await a.gateway.refits.change_event().wait()
            await a.gateway.journal.catch_up()
            assert saga.is_open and saga.state == "recovering", saga.to_json()
            assert saga.transfer_verdict is None  # A recorded no transfer_failed
            # (a resumer waits what is left of the timeout: counted from the journal's time)
            assert saga.awaiting_since is not None

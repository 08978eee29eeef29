"""Forwarding between gateway processes attacked as a client would (docs/scale-out.md,
"Forwarding"): two gateways on one SQLite journal in one trio process, real loopback ports, real
fake engines, a real journal file (the fixtures of test_forwarding_in_process.py).
"""

from __future__ import annotations

from functools import partial

import trio
from test_forwarding_in_process import AUTH, KEY, config, model_dir, turn_body, two_gateways, wait_visible

from smgrl.fake import fake_fleet, model
from smgrl.journaling import ev

__all__ = ["model_dir"]  # the module-scoped fixture, shared


async def _listener(nursery, seen: list[bytes]) -> int:
    """A loopback server that is not a gateway (what a dead process's port may be reused by):
    records every byte it receives, answers nothing."""

    async def handler(stream) -> None:
        with trio.move_on_after(5):
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
                stale = ev(
                    "gateway.peer",
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

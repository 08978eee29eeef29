"""Memory bounds on the data plane's hot paths: every byte of a rollout body or a
buffered answer is taken from --dataplane-memory-budget before it is kept; a declared body that
would not fit is refused before it is read."""

from __future__ import annotations

import json

import attrs
import pytest
import trio
import trio.testing

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.core.errors import MemoryBudgetExceeded
from smgrl.dataplane.budget import ByteBudget
from smgrl.testing import gateway_in_process
from smgrl.testing.dataplane import PROBE_MODEL, ScriptedEngine


def cfg(budget: int, body: int) -> Config:
    return Config(
        rl=RlConfig(enabled=True),
        policy="round_robin",
        dataplane=DataPlaneConfig(memory_budget=budget, max_body_size=body),
    )


def test_a_hold_takes_until_the_budget_is_spent_and_gives_everything_back():
    budget = ByteBudget(100)
    a, b = budget.hold(), budget.hold()
    a.take(60)
    with pytest.raises(MemoryBudgetExceeded):
        b.take(41)
    b.take(40)
    assert budget.used == 100
    a.release()
    a.release()  # idempotent
    assert budget.used == 40
    b.release()
    assert budget.used == 0


def padded(size: int) -> bytes:
    """A /generate body of exactly ``size`` bytes."""
    head = b'{"text": "x", "pad": "'
    return head + b"p" * (size - len(head) - 2) + b'"}'


async def test_bodies_past_the_budget_are_refused_before_they_are_read_and_the_budget_comes_back():
    release = trio.Event()

    async def script(req, w):
        if b'"hold"' in req.body:
            await release.wait()
        await w.full(200, json.dumps({"text": "ok"}).encode())

    engine = ScriptedEngine(script)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.serve)
        async with gateway_in_process(cfg(budget=1000, body=600), worker_urls=[engine.url]) as gw:
            dp = gw.app.dataplane
            r = await gw.client.post("/generate", content=padded(601))
            assert r.status_code == 413  # over --dataplane-max-body-size
            first = []

            async def held():
                body = b'{"text": "hold", "pad": "' + b"p" * 470 + b'"}'
                first.append(await gw.client.post("/generate", content=body))

            nursery.start_soon(held)
            while engine.active < 1:
                await trio.sleep(0.001)
            assert dp.budget.used == 497
            r = await gw.client.post("/generate", content=padded(600))
            assert r.status_code == 503
            assert r.json()["error"]["code"] == "memory_budget_exceeded" and r.json()["error"]["retryable"]
            assert len(engine.seen) == 1  # never reached an engine
            r = await gw.client.post("/generate", content=padded(400))
            assert r.status_code == 200
            release.set()
            while not first:
                await trio.sleep(0.001)
            assert first[0].status_code == 200 and dp.budget.used == 0
            text = gw.gateway.metrics.render().decode()
            assert "smgrl_dataplane_memory_held_bytes 0.0" in text
        nursery.cancel_scope.cancel()


async def test_a_buffered_answer_past_the_budget_is_a_503_and_a_stream_is_relayed():
    async def script(req, w):
        if b'"stream": true' in req.body:
            await w.start()
            for _ in range(5):
                await w.chunk(b"data: " + b"x" * 400 + b"\n\n")
            await w.end()
            return
        if b'"chunked"' in req.body:  # no declared length: taken piece by piece
            await w.start(content_type="application/json")
            for _ in range(4):
                await w.chunk(b" " * 400)
            await w.end()
            return
        await w.full(200, json.dumps({"text": "y" * 2000}).encode())

    engine = ScriptedEngine(script)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.serve)
        async with gateway_in_process(cfg(budget=1000, body=500), worker_urls=[engine.url]) as gw:
            for text in ("x", "chunked"):
                r = await gw.client.post("/generate", json={"text": text})
                assert r.status_code == 503 and r.json()["error"]["code"] == "memory_budget_exceeded"
                assert gw.app.dataplane.budget.used == 0
            chat = {"model": PROBE_MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True}
            r = await gw.client.post("/v1/chat/completions", json=chat)
            assert r.status_code == 200 and len(r.content) > 2000  # streams hold nothing
            assert gw.app.dataplane.budget.used == 0
        nursery.cancel_scope.cancel()


async def test_large_control_plane_bodies_have_a_concurrency_bound_of_their_own():
    release = trio.Event()

    async def script(req, w):
        if req.path.startswith("/update_weights_from_tensor"):
            await release.wait()
        await w.full(200, b"{}")

    engine = ScriptedEngine(script)
    big = b'{"serialized_named_tensors": ["' + b"t" * (2 << 20) + b'"]}'
    config = Config(rl=RlConfig(enabled=True), max_concurrent_large_bodies=1)
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.serve)
        async with gateway_in_process(config, worker_urls=[engine.url]) as gw:
            wid = gw.gateway.fleet.registry.id_for_url(engine.url)
            url = f"/v1/rl/workers/{wid}/engine/update_weights_from_tensor"
            answers = []

            async def refit():
                answers.append(
                    await gw.client.post(url, content=big, headers={"content-type": "application/json"})
                )

            nursery.start_soon(refit)
            nursery.start_soon(refit)
            while engine.active < 1:
                await trio.sleep(0.001)
            # One large body at a time: the second waits for the slot, before its body is read.
            await trio.testing.wait_all_tasks_blocked()
            assert engine.active == 1 and len(engine.seen) == 1
            # Small control bodies never wait.
            r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/flush_cache", json={})
            assert r.status_code == 200
            release.set()
            while len(answers) < 2:
                await trio.sleep(0.001)
            assert [a.status_code for a in answers] == [200, 200] and len(engine.seen) == 3
        nursery.cancel_scope.cancel()


def test_a_discarded_answer_gives_its_bytes_back():
    budget = ByteBudget(100)
    hold = budget.hold()
    hold.take(30)  # the body
    mark = hold.held
    hold.take(50)  # an answer cut short, retried
    hold.back_to(mark)
    assert budget.used == 30 and hold.held == 30
    hold.release()
    assert budget.used == 0


async def test_an_unauthenticated_body_takes_nothing_from_the_budget():
    # Found against a live gateway: 16 connections without a key, each declaring a 64 MiB
    # /generate body and sending one byte, held the whole --dataplane-memory-budget (the body was
    # read, and its bytes reserved, before the key was checked): every rollout got 503
    # memory_budget_exceeded for as long as they stalled (up to --request-timeout-secs).
    stalled = trio.Event()

    async def stall():
        yield b"{"
        await stalled.wait()

    engine = ScriptedEngine()
    config = attrs.evolve(cfg(budget=1000, body=900), api_key="secret")
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.serve)
        async with gateway_in_process(config, worker_urls=[engine.url]) as gw:
            answers = []

            async def stranger():
                answers.append(
                    await gw.client.post("/generate", content=stall(), headers={"content-length": "900"})
                )

            nursery.start_soon(stranger)
            with trio.fail_after(10):
                while not answers:  # refused before its body is read: it never needs the rest
                    await trio.sleep(0.001)
            assert answers[0].status_code == 401 and gw.app.dataplane.budget.used == 0
            key = {"authorization": "Bearer secret"}
            r = await gw.client.post("/generate", content=padded(500), headers=key)
            assert r.status_code == 200
            stalled.set()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("limits", "trickle", "message"),
    [
        # SMG's bound: no byte for --stream-body-stall-timeout-secs, with SMG's text.
        ({"stall_timeout_secs": 0.2}, False, "No request body bytes arrived from the client for 0.2 seconds"),
        # smgrl's: the whole body within --dataplane-body-timeout-secs, however it trickles (a
        # byte every 50 ms never stalls; without the deadline it held the budget for 900 x 50 ms).
        ({"stall_timeout_secs": 0, "body_timeout_secs": 0.3}, True, "did not arrive within 0.3 seconds"),
    ],
)
async def test_a_stalled_body_with_the_key_times_out_and_gives_its_budget_back(limits, trickle, message):
    # Found against a live gateway: a client WITH the data-plane key declaring a 900-byte body and
    # sending one byte held those 900 bytes of the budget (and its task) up to
    # --request-timeout-secs; a few such clients refused every rollout with 503. Now SMG's 408
    # request_body_stalled, the budget released.
    stalled = trio.Event()

    async def stall():
        yield b"{"
        if trickle:
            for _ in range(898):
                await trio.sleep(0.05)  # the client's pace is what is under test
                yield b" "
        await stalled.wait()

    engine = ScriptedEngine()
    base = cfg(budget=1000, body=900)
    dataplane = attrs.evolve(base.dataplane, **{"body_timeout_secs": 30.0, **limits})
    config = attrs.evolve(base, api_key="secret", dataplane=dataplane)
    key = {"authorization": "Bearer secret"}
    async with trio.open_nursery() as nursery:
        await nursery.start(engine.serve)
        async with gateway_in_process(config, worker_urls=[engine.url]) as gw:
            answers = []

            async def trickler():
                answers.append(
                    await gw.client.post(
                        "/generate", content=stall(), headers={**key, "content-length": "900"}
                    )
                )

            nursery.start_soon(trickler)
            with trio.fail_after(10):
                while gw.app.dataplane.budget.used != 900:  # declared: reserved before it is read
                    await trio.sleep(0.001)
                while not answers:
                    await trio.sleep(0.001)
            r = answers[0]
            assert r.status_code == 408, r.text
            assert r.json()["error"]["code"] == "request_body_stalled"
            assert r.headers["x-smg-error-code"] == "request_body_stalled"
            assert message in r.json()["error"]["message"]
            assert gw.app.dataplane.budget.used == 0
            ok = await gw.client.post("/generate", content=padded(900), headers=key)
            assert ok.status_code == 200
            assert len(engine.seen) == 1  # only the second: the stalled body never reached it
            stalled.set()
        nursery.cancel_scope.cancel()

"""The state-aware filter: paused/asleep engines are never selected, engines whose
state is unknown or whose last refit failed are held out until a later call confirms them, and
while every engine is held out requests wait in the gateway (woken by the journal's commit, not a
timer) until one resumes, or get a retryable 503 naming why once the budget is spent."""

from __future__ import annotations

import uuid

import attrs
import trio

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.events import ControlFinished, ControlOutcome, ControlStarted, WorkerHealthChanged
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

GEN = {"text": "hello", "sampling_params": {"max_new_tokens": 1}}


def cfg(wait: float | None = None, **kw) -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        dataplane=DataPlaneConfig(eligible_wait_secs=wait),
        **kw,
    )


async def routed_set(gw, n: int = 6) -> set[str]:
    out = set()
    for _ in range(n):
        r = await gw.client.post("/generate", json=GEN)
        assert r.status_code == 200, r.text
        out.add(r.headers["x-smgrl-worker-id"])
    return out


async def call(gw, wid: str, path: str, body=None):
    r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/{path}", json=body if body is not None else {})
    assert r.status_code == 200, r.text
    return r


async def fanout(gw, path: str, body=None, selector: str = "engine=sglang"):
    r = await gw.client.post(f"/v1/rl/engine/{path}", params={"selector": selector}, json=body or {})
    assert r.status_code == 200, r.text


def ids(gw, fleet) -> list[str]:
    return [gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls]


async def test_paused_and_asleep_engines_are_never_selected_until_they_resume():
    async with fake_fleet("sglang", n=3) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        a, b, c = ids(gw, fleet)
        assert await routed_set(gw) == {a, b, c}
        await call(gw, a, "pause_generation")
        await call(gw, b, "release_memory_occupation")
        assert await routed_set(gw) == {c}
        # Neither held-out engine saw a single rollout while held out.
        fleet[0].clear_calls()
        fleet[1].clear_calls()
        await routed_set(gw)
        assert fleet[0].calls_to("/generate") == [] and fleet[1].calls_to("/generate") == []
        # /workers and discovery still say ready: held out is a routing decision, not health.
        assert {w["health"] for w in (await gw.client.get("/v1/rl/workers")).json()["workers"]} == {"ready"}
        await call(gw, a, "continue_generation")
        await call(gw, b, "resume_memory_occupation")
        assert await routed_set(gw) == {a, b, c}


async def _append(gw, *events):
    for event in events:
        await gw.writer.append("control", event)


def started(op, targets, intent):
    return ControlStarted(op_id=op, kind="fanout", method="POST", path="x", body_size=0, body_sha256="",
        targets=tuple({"worker_id": w.id, "url": w.url, "control_url": w.base_url} for w in targets),
        intent=intent,
    )  # fmt: skip


def finished(op, total):
    return ControlFinished(op_id=op, result="cancelled", http_status=200, total=total, succeeded=0,
              failed=0, latency_ms=1)  # fmt: skip


async def test_unknown_and_mixed_engines_are_held_out_until_a_call_confirms_them():
    async with fake_fleet("sglang", n=3) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        a, b, c = ids(gw, fleet)
        reg = gw.gateway.fleet.registry
        wa, wb, wc = reg.get(a), reg.get(b), reg.get(c)
        # A pause whose answer never came (client gone, timeout): engine a's state is unknown.
        op = uuid.uuid4().hex
        await _append(
            gw, started(op, [wa], {"version": None, "control": "paused", "phase": None}), finished(op, 1)
        )
        assert gw.gateway.fleet.facts()[wa.base_url].control == "unknown"
        # A refit that reached c but not b: b is mixed.
        op = uuid.uuid4().hex
        await _append(
            gw,
            started(op, [wb, wc], {"version": "v2", "control": None, "phase": None}),
            ControlOutcome(op_id=op, worker_id=c, url=wc.url, latency_ms=1, status=200),
            ControlOutcome(op_id=op, worker_id=b, url=wb.url, latency_ms=1, status=500),
            ControlFinished(op_id=op, result="partial", http_status=207, total=2, succeeded=1,
               failed=1, latency_ms=1),
        )  # fmt: skip
        assert gw.gateway.fleet.facts()[wb.base_url].mixed
        assert await routed_set(gw) == {c}
        # Confirmations: a continue on a, a successful refit on b.
        await call(gw, a, "continue_generation")
        await call(
            gw,
            b,
            "update_weights_from_disk",
            {"model_path": fleet[1].config.model_path, "weight_version": "v2"},
        )
        assert await routed_set(gw) == {a, b, c}


async def test_requests_wait_while_every_engine_is_paused_and_go_out_when_one_resumes():
    async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(), worker_urls=fleet.urls) as gw:
        _, b = ids(gw, fleet)
        dp = gw.app.dataplane
        await fanout(gw, "pause_generation")
        results = []

        async def rollout():
            r = await gw.client.post("/generate", json=GEN)
            results.append((r.status_code, r.headers.get("x-smgrl-worker-id")))

        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                for _ in range(3):
                    nursery.start_soon(rollout)
                while dp.waiting < 3:  # all three are parked in the gateway, none at an engine
                    await trio.sleep(0.001)
                assert fleet[0].calls_to("/generate") == [] and fleet[1].calls_to("/generate") == []
                await call(gw, b, "continue_generation")
        assert results == [(200, b)] * 3
        assert dp.waiting == 0


async def test_no_eligible_engine_within_the_budget_is_a_retryable_503_naming_why():
    async with (
        fake_fleet("sglang", n=3) as fleet,
        gateway_in_process(cfg(wait=0.05), worker_urls=fleet.urls) as gw,
    ):
        a, b, c = ids(gw, fleet)
        await call(gw, a, "pause_generation")
        await call(gw, b, "pause_generation")
        await call(gw, c, "release_memory_occupation")
        r = await gw.client.post("/generate", json=GEN)
        assert r.status_code == 503
        error = r.json()["error"]
        assert error["code"] == "no_eligible_workers" and error["retryable"] is True
        assert error["reasons"] == {"asleep": 1, "paused": 2}
        assert "paused" in error["message"] and "asleep" in error["message"]
        assert r.headers["retry-after"] == "1" and r.headers["x-smg-error-code"] == "no_eligible_workers"
        assert "x-smg-routed-worker-id" not in r.headers


async def test_wait_zero_answers_at_once_and_unhealthy_engines_are_held_out():
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg(wait=0), worker_urls=fleet.urls) as gw,
    ):
        a, b = ids(gw, fleet)
        await gw.writer.append("registry", WorkerHealthChanged(worker_id=a, health="not_ready", reason="t"))
        assert await routed_set(gw) == {b}
        await gw.writer.append("registry", WorkerHealthChanged(worker_id=b, health="not_ready", reason="t"))
        r = await gw.client.post("/generate", json=GEN)
        assert r.status_code == 503 and r.json()["error"]["reasons"] == {"unhealthy": 2}


async def test_the_request_timeout_bounds_the_wait(mock_clock):
    # Time is the subject: the clock runs at real speed (the engine is a real process on a real
    # socket, which an autojump clock would time out) and the test moves it past the request's
    # deadline itself, so neither a slow machine nor a short timeout decides the outcome.
    mock_clock.rate = 1
    config = attrs.evolve(cfg(), request_timeout_secs=60)
    async with fake_fleet("sglang", n=1) as fleet, gateway_in_process(config, worker_urls=fleet.urls) as gw:
        await fanout(gw, "pause_generation")
        dp = gw.app.dataplane
        answers = []

        async def rollout():
            answers.append(await gw.client.post("/generate", json=GEN))

        with trio.fail_after(90):  # the jumps below count: 29 s of real time are left
            async with trio.open_nursery() as nursery:
                nursery.start_soon(rollout)
                while dp.waiting < 1:  # parked in the gateway: the engine is paused
                    await trio.sleep(0.001)
                mock_clock.jump(59)
                await trio.sleep(0.01)
                assert not answers  # still waiting: a sync (the pause) is in progress
                mock_clock.jump(2)  # past the deadline
        (r,) = answers
        assert r.status_code == 503 and r.json()["error"]["reasons"] == {"paused": 1}

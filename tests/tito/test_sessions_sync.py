"""Session turns across weight syncs and refits, in process (real fake engines on loopback):
a turn a sync aborts is looped back and captured whole with per-token versions; a sticky
session keeps its (worker, rank), waits for it mid-refit, and moves only when it is gone or
quarantined."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from test_sessions_api import TOOLS, cfg, check_training, say, tok  # noqa: F401 - the fixture

from smgrl.core.config import RlConfig
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process
from smgrl.tito import training_data

REPLY = "word " * 40


async def decoded(engine, k: int) -> None:
    """Wait until a job of ``engine`` has decoded at least ``k`` tokens and is still running."""

    def ready() -> bool:
        return any(len(j.output_ids) >= k and j.finish is None for j in engine.scheduler.jobs.values())

    assert await engine.wait_until(ready, timeout=30)


async def rl(gw, wid: str, path: str, payload: dict) -> None:
    r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/{path}", json=payload)
    assert r.status_code == 200, r.text


# Each engine's sync through the gateway: pause in abort mode, a new version, resume; and the
# token-in route a session turn takes on it.
SYNCS = {
    "sglang": (
        [
            ("pause_generation", {"mode": "abort"}),
            ("update_weight_version", {"new_version": "2", "abort_all_requests": False}),
        ],
        ("continue_generation", {}),
        ("/generate", "input_ids"),
    ),
    "vllm": (
        [
            ("pause?mode=abort", {}),
            ("update_weight_version", {"new_version": "2", "abort_all_requests": False}),
        ],
        ("resume", {}),
        ("/inference/v1/generate", "token_ids"),
    ),
}


@pytest.mark.parametrize("kind", sorted(SYNCS))
async def test_a_turn_aborted_by_a_sync_is_looped_back_and_captured_whole(tok, model_dirs, kind):  # noqa: F811
    syncs, resume, (route, ids_key) = SYNCS[kind]
    with trio.fail_after(30):
        async with (
            fake_fleet(kind, n=1, token_latency_ms=5, weight_version="1") as fleet,
            gateway_in_process(
                cfg(model_dirs["chatml"], rl=RlConfig(enabled=True, control_timeout_secs=5)),
                worker_urls=fleet.urls,
            ) as gw,
        ):
            engine = fleet.engines[0]
            wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            messages = [{"role": "user", "content": "hi " + say(1, REPLY)}]
            box = {}

            async def turn():
                box["r"] = await gw.client.post(
                    f"/sessions/{sid}/v1/chat/completions", json={"messages": messages, "tools": TOOLS}
                )

            async with trio.open_nursery() as n:
                n.start_soon(turn)
                await decoded(engine, 6)
                # The trainer's sync through the gateway: pause in abort mode, new version, resume.
                for path, payload in syncs:
                    await rl(gw, wid, path, payload)
                await trio.testing.wait_all_tasks_blocked()
                assert "r" not in box  # the continuation waits for the engine mid-refit
                await rl(gw, wid, *resume)
            r = box["r"]
            assert r.status_code == 200, r.text
            msg = r.json()["choices"][0]["message"]
            assert msg["content"] == REPLY.strip() or msg["content"] == REPLY  # the whole reply
            messages.append({"role": "assistant", "content": msg["content"]})
            snap = (await gw.client.get(f"/sessions/{sid}")).json()
            t = check_training(tok, snap, messages)
            (rec,) = snap["trajectories"][0]["records"]
            first, second = rec["segments"]
            k = first["end"]
            assert k >= 6 and first["finish_reason"] == "abort" and first["op_id"]
            assert (second["start"], second["iteration"], second["version"]) == (k, 1, "2")
            assert rec["weight_versions"] == [
                {"version": "1", "start": 0, "end": k},
                {"version": "2", "start": k, "end": second["end"]},
            ]
            generated = [v for v, m in zip(t["versions"], t["response_mask"], strict=True) if m]
            assert generated == ["1"] * k + ["2"] * (second["end"] - k)
            # The continuation's prompt was the turn's prompt plus the kept tokens.
            gens = [c.json_body() for c in engine.calls_to(route)]
            assert len(gens) == 2 and gens[-1][ids_key] == gens[0][ids_key] + t["response_ids"][:k]
            (ev,) = [
                rec.event for rec in gw.store.read() if rec.event.TYPE == "dataplane.request_looped_back"
            ]
            assert ev.tokens_kept == k and ev.outcome == "completed" and ev.op_ids == (first["op_id"],)


async def test_a_sticky_session_keeps_its_instance_until_it_is_quarantined(tok, model_dirs):  # noqa: F811
    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=2) as fleet,
            gateway_in_process(
                cfg(model_dirs["chatml"], rl=RlConfig(enabled=True, control_timeout_secs=5)),
                worker_urls=fleet.urls,
            ) as gw,
        ):
            c = gw.client
            sid = (await c.post("/sessions", headers={"x-is-sticky": "true"})).json()["session_id"]
            msgs = [{"role": "user", "content": "hi " + say(1, "Hi.")}]
            n = 1

            async def turn() -> str:
                nonlocal msgs, n
                r = await c.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": msgs})
                assert r.status_code == 200, r.text
                n += 1
                msgs = [*msgs, r.json()["choices"][0]["message"], {"role": "user", "content": say(n, "Ok.")}]
                assert r.headers["x-target-dp-rank"] == "0"
                return r.headers["x-smgrl-worker-id"]

            first = await turn()
            assert {await turn() for _ in range(4)} == {first}  # the whole episode on one instance
            # Mid-refit (paused by a state write): the turn waits for it, never moves, never fails.
            r = await c.post(f"/v1/rl/workers/{first}/state", json={"control": "paused"})
            assert r.status_code == 200
            box = {}

            async def held():
                box["w"] = await turn()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(held)
                await trio.testing.wait_all_tasks_blocked()
                assert "w" not in box
                assert (await c.get("/routing_loop/status")).json()["queue_len"] == 1
                r = await c.post(f"/v1/rl/workers/{first}/state", json={"control": "active"})
                assert r.status_code == 200
            assert box["w"] == first
            # Quarantined: the pin is released; the session moves and sticks to its new instance.
            r = await c.post(f"/v1/rl/workers/{first}/quarantine", json={"reason": "bad gpu"})
            assert r.status_code == 200, r.text
            other = await turn()
            assert other != first
            r = await c.delete(f"/v1/rl/workers/{first}/quarantine")
            assert r.status_code == 200
            assert {await turn() for _ in range(3)} == {other}
            snap = (await c.get(f"/sessions/{sid}")).json()
            assert len(training_data(snap)) == 1

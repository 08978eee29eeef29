"""The session API in process: real fake engines on loopback that use the test tokenizer."""

from __future__ import annotations

import json

import pytest
import trio
import trio.lowlevel
import trio.testing

from smgrl.core.config import Config, SessionsConfig
from smgrl.fake import fake_fleet, model
from smgrl.tito import training_data
from smgrl.tito.chat import ChatTokenizer

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]


def say(n: int, text: str) -> str:
    return f"[[fake-say:{n}:{json.dumps(text)}]]"


def tool_call(path: str) -> str:
    return '<tool_call>\n{"name": "read_file", "arguments": {"path": "' + path + '"}}\n</tool_call>'


def cfg(model_dir, **kw) -> Config:
    sessions = SessionsConfig(tokenizer_path=str(model_dir), **kw.pop("sessions", {}))
    return Config(policy="round_robin", sessions=sessions, **kw)


@pytest.fixture
def tok(model_dirs):
    with model.tokenizer_scope(model_dirs["chatml"]) as chat:
        yield chat


async def agent(client, sid, turns, *, stream=False, model_name=None, extra=None):
    """A scripted agent: each turn's user/tool message tells the fake what to answer next."""
    messages = [{"role": "system", "content": "You are an agent."}]
    pending = {"role": "user", "content": "Fix the bug. " + say(1, "I will look.\n" + tool_call("/a.py"))}
    for n in range(1, turns + 1):
        messages.append(pending)
        body = {"model": model_name, "messages": messages, "tools": TOOLS, "max_tokens": 200, **(extra or {})}
        if stream:
            body["stream"] = True
        r = await client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        msg = _message(r.text) if stream else r.json()["choices"][0]["message"]
        messages.append({k: v for k, v in msg.items() if v is not None or k == "content"})
        nxt = say(
            n + 1,
            "Done."
            if n + 1 == turns
            else ("Reading more.\n" + tool_call(f"/f{n}.py") if n % 2 else "Ok, next."),
        )
        if msg.get("tool_calls"):
            pending = {
                "role": "tool",
                "tool_call_id": msg["tool_calls"][0]["id"],
                "content": f"content {n} " + nxt,
            }
        else:
            pending = {"role": "user", "content": "Go on. " + nxt}
    return messages


def _message(sse: str) -> dict:
    msg: dict = {"role": "assistant", "content": None}
    content = ""
    calls = []
    for line in sse.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        chunk = json.loads(line[6:])
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls") or ():
                calls.append({k: v for k, v in tc.items() if k != "index"})
    msg["content"] = content or None
    if calls:
        msg["tool_calls"] = calls
    return msg


def check_training(chat: ChatTokenizer, snapshot: dict, messages: list[dict]) -> dict:
    (traj,) = snapshot["trajectories"]
    (t,) = training_data(snapshot)
    full = chat.render(messages, tools=TOOLS)
    # decode, not re-tokenize: the captured ids are exactly what the model saw and produced
    assert chat.decode(traj["accumulated_token_ids"]) + "\n" == full
    n = len(t["response_ids"])
    assert len(t["response_mask"]) == len(t["logprobs"]) == len(t["versions"]) == n
    generated = sum(len(r["output_logprobs"]) for r in traj["records"])
    assert sum(t["response_mask"]) == generated
    for m, lp, v in zip(t["response_mask"], t["logprobs"], t["versions"], strict=True):
        assert (m == 0) == (v is None)
        assert lp < 0 if m else lp == 0.0
    assert t["prompt_ids"] + t["response_ids"] == traj["accumulated_token_ids"]
    return t


async def test_agent_session_captures_token_exact_training_data(tok, model_dirs):
    from smgrl.testing import gateway_in_process

    with trio.fail_after(20):
        async with (
            fake_fleet("sglang", n=2) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            r = await gw.client.post("/sessions", headers={"x-prompt-id": "7", "authorization": "x"})
            assert r.status_code == 201
            sid = r.json()["session_id"]
            messages = await agent(gw.client, sid, 6)
            snap = (await gw.client.get(f"/sessions/{sid}")).json()
            t = check_training(tok, snap, messages)
            assert t["num_turns"] == 6
            assert {v for v in t["versions"] if v is not None} == {"default"}


async def test_streaming_turns_and_vllm_token_in_route(tok, model_dirs):
    from smgrl.testing import gateway_in_process

    with trio.fail_after(20):
        async with (
            fake_fleet("vllm", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            messages = await agent(
                gw.client, sid, 4, stream=True, extra={"stream_options": {"include_usage": True}}
            )
            snap = (await gw.client.get(f"/sessions/{sid}")).json()
            check_training(tok, snap, messages)
            paths = {c.path for c in fleet.engines[0].calls}
            assert "/inference/v1/generate" in paths and "/v1/chat/completions" not in paths


async def test_delete_drains_in_flight_turns_and_refuses_new_ones(tok, model_dirs):
    from smgrl.testing import gateway_in_process

    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=1, token_latency_ms=5) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            engine = fleet.engines[0]
            box = {}
            body = {"messages": [{"role": "user", "content": "hi " + say(1, "word " * 40)}]}

            async def turn():
                box["turn"] = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=body)

            async def delete():
                box["delete"] = await gw.client.delete(f"/sessions/{sid}")

            async with trio.open_nursery() as n:
                n.start_soon(turn)
                while not engine.scheduler.jobs:
                    await engine.scheduler.changed.wait()
                n.start_soon(delete)
                while not gw.app.sessions.sessions[sid].closing:
                    await trio.lowlevel.checkpoint()
                late = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
                assert late.status_code == 409 and late.json()["error"]["code"] == "session_closing"
                assert "delete" not in box  # still draining the turn in flight
            assert box["turn"].status_code == 200
            assert box["delete"].status_code == 204
            gone = await gw.client.get(f"/sessions/{sid}")
            assert gone.status_code == 404 and gone.json()["error"]["code"] == "session_not_found"


async def test_bound_unknown_and_foreign_sessions(tok, model_dirs):
    from smgrl.testing import gateway_in_process

    async with gateway_in_process(cfg(model_dirs["chatml"], sessions={"max_sessions": 2})) as gw:
        for _ in range(2):
            assert (await gw.client.post("/sessions")).status_code == 201
        r = await gw.client.post("/sessions")
        assert (
            r.status_code == 429
            and r.headers["retry-after"]
            and r.json()["error"]["code"] == "too_many_sessions"
        )
        foreign = "0123456789ab-" + "0" * 32  # another process's id (a restart)
        r = await gw.client.get(f"/sessions/{foreign}")
        assert r.status_code == 410 and r.json()["error"]["code"] == "session_gone"
        r = await gw.client.post(f"/sessions/{foreign}/v1/chat/completions", json={"messages": []})
        assert r.status_code == 410
        assert (await gw.client.get("/sessions/nope")).status_code == 404
        assert (await gw.client.put("/sessions")).status_code == 405
        sid = gw.app.sessions.owner + "-" + "1" * 32
        assert (await gw.client.delete(f"/sessions/{sid}")).status_code == 404
        assert (await gw.client.delete(f"/tito/sessions/{sid}")).status_code == 204  # SMG: idempotent


async def test_sessions_disabled_without_tokenizer():
    from smgrl.testing import gateway_in_process

    async with gateway_in_process(Config()) as gw:
        r = await gw.client.post("/sessions")
        assert r.status_code == 503 and r.json()["error"]["code"] == "sessions_disabled"


async def test_tito_routes_and_header(tok, model_dirs):
    from smgrl.testing import gateway_in_process

    with trio.fail_after(20):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/tito/sessions")).json()["session_id"]
            msgs = [{"role": "user", "content": "hi " + say(1, "Hello.")}]
            body = {"model": "fake/Qwen3-0.6B", "messages": msgs}
            r = await gw.client.post(
                "/v1/chat/completions", json=body, headers={"x-smg-tito-session-id": sid}
            )
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello."
            snap = (await gw.client.get(f"/tito/sessions/{sid}")).json()
            assert isinstance(snap["trajectories"], list) and len(snap["trajectories"][0]["records"]) == 1
            assert (await gw.client.delete(f"/tito/sessions/{sid}")).status_code == 204
            assert (await gw.client.delete(f"/tito/sessions/{sid}")).status_code == 204
            # a plain chat completion (no header) is not captured and not a session
            r = await gw.client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and not gw.app.sessions.sessions


async def test_hang_and_continue_with_a_one_shot_pin(tok, model_dirs):
    from smgrl.testing import gateway_in_process

    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=2) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            c = gw.client
            sid = (await c.post("/sessions")).json()["session_id"]
            msgs = [{"role": "user", "content": "hi " + say(1, "Hi.")}]

            async def turn(n: int):
                nonlocal msgs
                r = await c.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": msgs})
                assert r.status_code == 200, r.text
                msgs = [
                    *msgs,
                    r.json()["choices"][0]["message"],
                    {"role": "user", "content": "more " + say(n, "Ok.")},
                ]
                return r.headers["x-smgrl-worker-id"]

            natural = await turn(2)  # the routing key's choice while the fleet is unchanged
            assert (await c.post("/control/hang", json=[sid, "missing-id"])).json() == {
                "hung": [sid],
                "deferred": [],
                "missing": ["missing-id"],
            }
            (view,) = (await c.get("/control/sessions")).json()["sessions"]
            assert view["hang_state"] == "hung" and view["status"] == "env"
            other = next(w for w in gw.gateway.fleet.registry if w.id != natural)
            box = {}

            async def held_turn():
                box["worker"] = await turn(3)

            async with trio.open_nursery() as n:
                n.start_soon(held_turn)
                await trio.testing.wait_all_tasks_blocked()
                assert "worker" not in box  # held at the turn boundary
                pin = {"session_id": sid, "base_worker_id": other.group or other.id, "target_dp_rank": 0}
                assert (await c.post("/control/continue", json={"sessions": [pin]})).json() == {
                    "continued": [sid],
                    "missing": [],
                }
            assert box["worker"] == other.id  # the one-shot pin
            assert await turn(4) == natural  # one shot only: a non-sticky session goes back


async def test_control_routes_need_the_admin_key(tok, model_dirs):
    from smgrl.core.auth import ControlPlaneKey
    from smgrl.testing import gateway_in_process

    keys = (ControlPlaneKey.parse("a1:admin:admin:adminkey"), ControlPlaneKey.parse("u1:user:user:userkey"))
    async with gateway_in_process(cfg(model_dirs["chatml"], control_plane_keys=keys, api_key="dpkey")) as gw:
        c = gw.client
        assert (await c.post("/sessions")).status_code == 401
        assert (await c.post("/sessions", headers={"authorization": "Bearer dpkey"})).status_code == 201
        assert (await c.get("/control/sessions")).status_code == 401
        assert (
            await c.get("/control/sessions", headers={"authorization": "Bearer userkey"})
        ).status_code == 403
        r = await c.get("/control/sessions", headers={"authorization": "Bearer adminkey"})
        assert r.status_code == 200 and len(r.json()["sessions"]) == 1


async def test_long_conversations_are_prepared_off_the_loop_and_bad_tito_ids_refused(tok, model_dirs):
    from smgrl.sessions import service
    from smgrl.testing import gateway_in_process

    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            long = "read the file " * (service.THREAD_CHARS // 10)
            msgs = [{"role": "user", "content": long + say(1, "Long read.")}]
            r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": msgs})
            assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Long read."
            assert r.json()["usage"]["prompt_tokens"] == len(tok.tokenize_messages(msgs))
            bad = await gw.client.post(
                "/v1/chat/completions",
                json={"model": "fake/Qwen3-0.6B", "messages": msgs},
                headers={"x-smg-tito-session-id": "a\tb"},
            )
            assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_turn"


async def test_a_turn_answer_id_is_prefixed_once(tok, model_dirs):
    # Found against a live gateway: a session turn's answer id was "chatcmpl-chatcmpl-..." (the
    # generated request id already carries SMG's prefix); a caller's own x-request-id gets it once.
    from smgrl.testing import gateway_in_process

    with trio.fail_after(20):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            body = {
                "model": "fake/Qwen3-0.6B",
                "messages": [{"role": "user", "content": "hi " + say(1, "Hi.")}],
            }
            for path, headers in (
                (f"/sessions/{sid}/v1/chat/completions", {}),
                ("/v1/chat/completions", {"x-smg-tito-session-id": sid}),
            ):
                r = await gw.client.post(path, json=body, headers=headers)
                assert r.status_code == 200, r.text
                assert r.json()["id"] == r.headers["x-request-id"]
                assert r.json()["id"].startswith("chatcmpl-") and r.json()["id"].count("chatcmpl-") == 1
            r = await gw.client.post(
                f"/sessions/{sid}/v1/chat/completions", json=body, headers={"x-request-id": "mine-1"}
            )
            assert r.json()["id"] == "chatcmpl-mine-1"

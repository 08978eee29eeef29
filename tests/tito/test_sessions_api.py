"""The session API in process: real fake engines on loopback that use the test tokenizer."""

from __future__ import annotations

import json

import attrs
import pytest
import trio

from smgrl.config import Config, SessionsConfig
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
        nxt = say(n + 1, "Done." if n + 1 == turns else ("Reading more.\n" + tool_call(f"/f{n}.py") if n % 2 else "Ok, next."))
        if msg.get("tool_calls"):
            pending = {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": f"content {n} " + nxt}
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
      async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw:
        r = await gw.client.post("/sessions", headers={"x-prompt-id": "7", "authorization": "x"})
        assert r.status_code == 201
        sid = r.json()["session_id"]
        messages = await agent(gw.client, sid, 6)
        snap = (await gw.client.get(f"/sessions/{sid}")).json()
        t = check_training(tok, snap, messages[:-0] if False else messages)
        assert t["num_turns"] == 6
        assert set(v for v in t["versions"] if v is not None) == {"default"}

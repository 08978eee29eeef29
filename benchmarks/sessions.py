#!/usr/bin/env python3
"""Agent sessions: turn preparation with prefix reuse, and turn latency under 256 sessions.

    python benchmarks/sessions.py [--turns 30] [--target-tokens 16000] [--sessions 256] [--rounds 10]

1. **Preparation** (pure, in process): a 30-turn conversation of about 16k tokens (the in-process
   test tokenizer, ``smgrl.tito.testkit``); at turn 30, ``prepare_turn`` with the 29 earlier turns
   captured (prefix reuse: hash, render, tokenize the appended segment) vs a full re-tokenization
   (render + encode everything). Median of ``--repeat`` runs each.
2. **Concurrency**: ``--sessions`` concurrent sessions of ``--rounds`` turns each against fake
   engines (real loopback sockets) through one gateway in process, vs the same number of plain
   chat completions through the same gateway: per-turn latency p50/p99, errors, and the Python
   heap per open session (tracemalloc, sessions still open).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

# Run as a script, this directory comes first on sys.path, and benchmarks/journal.py would shadow
# the journal package: put the repository root there instead.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

import trio

from smgrl.core.config import Config, SessionsConfig
from smgrl.fake import fake_fleet, model
from smgrl.testing import gateway_in_process
from smgrl.tito.capture import assistant_message, captured
from smgrl.tito.chat import ChatTokenizer
from smgrl.tito.merge import Boundary, prepare_turn
from smgrl.tito.store import CaptureTree
from smgrl.tito.testkit import make_model_dir
from smgrl.tito.toolcalls import parser_for

WORDS = [
    "the",
    "file",
    "read",
    "list",
    "run",
    "test",
    "error",
    "line",
    "code",
    "def",
    "return",
    "import",
    "python",
    "value",
]


def _text(i: int, n: int) -> str:
    return " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(n))


def preparation(chat: ChatTokenizer, turns: int, target: int, repeat: int) -> dict:
    boundary = Boundary.derive(chat)
    parser = parser_for("hermes")
    # words per message so the whole conversation is about `target` tokens
    per_msg = max(8, target // (turns * 2))
    tree = CaptureTree()
    msgs = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": _text(0, per_msg)},
    ]
    for t in range(1, turns):
        plan = prepare_turn(chat, boundary, msgs, lookup=tree.lookup)
        out = chat.encode(_text(t, per_msg)) + [chat.eos_id]
        a = assistant_message(chat, parser, out)
        cap = captured(
            chat, plan, msgs, a, tools=None, kwargs=None, output_ids=out, output_logprobs=[-0.1] * len(out),
            finish_reason="stop", weight_version="1",
        )  # fmt: skip
        tree.commit(
            tree.reserve(plan.parent_hash), cap.hash, cap.parent, cap.token_ids, cap.record, cap.render_text
        )
        msgs = [*msgs, a, {"role": "user", "content": _text(t + 100, per_msg)}]

    def timed(fn) -> float:
        samples = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
        return statistics.median(samples) * 1000

    plan = prepare_turn(chat, boundary, msgs, lookup=tree.lookup)
    assert plan.hit and list(plan.prompt_ids) == chat.encode(plan.full_text)  # a long plan is an array
    reuse = timed(lambda: prepare_turn(chat, boundary, msgs, lookup=tree.lookup))
    full = timed(lambda: chat.encode(chat.render(msgs, add_generation_prompt=True)))
    return {
        "turn": turns,
        "tokens": len(plan.prompt_ids),
        "reuse_ms": reuse,
        "full_ms": full,
        "ratio": full / reuse,
    }


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")


async def concurrency(model_dir, sessions: int, rounds: int) -> dict:
    session_lat: list[float] = []
    plain_lat: list[float] = []
    errors = {"session": 0, "plain": 0}
    cfg = Config(
        policy="round_robin", sessions=SessionsConfig(tokenizer_path=str(model_dir), max_sessions=sessions)
    )
    with model.tokenizer_scope(model_dir):
        async with fake_fleet("sglang", n=2) as fleet, gateway_in_process(cfg, worker_urls=fleet.urls) as gw:
            c = gw.client
            name = (await c.get("/v1/models")).json()["data"][0]["id"]

            def body(i: int, n: int, msgs):
                return {"model": name, "messages": msgs, "max_tokens": 64}

            async def converse(i: int, path: str, lat: list, arm: str):
                msgs = [{"role": "user", "content": f"task {i} " + _say(1, _text(i, 12))}]
                for n in range(rounds):
                    t0 = trio.current_time()
                    r = await c.post(path, json=body(i, n, msgs))
                    lat.append(trio.current_time() - t0)
                    if r.status_code != 200:
                        errors[arm] += 1
                        return
                    msg = r.json()["choices"][0]["message"]
                    msgs = [*msgs, msg, {"role": "user", "content": "go on " + _say(n + 2, _text(i + n, 12))}]

            async def one_session(i: int, sids: list, lat: list):
                sid = (await c.post("/sessions")).json()["session_id"]
                sids.append(sid)
                await converse(i, f"/sessions/{sid}/v1/chat/completions", lat, "session")

            async def one_plain(i: int):
                await converse(i, "/v1/chat/completions", plain_lat, "plain")

            async with trio.open_nursery() as n:
                for i in range(sessions):
                    n.start_soon(one_plain, i)
            sids: list[str] = []
            async with trio.open_nursery() as n:
                for i in range(sessions):
                    n.start_soon(one_session, i, sids, session_lat)
            for sid in sids:
                await c.delete(f"/sessions/{sid}")
            # Memory: the same sessions again under tracemalloc (which slows Python: not timed),
            # measured while they are all still open.
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            sids = []
            async with trio.open_nursery() as n:
                for i in range(sessions):
                    n.start_soon(one_session, i, sids, [])
            after = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            for sid in sids:
                await c.delete(f"/sessions/{sid}")
    return {
        "sessions": sessions,
        "rounds": rounds,
        "session_p50": _pct(session_lat, 0.5),
        "session_p99": _pct(session_lat, 0.99),
        "plain_p50": _pct(plain_lat, 0.5),
        "plain_p99": _pct(plain_lat, 0.99),
        "errors": errors,
        "bytes_per_session": (after - before) / max(1, sessions),
    }


def _say(n: int, text: str) -> str:
    return f"[[fake-say:{n}:{json.dumps(text)}]]"


# argparse flags shaped like the other benchmarks' (each benchmark its own knobs).
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--target-tokens", type=int, default=16000)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir(f"{tmp}/tok")
        chat = ChatTokenizer.load(model_dir)
        prep = preparation(chat, args.turns, args.target_tokens, args.repeat)
        print(
            f"preparation at turn {prep['turn']} ({prep['tokens']} tokens): prefix reuse {prep['reuse_ms']:.2f} ms, "
            f"full re-tokenization {prep['full_ms']:.2f} ms ({prep['ratio']:.1f}x)",
            flush=True,
        )
        conc = trio.run(concurrency, model_dir, args.sessions, args.rounds)
        print(
            f"{conc['sessions']} sessions x {conc['rounds']} turns: session turn p50/p99 "
            f"{conc['session_p50']:.1f}/{conc['session_p99']:.1f} ms; plain chat p50/p99 "
            f"{conc['plain_p50']:.1f}/{conc['plain_p99']:.1f} ms; errors {conc['errors']}; "
            f"{conc['bytes_per_session'] / 1024:.1f} KiB per open session"
        )


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""A tool-using agent on the official ``openai`` client, captured token-exact by a smgrl session.

    python examples/agent_session.py --gateway http://127.0.0.1:30000 [--turns 10] \
        [--refit-at 5] [--scripted] [--check --tokenizer-path DIR]

The agent is ordinary OpenAI code pointed at ``<gateway>/sessions/<sid>/v1``: it sends the whole
conversation every turn, runs the tool the model calls (``read_file``, here a fake) and appends the
result. Turns alternate between ``stream: true`` and not. The session was opened with
``POST /sessions``; at the end the example reads ``GET /sessions/<sid>``, turns it into training
arrays with ``smgrl.tito.training_data`` and prints their shapes and the weight versions the turns
were produced with, then deletes the session.

``--refit-at K`` refits the fleet after turn K through ``smgrl.rl`` (pause, weights from disk with a
new version, resume), in the middle of the episode. With ``--abort-sync`` the refit happens DURING
turn K+1 instead, as an asynchronous RL trainer's sync does: ``pause_generation`` in mode ``abort``
(the engines abort the turn's generation), weights from disk, ``continue_generation``; the gateway
loops the turn back and captures it whole, its tokens carrying the version that produced each. ``--scripted`` adds ``[[fake-say:...]]`` lines
to the tool results and user turns so that ``smgrl fake-engine --tokenizer-path`` answers like an
agent (tool calls on odd turns). ``--check`` (with the tokenizer's directory) verifies the arrays:
the captured ids decode to exactly a full render of the final conversation, masks and log-probs
align, the mask counts exactly the generated tokens, and every token carries the version of the
turn that produced it; exit 1 on a failure.

What it needs (checked at the start; exit 2 with what to do when something is missing):

* a gateway started with ``--tokenizer-path DIR`` (sessions) and, for ``--refit-at``,
  ``--enable-rl``, with a ready engine ``--selector`` matches;
* ``--scripted`` and ``--check``: fake engines started with the same ``--tokenizer-path``;
* ``--abort-sync``: engines still decoding when the sync arrives. Fake engines answer at once
  unless given a per-token latency: start them with ``--token-latency-ms 5`` (or set the knob,
  ``POST /_fake/knobs {"token_latency_ms": 5}``);
* ``--refit-at``: a checkpoint every engine reads (the engines' own ``model_path`` by default).

It runs as often as you like on the same fleet: the refit's version defaults to one of its own
(``session-<random>``), so a second run refits again instead of re-publishing the first run's
version, and the report reads what each turn recorded, whatever the fleet did before.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import sys
import time

import httpx
from openai import OpenAI

from smgrl.rl import RL, RlError
from smgrl.tito import training_data

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
]


def say(n: int, text: str) -> str:
    return f"\n[[fake-say:{n}:{json.dumps(text)}]]"


def scripted_reply(turn: int, turns: int, long: bool = False) -> str:
    if long:  # the turn a sync interrupts: long enough to be still decoding when the sync arrives
        return f"I read it; step {turn} takes a while." + " Let me think it through carefully." * 12
    if turn == turns:
        return "The bug is fixed."
    if turn % 2:
        return (
            "Let me read a file.\n<tool_call>\n"
            + json.dumps({"name": "read_file", "arguments": {"path": f"src/mod{turn}.py"}})
            + "\n</tool_call>"
        )
    return f"I read it; step {turn} done."


def read_file(path: str) -> str:
    return f"# {path}\ndef f():\n    return {len(path)}\n"


def run_turn(client: OpenAI, model: str, messages: list, stream: bool) -> tuple[dict, str | None]:
    """One chat turn; returns the assistant message to echo and the weight version that made it."""
    if not stream:
        r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=256)
        msg = r.choices[0].message.model_dump(exclude_none=True)
        msg.setdefault("content", None)
        return msg, r.system_fingerprint
    content, calls, version = "", [], None
    for chunk in client.chat.completions.create(
        model=model, messages=messages, tools=TOOLS, max_tokens=256, stream=True
    ):
        version = chunk.system_fingerprint or version
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or ():
                calls.append(
                    {
                        "id": tc.id,
                        "type": "function",
                        "function": {"name": tc.function.name, "arguments": tc.function.arguments},
                    }
                )
    msg = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = calls
    return msg, version


def refit(gateway: str, version: str, selector: str) -> None:
    rl = RL(gateway, timeout=120)
    model_path = rl.workers()[0].labels.get("model_path")
    rl.set_state("paused", selector=selector)  # new turns wait in the gateway, none fails
    try:
        body = {"model_path": model_path, "weight_version": version}
        rl.fanout("update_weights_from_disk", body, selector=selector)
    finally:
        rl.set_state("active", selector=selector)  # never leave the fleet held out


def wait_decoding(rl: RL, tokens: int, timeout: float = 30.0) -> None:
    """Until some engine is generating and (fake engines) has decoded ``tokens`` tokens."""
    deadline = time.monotonic() + timeout
    # A gRPC engine's fake state is on its HTTP control side (its ``rl.control_url``).
    urls = [w.labels.get("rl.control_url") or w.url for w in rl.workers()]
    with httpx.Client(timeout=5) as http:
        while time.monotonic() < deadline:
            for url in urls:
                state = http.get(f"{url}/_fake/state")
                if state.status_code == 200 and max(state.json().get("decoded") or [0]) >= tokens:
                    return
            time.sleep(0.005)
    raise SystemExit(f"no engine decoded {tokens} tokens within {timeout:g}s")


def abort_sync(gateway: str, version: str, selector: str) -> None:
    """An asynchronous trainer's sync: abort what runs, load new weights, resume."""
    rl = RL(gateway, timeout=120)
    model_path = rl.workers()[0].labels.get("model_path")
    rl.fanout("pause_generation", {"mode": "abort"}, selector=selector)
    try:
        rl.fanout(
            "update_weights_from_disk",
            {"model_path": model_path, "weight_version": version},
            selector=selector,
        )
    finally:
        rl.fanout("continue_generation", {}, selector=selector)


def turn_during_sync(args, client: OpenAI, model: str, messages: list, stream: bool):
    """One turn while the trainer syncs the fleet (``abort_sync``) in the middle of it."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        future = pool.submit(run_turn, client, model, messages, stream)
        wait_decoding(RL(args.gateway, timeout=30), 4)
        abort_sync(args.gateway, args.refit_version, args.selector)
        return future.result(timeout=120)


def preflight(args) -> str | None:
    """What the run needs and the fleet lacks, in one sentence, or None."""
    if args.check and not args.tokenizer_path:
        return "--check needs --tokenizer-path DIR (the tokenizer the gateway and the engines use)"
    with httpx.Client(base_url=args.gateway, timeout=10) as http:
        # An unknown session id: 404 when sessions are on, 503 sessions_disabled when they are off
        # (nothing is created, so the journal holds only this run's session).
        probe = http.get("/sessions/preflight-unknown-session")
        if probe.status_code == 503 or probe.status_code >= 500:
            return (
                f"the gateway's sessions are off ({probe.status_code} {probe.text[:200]!r}): start it "
                "with --tokenizer-path DIR"
            )
        if not args.refit_at:
            return None
        try:
            workers = [w for w in RL(args.gateway, timeout=30).workers() if w.health == "ready"]
        except RlError as exc:
            return (
                f"--refit-at needs the control plane: the gateway answered {exc} (start it with --enable-rl)"
            )
        if not workers:
            return "--refit-at needs a ready engine: register one (smgrl launch --worker-urls ...)"
        if args.abort_sync:
            # A gRPC engine's fake knobs are on its HTTP control side (its ``rl.control_url``).
            knobs = http.get(f"{workers[0].labels.get('rl.control_url') or workers[0].url}/_fake/knobs")
            if knobs.status_code == 200 and not float(knobs.json().get("token_latency_ms") or 0):
                return (
                    "--abort-sync needs engines still decoding when the sync arrives; these fake engines "
                    "answer at once: start them with --token-latency-ms 5 (or POST /_fake/knobs)"
                )
    return None


def check(args, snapshot: dict, messages: list, versions: list) -> list[str]:
    from smgrl.tito.chat import ChatTokenizer

    chat = ChatTokenizer.load(args.tokenizer_path)
    problems = []
    (traj,) = snapshot["trajectories"]
    (t,) = training_data(snapshot)
    text = chat.decode(traj["accumulated_token_ids"])
    full = chat.render(messages, tools=TOOLS)
    if not (full.startswith(text) and full[len(text) :] == "\n"):
        problems.append("the captured ids do not decode to a full render of the conversation")
    n = len(t["response_ids"])
    if not len(t["response_mask"]) == len(t["logprobs"]) == len(t["versions"]) == n:
        problems.append("arrays of different lengths")
    generated = sum(len(r["output_logprobs"]) for r in traj["records"])
    if sum(t["response_mask"]) != generated:
        problems.append(f"mask counts {sum(t['response_mask'])} tokens, engines generated {generated}")
    # The versions each turn's tokens may carry: the turn's (its answer's), or, for a turn
    # looped back across a sync, those of its segments, in order.
    allowed = [
        [s["version"] for s in r.get("weight_versions") or ()] or [versions[i]]
        for i, r in enumerate(traj["records"])
    ]
    for i, r in enumerate(traj["records"]):
        if r.get("weight_version") != versions[i]:
            problems.append(f"turn {i}: captured version {r.get('weight_version')}, answered {versions[i]}")
    for m, lp, v, turn in zip(
        t["response_mask"], t["logprobs"], t["versions"], t["token_turns"], strict=True
    ):
        if m and (lp >= 0 or v not in allowed[turn]):
            problems.append(f"turn {turn}: token version {v}, turn versions {allowed[turn]}")
            break
        if not m and (lp != 0.0 or v is not None):
            problems.append("an environment token has a log-prob or a version")
            break
    return problems


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gateway", default="http://127.0.0.1:30000")
    p.add_argument("--api-key", default="none")
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--refit-at", type=int, default=0, help="refit the fleet after this turn (0: never)")
    p.add_argument(
        "--refit-version", default=None, help="the version the refit publishes (default: session-<random>)"
    )
    p.add_argument(
        "--abort-sync", action="store_true", help="refit during turn K+1, aborting it (pause mode abort)"
    )
    p.add_argument("--selector", default="engine=sglang", help="the engines a refit goes to")
    p.add_argument("--scripted", action="store_true", help="script the fake engines' answers")
    p.add_argument("--check", action="store_true")
    p.add_argument("--tokenizer-path", default=None)
    args = p.parse_args()
    if args.refit_version is None:
        # The start time at a fixed width: a later run's version sorts after an earlier run's (text
        # versions compare as text), so a session floor from before the refit is met by it.
        now = time.time()
        args.refit_version = (
            "session-" + time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}"
        )
    missing = preflight(args)
    if missing:
        print(f"agent_session: {missing}", file=sys.stderr)
        return 2

    http = httpx.Client(base_url=args.gateway, timeout=120)
    sid = http.post("/sessions", headers={"x-prompt-id": "1"}).raise_for_status().json()["session_id"]
    client = OpenAI(base_url=f"{args.gateway}/sessions/{sid}/v1", api_key=args.api_key)
    model = http.get("/v1/models").json()["data"][0]["id"]
    task = "The tests fail in src/. Find the bug and fix it."
    messages: list = [
        {"role": "system", "content": "You are a coding agent. Use read_file to read files."},
        {"role": "user", "content": task + (say(1, scripted_reply(1, args.turns)) if args.scripted else "")},
    ]
    versions = []
    try:
        for turn in range(1, args.turns + 1):
            if args.abort_sync and args.refit_at and turn == args.refit_at + 1:
                msg, version = turn_during_sync(args, client, model, messages, turn % 2 == 0)
                print(f"sync: the fleet was refitted to version {args.refit_version} during turn {turn}")
            else:
                msg, version = run_turn(client, model, messages, stream=turn % 2 == 0)
            messages.append(msg)
            versions.append(version)
            print(
                f"turn {turn}: version {version}, {'tool call' if msg.get('tool_calls') else 'text'}",
                flush=True,
            )
            if turn == args.turns:
                break
            synced = args.abort_sync and turn + 1 == args.refit_at + 1
            directive = say(turn + 1, scripted_reply(turn + 1, args.turns, synced)) if args.scripted else ""
            if msg.get("tool_calls"):
                for call in msg["tool_calls"]:
                    path = json.loads(call["function"]["arguments"]).get("path", "")
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": read_file(path) + directive}
                    )
            else:
                messages.append({"role": "user", "content": "Continue." + directive})
            if turn == args.refit_at and not args.abort_sync:
                refit(args.gateway, args.refit_version, args.selector)
                print(f"refit: the fleet is at version {args.refit_version}", flush=True)
        snapshot = http.get(f"/sessions/{sid}").raise_for_status().json()
    finally:
        http.delete(f"/sessions/{sid}")
    for traj in snapshot["trajectories"]:
        for i, record in enumerate(traj["records"], 1):
            segments = record.get("segments") or ()
            if len(segments) > 1:
                spans = [(s["version"], s["end"] - s["start"]) for s in record.get("weight_versions") or ()]
                spans = spans or [
                    (record.get("weight_version"), sum(s["end"] - s["start"] for s in segments))
                ]
                print(f"turn {i}: looped back {len(segments) - 1}x across a sync; (version, tokens) {spans}")
    for t in training_data(snapshot):
        print(
            f"trajectory {t['trajectory_id']}: prompt_ids {len(t['prompt_ids'])}, response_ids "
            f"{len(t['response_ids'])} ({sum(t['response_mask'])} generated), turns {t['num_turns']}, "
            f"versions {sorted({v for v in t['versions'] if v is not None})}"
        )
    if args.check:
        problems = check(args, snapshot, messages, versions)
        for problem in problems:
            print("FAIL:", problem, file=sys.stderr)
        if problems:
            return 1
        print("check: token-exact capture, aligned arrays, versions right")
    return 0


if __name__ == "__main__":
    sys.exit(main())

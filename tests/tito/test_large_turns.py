"""Session turns and snapshots of megabytes never hold the event loop: their pure work runs in
worker processes, their bulk on the loop in slices between checkpoints; the ids stay exact
(in process: the real session service and fronts; fake engines on loopback)."""

from __future__ import annotations

import gc
import json
import time
import types
from array import array

import pytest
import trio
import trio.lowlevel
from test_sessions_api import agent, cfg, check_training

from smgrl.fake import fake_fleet, model
from smgrl.sessions import engine as eng
from smgrl.sessions import large_turns, offload, service, slices
from smgrl.testing import gateway_in_process


@pytest.fixture
def tok(model_dirs):
    with model.tokenizer_scope(model_dirs["chatml"]) as chat:
        yield chat


def _without(value, *keys):
    if isinstance(value, dict):
        return {k: _without(v, *keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_without(v, *keys) for v in value]
    return value


async def _agent_snapshot(model_dirs) -> tuple[list[dict], dict]:
    async with (
        fake_fleet("sglang", n=1) as fleet,
        gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
    ):
        sid = (await gw.client.post("/sessions")).json()["session_id"]
        messages = await agent(gw.client, sid, 5)
        return messages, (await gw.client.get(f"/sessions/{sid}")).json()


async def test_turns_prepared_in_worker_processes_capture_the_same_ids(tok, model_dirs, monkeypatch):
    # The in-process path first, then every turn through the workers with slices of 7 ids (each
    # turn's body over the threshold; hits and misses; the commit's comparison, the engine's JSON
    # and the snapshot all in slices): the same conversation, the same captured ids and records.
    with trio.fail_after(180):
        messages, expected = await _agent_snapshot(model_dirs)
        monkeypatch.setattr(offload, "PROCESS_BYTES", 0)
        monkeypatch.setattr(slices, "SLICE", 7)
        calls = []
        real = large_turns.LargeTurns.run

        async def counted(self, fn, *args):
            calls.append(fn.__name__)
            return await real(self, fn, *args)

        monkeypatch.setattr(large_turns.LargeTurns, "run", counted)
        got_messages, snap = await _agent_snapshot(model_dirs)
    # Tool-call ids are drawn at random and the engine's port differs: the rest is the same.
    assert _without(got_messages, "id", "tool_call_id") == _without(messages, "id", "tool_call_id")
    assert _without(snap["trajectories"], "engine") == _without(expected["trajectories"], "engine")
    check_training(tok, snap, messages)
    # Five turns: each parsed and rendered in a worker, tokenized there (the first a miss, the
    # others hits: their appended segments), its capture closed there.
    assert calls.count("parse_and_render") == 5 and calls.count("close_in_worker") == 5
    assert calls.count("encode_text") == 1 and calls.count("encode_segments") == 4


async def test_a_large_turn_is_never_parsed_rendered_or_tokenized_in_the_gateway_process(
    tok, model_dirs, monkeypatch
):
    # Before: the body was parsed on the loop, rendered and tokenized in a thread (holding the
    # GIL the loop needs), and the engine's body JSON-encoded on the loop in one call of every id.
    monkeypatch.setattr(offload, "PROCESS_BYTES", 64 * 1024)
    monkeypatch.setattr(slices, "SLICE", 1024)
    content = "read the file and run the test " * (offload.PROCESS_BYTES // 16)
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 4}
    expected = len(tok.tokenize_messages(body["messages"]))
    seen = {"prepare": 0, "render": 0, "encode": 0, "largest_json_list": 0}
    real_prepare, real_dumps = service.prepare_turn, json.dumps
    chat_type = type(tok)
    real_render, real_encode = chat_type.render, chat_type.encode

    def counting(name, real):
        def spy(*args, **kwargs):
            seen[name] += 1
            return real(*args, **kwargs)

        return spy

    class Json:
        @staticmethod
        def dumps(value, *args, **kwargs):
            ids = value.get("input_ids") if isinstance(value, dict) else value
            if isinstance(ids, list):
                seen["largest_json_list"] = max(seen["largest_json_list"], len(ids))
            return real_dumps(value, *args, **kwargs)

        loads = staticmethod(json.loads)

    with trio.fail_after(180):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            # Spied from here: the gateway's own start renders and encodes its probes.
            monkeypatch.setattr(service, "prepare_turn", counting("prepare", real_prepare))
            monkeypatch.setattr(chat_type, "render", counting("render", real_render))
            monkeypatch.setattr(chat_type, "encode", counting("encode", real_encode))
            monkeypatch.setattr(eng, "json", Json)
            monkeypatch.setattr(slices, "json", Json)
            r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            prompt_tokens = r.json()["usage"]["prompt_tokens"]
    assert prompt_tokens == expected > 10 * slices.SLICE
    assert seen["prepare"] == seen["render"] == seen["encode"] == 0, seen
    assert 0 < seen["largest_json_list"] <= slices.SLICE


# Both forms a session's tree may hold: a long run is stored as an array (smgrl/tito/ids.py), a
# list is what an older snapshot restored or a short run joined may still be.
@pytest.mark.parametrize("form", ["array", "list"])
async def test_a_large_snapshot_is_encoded_in_slices_while_the_loop_keeps_running(
    tok, model_dirs, monkeypatch, form
):
    # Before: GET /sessions/{sid} encoded the snapshot in one json call: the loop stood still for
    # the whole answer (0.7 s at 8 MB). Measured against the request itself: a heartbeat task
    # that sleeps 0 between beats must beat throughout it, its longest gap a small part of it.
    with trio.fail_after(180):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            s = gw.app.sessions.sessions[sid]
            # Millions of captured ids, as long trajectories leave them (put there directly: the
            # snapshot's encoding is what is measured, not the turns that made them).
            await agent(gw.client, sid, 1)
            (node,) = s.tree.entries.values()
            many = list(node.token_ids) * (3_000_000 // len(node.token_ids))
            node.token_ids = array("i", many) if form == "array" else many
            beats: list[float] = []
            done = False

            async def heartbeat(task_status=trio.TASK_STATUS_IGNORED):
                task_status.started()
                while not done:
                    beats.append(time.perf_counter())
                    await trio.lowlevel.checkpoint()

            # The heartbeat runs beside the request; the nursery only scopes it to this block.
            async with trio.open_nursery() as nursery:
                await nursery.start(heartbeat)
                t0 = time.perf_counter()
                r = await gw.client.get(f"/sessions/{sid}")
                t1 = time.perf_counter()
                done = True
    assert r.status_code == 200
    assert r.json()["trajectories"][0]["accumulated_token_ids"] == list(node.token_ids)
    during = [b for b in beats if t0 <= b <= t1]
    gaps = [b - a for a, b in zip([t0, *during], [*during, t1], strict=True)]
    assert len(during) > 20, len(during)
    assert max(gaps) < (t1 - t0) / 4, (max(gaps), t1 - t0)


def _big_tracked(n: int) -> int:
    """Lists and tuples of more than ``n`` items alive now (the containers a full collection walks
    item by item)."""
    return sum(1 for o in gc.get_objects() if type(o) in (list, tuple) and len(o) > n)


def _reachable_big(root, n: int) -> list[int]:
    """The lengths of the gc-tracked lists and tuples of more than ``n`` items reachable from
    ``root`` (not through modules, classes, functions, frames or trio's events and tasks)."""
    stop = (types.ModuleType, type, types.FunctionType, types.FrameType, trio.Event, trio.lowlevel.Task)
    seen, stack, found = set(), [root], []
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, stop):
            continue
        seen.add(id(o))
        if type(o) in (list, tuple) and len(o) > n:
            found.append(len(o))
        stack.extend(r for r in gc.get_referents(o) if gc.is_tracked(r))
    return found


async def test_a_large_turns_ids_are_never_held_in_containers_the_garbage_collector_walks(
    tok, model_dirs, monkeypatch
):
    # Before: the ids of a large turn (prepared in worker processes, crossing as an array's
    # bytes) became lists again on the loop: the plan's prompt, the rollout's copy of it, the
    # captured node's ids. Each is gc-tracked and each id an int object of its own: every full
    # collection walked them all (0.2 s for a turn of 8 MB, on the event loop). Counted, not
    # timed: at each turn's engine request and in the session's state after it, no tracked
    # container of more than one slice of ids.
    monkeypatch.setattr(offload, "PROCESS_BYTES", 64 * 1024)
    n = slices.SLICE
    words = "read the file and run the test " * (offload.PROCESS_BYTES // 16)
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": words}}
    messages = [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    at_request: list[int] = []
    baseline = [0]
    real = eng.request_encoded

    def counting(*args, **kwargs):
        # The engine's body is being built: the plan and the rollout hold the prompt now.
        at_request.append(_big_tracked(n) - baseline[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(eng, "request_encoded", counting)
    with trio.fail_after(180):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            s = gw.app.sessions.sessions[sid]
            prompts = []
            for _ in range(2):  # a miss, then a hit on its captured node
                baseline[0] = _big_tracked(n)
                body = {"messages": messages, "max_tokens": 8}
                r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text
                prompts.append(r.json()["usage"]["prompt_tokens"])
                messages = [
                    *messages,
                    r.json()["choices"][0]["message"],
                    {"role": "user", "content": "go on"},
                ]
            held = _reachable_big(s, n)
            nodes = sorted(s.tree.entries.values(), key=lambda node: node.seq)
            snap = (await gw.client.get(f"/sessions/{sid}")).json()
    assert prompts[0] > 3 * n, prompts
    assert [node.parent for node in nodes] == [None, nodes[0].hash]  # the second turn was a hit
    assert at_request == [0, 0], f"tracked containers of over {n} ids at each engine request: {at_request}"
    assert held == [], f"the session holds tracked containers of {held} ids"
    # The same ids whatever form holds them (the snapshot's JSON of the leaf's ids).
    (traj,) = snap["trajectories"]
    assert traj["accumulated_token_ids"] == list(nodes[1].token_ids)
    assert traj["accumulated_token_ids"][: len(nodes[0].token_ids)] == list(nodes[0].token_ids)

"""Sessions a client cannot use to stall, bloat or crash the gateway, and that fail safe when the
journal does (in process: the real session service and fronts; fake engines on loopback)."""

from __future__ import annotations

import gc
import json
import threading

import pytest
import trio
from test_sessions_api import cfg

from journal import MemoryStore
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process


@pytest.fixture
def tok(model_dirs):
    from smgrl.fake import model

    with model.tokenizer_scope(model_dirs["chatml"]) as chat:
        yield chat


class FailingStore(MemoryStore):
    """Commits fail while ``down`` is set (a journal outage: a full disk, an unreachable server)."""

    down = False

    def append_batch(self, items, *, wait=None, **kw):
        if self.down:
            raise OSError(28, "No space left on device")
        return super().append_batch(items, wait=wait, **kw)


async def test_a_session_created_during_a_journal_outage_is_503_and_takes_no_slot(tok, model_dirs):
    store = FailingStore()
    config = cfg(model_dirs["chatml"], sessions={"max_sessions": 2})
    with trio.fail_after(20):
        async with gateway_in_process(config, store=store) as gw:
            store.down = True
            for route in ("/sessions", "/tito/sessions", "/sessions", "/tito/sessions"):
                r = await gw.client.post(route)
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "journal_unavailable"
            assert gw.app.sessions.sessions == {}  # nothing held for an id never answered
            store.down = False
            # The bound is whole again: both slots can be taken, the next is refused.
            for _ in range(2):
                assert (await gw.client.post("/sessions")).status_code == 201
            assert (await gw.client.post("/sessions")).status_code == 429
            created = [r for r in store.read(types=["session.created"])]
            assert len(created) == 2 == len(gw.app.sessions.sessions)


def _big_containers(min_len: int) -> int:
    """Lists and dicts of at least ``min_len`` items alive now (gc-tracked, collected or not)."""
    return sum(1 for o in gc.get_objects() if type(o) in (list, dict) and len(o) >= min_len)


async def test_failed_long_turns_leave_nothing_behind_for_the_cycle_collector(tok, model_dirs):
    # Long turns the engine refuses (its context is too short): each failure must be freed by
    # reference counting as it happens. Kept in exception/frame cycles instead, they waited for a
    # full collection, which the gateway's gc tuning makes rare: RSS grew by the prompt's ids and
    # the parsed body of every failed turn.
    n_turns, words = 3, 20_000
    # A bound for a hang, not a speed claim: the first long turn starts a worker process.
    with trio.fail_after(180):
        async with (
            fake_fleet("sglang", n=1, context_length=1000) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            # One message per word: the parsed body is a list of `words` messages.
            msgs = [{"role": "user", "content": f"w{i}"} for i in range(words)]
            gc.collect()
            gc.disable()  # as rare as the tuned gateway's full collections: only refcounting frees
            try:
                before = _big_containers(words)
                for _ in range(n_turns):
                    r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json={"messages": msgs})
                    assert r.status_code >= 400, r.text
                left = _big_containers(words) - before
            finally:
                gc.enable()
    assert left == 0, f"{left} prompt-sized lists or dicts outlived their failed turns"


def _assistant(**fields) -> list[dict]:
    return [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "x", **fields},
        {"role": "user", "content": "again"},
    ]


BAD_TURNS = {
    "tool_calls-of-strings": json.dumps({"messages": _assistant(tool_calls=["x"])}),
    "tool_calls-a-number": json.dumps({"messages": _assistant(tool_calls=5)}),
    "tool_calls-a-string": json.dumps({"messages": _assistant(tool_calls="abc")}),
    "function-a-string": json.dumps(
        {"messages": _assistant(tool_calls=[{"id": "c1", "type": "function", "function": "f"}])}
    ),
    "reasoning_content-a-number": json.dumps({"messages": _assistant(reasoning_content=5)}),
    "lone-surrogate-in-content": '{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
    "lone-surrogate-in-a-tool": '{"messages": [{"role": "user", "content": "a"}], "tools": [{"type":'
    ' "function", "function": {"name": "f", "description": "\\udc00"}}]}',
    "role-a-number": json.dumps({"messages": [{"role": 5, "content": "a"}]}),
    # Refused by the same check as the OpenAI chat route's (which refuses max_tokens -5 too).
    "max_tokens-negative": json.dumps({"messages": [{"role": "user", "content": "a"}], "max_tokens": -5}),
    "100000-deep": '{"messages": ' + "[" * 100_000 + "]" * 100_000 + "}",
}


async def test_control_bodies_100000_deep_are_invalid_turn(tok, model_dirs):
    deep = "[" * 100_000 + "]" * 100_000
    async with gateway_in_process(cfg(model_dirs["chatml"])) as gw:
        for route in ("/control/hang", "/control/continue"):
            r = await gw.client.post(route, content=deep, headers={"content-type": "application/json"})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_turn", (route, r.text)


@pytest.mark.parametrize("body", list(BAD_TURNS.values()), ids=list(BAD_TURNS))
async def test_a_turn_the_template_cannot_take_is_invalid_turn_on_both_session_routes(tok, model_dirs, body):
    with trio.fail_after(20):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            head = {"content-type": "application/json"}
            r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", content=body, headers=head)
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_turn", r.text
            r = await gw.client.post(
                "/v1/chat/completions", content=body, headers={**head, "x-smg-tito-session-id": "tito-1"}
            )
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_turn", r.text


LONG = "x" * 40_000  # more than THREAD_CHARS, in a field other than `content`
LONG_OUTSIDE_CONTENT = {
    "tool-description": {
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": LONG}}],
    },
    "tool-call-arguments": {
        "messages": _assistant(
            tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": LONG}}]
        )
    },
    "template-kwargs": {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"x": LONG}},
}


@pytest.mark.parametrize("body", list(LONG_OUTSIDE_CONTENT.values()), ids=list(LONG_OUTSIDE_CONTENT))
async def test_a_turn_long_outside_its_content_is_prepared_off_the_event_loop(
    tok, model_dirs, body, monkeypatch
):
    from smgrl.sessions import service

    threads = []
    real = service.prepare_turn

    def spy(*args, **kwargs):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "prepare_turn", spy)
    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json={**body, "max_tokens": 4})
            assert r.status_code == 200, r.text
    assert threads == [False]  # prepared once, not on the event loop's thread


async def test_a_default_header_too_long_for_a_session_is_refused_before_anything_is_journaled(
    tok, model_dirs
):
    # Session churn with 8 KiB headers grew the journal ~16 KB per create+delete: what a
    # session.created may hold is bounded.
    async with gateway_in_process(cfg(model_dirs["chatml"])) as gw:
        r = await gw.client.post("/sessions", headers={"x-prompt-id": "p" * 600})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_turn", r.text
        assert "x-prompt-id" in r.json()["error"]["message"]
        assert not list(gw.store.read(types=["session.created"]))
        assert (await gw.client.post("/sessions", headers={"x-prompt-id": "p" * 512})).status_code == 201


async def test_idle_sessions_end_in_the_journal_but_never_a_hung_or_busy_one(tok, model_dirs, autojump_clock):
    async with gateway_in_process(cfg(model_dirs["chatml"], sessions={"max_sessions": 4})) as gw:
        svc = gw.app.sessions
        svc.idle_timeout = 100.0

        async def create() -> str:
            r = await gw.client.post("/sessions")
            assert r.status_code == 201, r.text
            return r.json()["session_id"]

        idle, hung, busy = await create(), await create(), await create()
        r = await gw.client.post("/control/hang", json=[{"session_id": hung}])
        assert r.status_code == 200 and r.json()["hung"] == [hung], r.text
        svc.sessions[busy].begin_turn()  # a turn in flight (waiting on its engine)
        await trio.sleep(101)
        fourth = await create()
        assert set(svc.sessions) == {hung, busy, fourth}
        ended = [r.event for r in gw.store.read(types=["session.ended"])]
        assert [(e.session_id, e.reason) for e in ended] == [(idle, "idle")]
        assert (await gw.client.get(f"/sessions/{idle}")).status_code == 404
        # A gateway whose sessions were never deleted does not refuse new agents for good: at the
        # bound, the idle ones end first.
        await create()
        assert (await gw.client.post("/sessions")).status_code == 429  # 4 held, none idle yet
        await trio.sleep(101)
        assert (await gw.client.post("/sessions")).status_code == 201
        assert hung in svc.sessions and busy in svc.sessions


async def test_a_session_past_its_trajectory_budget_gets_a_clear_error_and_no_engine_call(tok, model_dirs):
    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            svc = gw.app.sessions
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
            r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            stored = svc.sessions[sid].tree.stored_tokens
            assert stored > 0
            svc.max_stored_tokens = stored + 40
            turns = len(list(gw.store.read(types=["session.turn"])))
            # Each prefix miss stores a new trajectory: a rewritten history, again and again.
            long = {"messages": [{"role": "user", "content": "another start " * 20}], "max_tokens": 8}
            r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=long)
            assert r.status_code == 400 and r.json()["error"]["code"] == "session_budget_exceeded", r.text
            assert "delete it" in r.json()["error"]["message"]
            assert svc.sessions[sid].tree.stored_tokens == stored
            assert len(list(gw.store.read(types=["session.turn"]))) == turns


async def test_a_tito_id_shaped_like_a_gateway_id_gets_one_answer_whichever_process_it_names(tok, model_dirs):
    # With --workers 2, such an id was 410 on the process it did not name and created on the one
    # it named (its owner part): the answer depended on which process the client reached.
    with trio.fail_after(20):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            body = {
                "model": "fake/Qwen3-0.6B",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 4,
            }
            for owner in (gw.app.sessions.owner, "0123456789ab"):  # this process, and another one
                sid = f"{owner}-{'a' * 32}"
                r = await gw.client.post(
                    "/v1/chat/completions", json=body, headers={"x-smg-tito-session-id": sid}
                )
                assert r.status_code == 410 and r.json()["error"]["code"] == "session_gone", (owner, r.text)
            assert gw.app.sessions.sessions == {}
            # Any other client-chosen id is created by its first turn, as SMG does.
            r = await gw.client.post(
                "/v1/chat/completions", json=body, headers={"x-smg-tito-session-id": "agent-7"}
            )
            assert r.status_code == 200, r.text


async def test_with_data_plane_keys_sessions_need_one_and_without_keys_they_are_open(tok, model_dirs):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with trio.fail_after(30):
        async with fake_fleet("sglang", n=1) as fleet:
            async with gateway_in_process(
                cfg(model_dirs["chatml"], api_key="dp-key"), worker_urls=fleet.urls
            ) as gw:
                assert (await gw.client.post("/sessions")).status_code == 401
                assert (await gw.client.post("/tito/sessions")).status_code == 401
                key = {"authorization": "Bearer dp-key"}
                sid = (await gw.client.post("/sessions", headers=key)).json()["session_id"]
                r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
                assert r.status_code == 401
                r = await gw.client.post(
                    "/v1/chat/completions", json=body, headers={"x-smg-tito-session-id": "t1"}
                )
                assert r.status_code == 401 and gw.app.sessions.sessions.keys() == {sid}
                r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=body, headers=key)
                assert r.status_code == 200, r.text
            # No keys configured: open, as PSRL's SessionRouter creates sessions without one.
            async with gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw:
                sid = (await gw.client.post("/sessions")).json()["session_id"]
                r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text

"""Prefix reuse: hits, misses, the boundary fix and the append-only proof, with the real tokenizer."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tito_sim import play_turn

from smgrl.tito import hashing
from smgrl.tito.merge import Boundary, prepare_turn, split_segments
from smgrl.tito.store import CaptureTree

SYS = {"role": "system", "content": "You are an agent."}


def out(chat, text, eos=True):
    return chat.encode(text) + ([chat.eos_id] if eos else [])


def tool_text(name, args):
    return f'<tool_call>\n{{"name": "{name}", "arguments": {json.dumps(args, ensure_ascii=False)}}}\n</tool_call>'


def test_boundary_is_derived_from_template_and_tokenizer(chat, boundary):
    assert boundary.close_text == chat.eos_token + "\n"
    assert boundary.eos_id == chat.eos_id
    assert list(boundary.after_eos_ids) == chat.encode("\n")
    assert boundary.adjust([5, chat.eos_id]) == [5, chat.eos_id, *chat.encode("\n")]
    # a turn cut by max_tokens did not emit the end-of-turn token: the whole closing text is added
    assert boundary.adjust([5, 6]) == [5, 6, *chat.encode(chat.eos_token + "\n")]


def test_segments_group_tool_runs():
    msgs = [
        {"role": "tool", "tool_call_id": "a", "content": "1"},
        {"role": "tool", "tool_call_id": "b", "content": "2"},
        {"role": "user", "content": "u"},
        {"role": "system", "content": "s"},
        {"role": "tool", "tool_call_id": "c", "content": "3"},
    ]
    assert [len(s) for s in split_segments(msgs)] == [2, 1, 1, 1]


def test_first_turn_is_a_miss_then_hits_equal_full_retokenization(chat, boundary):
    tree = CaptureTree()
    msgs = [SYS, {"role": "user", "content": "read the file"}]
    outputs = [
        "I will read it.\n" + tool_text("read_file", {"path": "/tmp/a.py"}),
        "The file has one line.",
        "Done.",
    ]
    reasons = []
    for text in outputs:
        plan, a = play_turn(chat, boundary, tree, msgs, out(chat, text))
        reasons.append(plan.reason)
        assert plan.prompt_ids == chat.encode(plan.full_text)  # canonical output ids: exact equality
        msgs = [*msgs, a]
        if a.get("tool_calls"):
            msgs.append({"role": "tool", "tool_call_id": a["tool_calls"][0]["id"], "content": "x = 1"})
        else:
            msgs.append({"role": "user", "content": "and then"})
    assert reasons == ["no_prefix", "hit", "hit"]
    (traj,) = tree.snapshot("s")["trajectories"]
    assert len(traj["records"]) == 3
    full = chat.render(msgs[:-1])
    assert full == chat.decode(traj["accumulated_token_ids"]) + "\n"


def test_non_canonical_output_ids_are_kept_not_retokenized(chat, boundary):
    """The model may emit ids that decode to text the tokenizer would encode differently: the next
    prompt keeps the model's ids (what it saw), and the text still matches a full render."""
    tree = CaptureTree()
    msgs = [SYS, {"role": "user", "content": "say the word"}]
    word = chat.encode("the")
    assert len(word) == 1
    pieces = [chat.tokenizer.token_to_id("t"), chat.tokenizer.token_to_id("he")]
    assert None not in pieces and chat.decode(pieces) == "the"
    output = pieces + [chat.eos_id]
    _, a = play_turn(chat, boundary, tree, msgs, output)
    msgs = [*msgs, a, {"role": "user", "content": "again"}]
    plan, _ = play_turn(chat, boundary, tree, msgs, out(chat, "ok"))
    assert plan.hit
    assert plan.prompt_ids != chat.encode(plan.full_text)  # full re-tokenization would rewrite history
    assert chat.decode(plan.prompt_ids) == plan.full_text
    (traj,) = tree.snapshot("s")["trajectories"]
    assert traj["accumulated_token_ids"][: len(plan.prompt_ids)] == plan.prompt_ids
    assert traj["records"][1]["mismatch_report"] == []  # same text, other ids: not a mismatch


def test_model_text_the_template_would_render_differently_is_benign_assistant_text(chat, boundary):
    """Tool-call JSON without spaces: the parsed call re-renders with spaces. The prompt keeps what
    the model wrote (its ids), and debug validation classifies the difference as assistant text."""
    tree = CaptureTree()
    msgs = [SYS, {"role": "user", "content": "read"}]
    _, a = play_turn(
        chat,
        boundary,
        tree,
        msgs,
        out(chat, '<tool_call>\n{"name":"read_file","arguments":{}}\n</tool_call>'),
    )
    assert a["tool_calls"][0]["function"] == {"name": "read_file", "arguments": "{}"}
    msgs = [*msgs, a, {"role": "tool", "tool_call_id": a["tool_calls"][0]["id"], "content": "x"}]
    plan, _ = play_turn(chat, boundary, tree, msgs, out(chat, "ok"))
    assert plan.hit
    assert '{"name":"read_file"' in chat.decode(plan.prompt_ids)
    (traj,) = tree.snapshot("s")["trajectories"]
    assert [m["mismatch_type"] for m in traj["records"][1]["mismatch_report"]] == ["assistant_text"]


def test_length_finish_gets_the_whole_closing_text(chat, boundary):
    tree = CaptureTree()
    msgs = [SYS, {"role": "user", "content": "count"}]
    _, a = play_turn(chat, boundary, tree, msgs, out(chat, "one two", eos=False))
    msgs = [*msgs, a, {"role": "user", "content": "go on"}]
    plan, _ = play_turn(chat, boundary, tree, msgs, out(chat, "three"))
    assert plan.hit and chat.decode(plan.prompt_ids) == plan.full_text


def test_rewriting_template_starts_a_new_branch(reasoning):
    chat = reasoning
    boundary = Boundary.derive(chat)
    tree = CaptureTree()
    msgs = [SYS, {"role": "user", "content": "read it"}]
    _, a = play_turn(
        chat, boundary, tree, msgs, out(chat, "<think>\nhm\n</think>\n\n" + tool_text("read_file", {}))
    )
    msgs = [*msgs, a, {"role": "tool", "tool_call_id": a["tool_calls"][0]["id"], "content": "data"}]
    plan, a = play_turn(chat, boundary, tree, msgs, out(chat, "<think>\nok\n</think>\n\nIt says data."))
    assert plan.reason == "hit"  # a tool result does not move the last user message: still append-only
    msgs = [*msgs, a, {"role": "user", "content": "thanks"}]
    plan, _ = play_turn(chat, boundary, tree, msgs, out(chat, "Bye."))
    # the new user message strips the earlier <think> blocks: the stored ids are not the start of
    # the new prompt any more, so the turn starts a new root instead of being spliced
    assert plan.reason == "not_append_only" and plan.parent_hash is None
    assert plan.prompt_ids == chat.encode(plan.full_text)
    snap = tree.snapshot("s")
    assert [len(t["records"]) for t in snap["trajectories"]] == [2, 1]


def test_assistant_in_appended_is_a_miss(chat, boundary):
    tree = CaptureTree()
    msgs = [SYS, {"role": "user", "content": "a"}]
    _, a = play_turn(chat, boundary, tree, msgs, out(chat, "b"))
    edited = [
        *msgs,
        a,
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "forged"},
        {"role": "user", "content": "d"},
    ]
    plan = prepare_turn(chat, boundary, edited, lookup=tree.lookup)
    assert plan.reason == "assistant_in_appended" and not plan.hit


def test_different_render_context_misses(chat, boundary):
    tree = CaptureTree()
    msgs = [SYS, {"role": "user", "content": "a"}]
    _, a = play_turn(chat, boundary, tree, msgs, out(chat, "b"))
    nxt = [*msgs, a, {"role": "user", "content": "c"}]
    assert prepare_turn(chat, boundary, nxt, lookup=tree.lookup).hit
    assert not prepare_turn(chat, boundary, nxt, kwargs={"x": 1}, lookup=tree.lookup).hit
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert not prepare_turn(chat, boundary, nxt, tools=tools, lookup=tree.lookup).hit


def test_edited_echo_misses(chat, boundary):
    tree = CaptureTree()
    msgs = [SYS, {"role": "user", "content": "a"}]
    _, a = play_turn(chat, boundary, tree, msgs, out(chat, "b"))
    edited = {**a, "content": "B"}
    assert not prepare_turn(
        chat, boundary, [*msgs, edited, {"role": "user", "content": "c"}], lookup=tree.lookup
    ).hit


# --- hashing ---------------------------------------------------------------------------------------


def _h(msgs, tools=None, kwargs=None):
    return [h for _, h in hashing.prefix_hashes(hashing.render_context(tools, kwargs), msgs)][-1]


def test_hash_rules():
    tc = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"b": 1, "a": 2}'}}
    tc_sorted = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a":2,"b":1}'}}
    a = {"role": "assistant", "content": None, "tool_calls": [tc]}
    assert _h([a]) == _h([{**a, "content": ""}])  # None and "" hash the same
    assert _h([a]) == _h([{**a, "tool_calls": [tc_sorted]}])  # arguments canonicalised
    assert _h([{"role": "user", "content": "x", "name": "n"}]) == _h([{"role": "user", "content": "x"}])
    assert _h([{"role": "user", "content": "x"}]) != _h([{"role": "user", "content": "x"}], kwargs={"k": 1})
    assert _h([{"role": "tool", "content": "x", "tool_call_id": "1"}]) != _h(
        [{"role": "tool", "content": "x", "tool_call_id": "2"}]
    )
    assert _h([{"role": "user", "content": "ab"}, {"role": "user", "content": "c"}]) != _h(
        [{"role": "user", "content": "a"}, {"role": "user", "content": "bc"}]
    )
    assert _h([{**a, "reasoning_content": "r"}]) != _h([a])


# --- properties ------------------------------------------------------------------------------------

_words = st.lists(
    st.sampled_from(["the", "file", "read", " ", "\n", "é", "code", "{", "}", "🙂", "<", ">", "x1"]),
    min_size=1,
    max_size=12,
).map("".join)
_turn = st.tuples(st.sampled_from(["user", "tool", "tools2", "system"]), _words, _words, st.booleans())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(turns=st.lists(_turn, min_size=1, max_size=5))
def test_merged_prompt_always_decodes_to_the_full_render(chat, boundary, turns):
    """Whatever the conversation (tool runs, system and user turns, odd text, cut turns): a hit's
    prompt starts with the stored ids and its appended part decodes to exactly the rest of the full
    render; when every model output was text the template renders back unchanged, the whole prompt
    decodes to the full render."""
    tree = CaptureTree()
    msgs = [SYS, {"role": "user", "content": "start"}]
    canonical = True
    for kind, env_text, model_text, use_eos in turns:
        want_tool = kind in ("tool", "tools2")
        text = model_text + ("\n" + tool_text("read_file", {"p": env_text}) if want_tool else "")
        plan, a = _check(chat, boundary, tree, msgs, out(chat, text, eos=use_eos), canonical)
        closed = chat.render([*msgs, a])
        canonical = canonical and closed.endswith(text + boundary.close_text)
        msgs = [*msgs, a]
        calls = a.get("tool_calls") or []
        if calls:
            msgs.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": env_text})
            if kind == "tools2":
                msgs.append({"role": "tool", "tool_call_id": calls[0]["id"], "content": env_text + "2"})
        else:
            msgs.append({"role": "system" if kind == "system" else "user", "content": env_text})
    plan, _ = _check(chat, boundary, tree, msgs, out(chat, "end"), canonical)
    assert plan.hit


def _check(chat, boundary, tree, msgs, output, canonical):
    plan = prepare_turn(chat, boundary, msgs, lookup=tree.lookup)
    if plan.hit:
        node = tree.entries[plan.parent_hash]
        assert plan.prompt_ids[: len(node.token_ids)] == node.token_ids
        adjusted = boundary.adjust(node.token_ids)
        assert plan.prompt_ids[: len(adjusted)] == adjusted
        assert chat.decode(plan.prompt_ids[len(adjusted) :]) == plan.full_text[len(node.render_text) :]
        if canonical:
            assert chat.decode(plan.prompt_ids) == plan.full_text
    return play_turn(chat, boundary, tree, msgs, output)

"""Trajectories, GC and the commit-time prefix check of one session's capture tree."""

import pytest
import trio

from smgrl.tito.store import CaptureTree, PrefixMismatch


def h(name: str) -> bytes:
    return name.encode()


def put(tree, tid, name, parent, ids):
    return tree.commit(tid, h(name), h(parent) if parent else None, ids, {"prompt_token_count": 1}, name)


def test_auto_linear_chat_keeps_id_0():
    t = CaptureTree()
    assert t.reserve(None) == 0
    put(t, 0, "a", None, [1, 2])
    assert t.reserve(h("a")) == 0
    put(t, 0, "b", "a", [1, 2, 3, 4])
    assert list(t.trajectories) == [0]
    assert [len(x["records"]) for x in t.snapshot("s")["trajectories"]] == [2]


def test_auto_branch_from_internal_node_allocates_1():
    t = CaptureTree()
    put(t, t.reserve(None), "a", None, [1])
    put(t, t.reserve(h("a")), "b", "a", [1, 2])
    tid = t.reserve(h("a"))  # continues "a", which is no trajectory's leaf any more
    assert tid == 1
    put(t, tid, "c", "a", [1, 3])
    snap = t.snapshot("s")
    assert [x["trajectory_id"] for x in snap["trajectories"]] == [0, 1]
    assert [x["accumulated_token_ids"] for x in snap["trajectories"]] == [[1, 2], [1, 3]]


def test_auto_two_concurrent_continuations_get_0_and_1_and_abandoned_reservation_is_reused():
    t = CaptureTree()
    put(t, t.reserve(None), "a", None, [1])
    assert t.reserve(h("a")) == 0
    assert t.reserve(h("a")) == 1
    t.release(1)
    assert t.reserve(None) == 1


def test_manual_rollback_moves_the_pointer_and_collects_the_abandoned_branch():
    t = CaptureTree(strategy="manual")
    put(t, t.reserve(None, 0), "a", None, [1])
    put(t, t.reserve(h("a"), 0), "b", "a", [1, 2])
    put(t, t.reserve(h("a"), 0), "c", "a", [1, 3])  # the agent re-sent a shorter history
    assert set(t.entries) == {h("a"), h("c")}
    (traj,) = t.snapshot("s")["trajectories"]
    assert traj["accumulated_token_ids"] == [1, 3]


def test_gc_threshold_defers_collection():
    t = CaptureTree(strategy="manual", gc_threshold=10)
    put(t, 0, "a", None, [1])
    put(t, 0, "b", "a", [1, 2])
    put(t, 0, "c", "a", [1, 3])
    assert h("b") in t.entries  # unreachable but kept until the threshold
    assert [x["accumulated_token_ids"] for x in t.snapshot("s")["trajectories"]] == [[1, 3]]


def test_commit_refuses_a_turn_that_does_not_extend_its_parent():
    t = CaptureTree()
    put(t, t.reserve(None), "a", None, [1, 2, 3])
    tid = t.reserve(h("a"))
    with pytest.raises(PrefixMismatch):
        put(t, tid, "b", "a", [1, 9, 3, 4])
    assert h("b") not in t.entries


def test_max_trim_tokens_allows_that_many_differing_tail_ids():
    t = CaptureTree(max_trim_tokens=1)
    put(t, t.reserve(None), "a", None, [1, 2, 3])
    put(t, t.reserve(h("a")), "b", "a", [1, 2, 9, 4])
    assert t.trajectories[0] == h("b")


def test_empty_snapshot_has_a_list():
    assert CaptureTree().snapshot("s") == {"session_id": "s", "max_trim_tokens": 0, "trajectories": []}


def test_long_ids_are_held_as_arrays_and_compared_across_forms():
    # A full garbage collection walks every item of every list alive: a node's ids longer than
    # PACK_AT are held as an array('i') (C ints, no item the collector visits), short ones lists; a child is checked
    # against its parent whichever form either is in (a list never equals an array).
    import gc
    from array import array

    from smgrl.core.wire import json_bytes
    from smgrl.sessions import encode_json
    from smgrl.tito import PACK_AT

    long = list(range(PACK_AT + 10))
    t = CaptureTree()
    short = put(t, t.reserve(None), "s", None, [1, 2])
    assert type(short.token_ids) is list
    a = put(t, t.reserve(None), "a", None, long)
    assert type(a.token_ids) is array and gc.get_referents(a.token_ids) == [array]  # no item visited
    assert a.token_ids.tolist() == long and a.token_ids is not long
    b = put(t, t.reserve(h("a")), "b", "a", [*long, 7])  # a list child of an array parent
    assert b.parent == h("a") and b.token_ids.tolist() == [*long, 7]
    with pytest.raises(PrefixMismatch):
        put(t, t.reserve(h("a")), "c", "a", [0, *long])
    c = put(t, t.reserve(h("s")), "c", "s", array("i", [1, 2, 3]))  # an array child of a list parent
    assert c.parent == h("s")
    # The snapshot's JSON is what the lists would give, byte for byte.
    snap = t.snapshot("x")
    as_lists = {
        **snap,
        "trajectories": [
            {**tr, "accumulated_token_ids": list(tr["accumulated_token_ids"])} for tr in snap["trajectories"]
        ],
    }
    assert trio.run(encode_json, snap) == json_bytes(as_lists)


def test_ids_that_do_not_fit_32_bits_stay_exact():
    big = [2**40] * (10_000)
    t = CaptureTree()
    node = put(t, t.reserve(None), "a", None, big)
    assert node.token_ids == big

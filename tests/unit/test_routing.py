"""Load-balancing policies and the approximate prefix tree (pure)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from smgrl.core.worker import Worker
from smgrl.routing.instance import Instance, from_worker, routable, served_models
from smgrl.routing.policy import (
    CacheAware,
    CacheAwareConfig,
    LeastLoad,
    PowerOfTwo,
    Random,
    RoundRobin,
    make_policy,
    sticky,
)
from smgrl.routing.radix import RadixTree, common_prefix_len


def inst(i: int, model: str = "m") -> Instance:
    return Instance(f"w{i}", f"http://e{i}", f"http://e{i}", f"w{i}", None, model, None)


FLEET = [inst(i) for i in range(4)]


# -- instances -------------------------------------------------------------------------------------


def test_instances_from_registry_records():
    w = Worker(id="a", url="http://h:1@1", base_url="http://h:1", status="ready", dp_aware=True,
               dp_rank=1, group="g", caller_labels={"served_model_name": "M", "weight_version": "7"})  # fmt: skip
    i = from_worker(w, dp_aware=True)
    assert (i.worker_id, i.base_url, i.group, i.dp_rank, i.model, i.label_version) == (
        "a",
        "http://h:1",
        "g",
        1,
        "M",
        "7",
    )
    assert i.identity == ("g", 1)
    assert from_worker(w, dp_aware=False).dp_rank is None
    placeholder = Worker(
        id="b", url="http://h:2", base_url="http://h:2", caller_labels={"weight_version": "default"}
    )
    assert from_worker(placeholder, False).label_version is None
    assert routable(w)
    assert not routable(Worker(id="p", url="u", base_url="u"))  # pending
    assert not routable(
        Worker(id="g", url="grpc://h:1", base_url="grpc://h:1", status="ready", connection_mode="grpc")
    )
    assert not routable(Worker(id="d", url="u", base_url="u", status="ready", worker_type="decode"))
    assert served_models([w, placeholder, attrs_ready(placeholder)]) == ["M", "unknown"]


def attrs_ready(w: Worker) -> Worker:
    import attrs

    return attrs.evolve(w, status="ready")


# -- simple policies -----------------------------------------------------------------------------


def test_round_robin_takes_turns():
    p = RoundRobin()
    assert [p.select(FLEET, {}, None, 0).worker_id for _ in range(6)] == ["w0", "w1", "w2", "w3", "w0", "w1"]


def test_random_is_uniform_and_seeded():
    a = Random(random.Random(7))
    b = Random(random.Random(7))
    picks = [a.select(FLEET, {}, None, 0).worker_id for _ in range(400)]
    assert picks == [b.select(FLEET, {}, None, 0).worker_id for _ in range(400)]
    assert set(Counter(picks)) == {"w0", "w1", "w2", "w3"}
    assert min(Counter(picks).values()) > 50


@pytest.mark.parametrize(
    "loads, never",
    [
        ({"w0": 5, "w1": 5, "w2": 5, "w3": 0}, None),
        ({"w0": 9, "w1": 0, "w2": 0, "w3": 0}, "w0"),  # the busiest of any pair never wins
    ],
)
def test_power_of_two_prefers_the_less_loaded_of_two(loads, never):
    p = PowerOfTwo(random.Random(1))
    picks = Counter(p.select(FLEET, loads, None, 0).worker_id for _ in range(300))
    if never:
        assert picks[never] == 0
    else:
        # w3 wins every pair it is drawn in: 3 of the 6 pairs, half the picks.
        assert 0.4 < picks["w3"] / 300 < 0.6


def test_power_of_two_with_one_candidate_and_least_load():
    assert PowerOfTwo(random.Random(1)).select(FLEET[:1], {}, None, 0).worker_id == "w0"
    assert LeastLoad().select(FLEET, {"w0": 3, "w1": 1, "w2": 2, "w3": 1}, None, 0).worker_id == "w1"


def test_make_policy_names_and_aliases():
    for name, cls in [
        ("round_robin", RoundRobin), ("random", Random), ("power_of_two", PowerOfTwo),
        ("cache_aware", CacheAware), ("least_load", LeastLoad), ("prefix_hash", CacheAware),
        ("passthrough", RoundRobin), ("manual", Random), ("consistent_hashing", Random),
    ]:  # fmt: skip
        assert isinstance(make_policy(name), cls)
    with pytest.raises(ValueError):
        make_policy("newest")


# -- routing key -------------------------------------------------------------------------------------


def test_routing_key_is_sticky_and_only_moves_keys_of_a_leaving_instance():
    keys = [f"session-{i}" for i in range(200)]
    before = {k: sticky(FLEET, k).worker_id for k in keys}
    assert all(sticky(FLEET, k).worker_id == before[k] for k in keys)  # deterministic
    assert len(set(before.values())) == 4  # spread over the fleet
    smaller = [i for i in FLEET if i.worker_id != "w2"]
    after = {k: sticky(smaller, k).worker_id for k in keys}
    moved = {k for k in keys if after[k] != before[k]}
    assert moved == {k for k in keys if before[k] == "w2"}


# -- cache-aware ----------------------------------------------------------------------------------


def cache(**kw) -> CacheAware:
    return CacheAware(CacheAwareConfig(**kw))


def test_cache_aware_keeps_a_prefix_on_the_instance_that_has_it():
    p = cache()
    system = "You are a helpful assistant. Solve the following problem step by step. "
    first = p.select(FLEET, {}, system + "What is 2+2?", 0).worker_id
    for i, q in enumerate(["What is 3+3?", "Name a prime.", "Why is the sky blue?"]):
        assert p.select(FLEET, {}, system + q, i + 1).worker_id == first


def test_cache_aware_spreads_unrelated_prompts_to_the_emptiest_tree():
    p = cache()
    picks = [p.select(FLEET, {}, f"{chr(65 + i) * 40} unrelated prompt {i}", i).worker_id for i in range(4)]
    assert sorted(picks) == ["w0", "w1", "w2", "w3"]


def test_cache_aware_threshold():
    p = cache(cache_threshold=0.9)
    a = p.select(FLEET, {}, "abcdefghij" * 4, 0).worker_id
    # Shares 50% < 90%: not pinned, goes to an instance with an empty tree.
    b = p.select(FLEET, {}, "abcdefghij" * 2 + "z" * 20, 1).worker_id
    assert b != a
    # Shares 100% of its length: pinned.
    assert p.select(FLEET, {}, "abcdefghij" * 4, 2).worker_id == a


def test_cache_aware_spills_a_hot_prefix_when_the_load_is_unbalanced():
    p = cache(balance_abs_threshold=4, balance_rel_threshold=1.5)
    hot = "the same long system prompt " * 4
    home = p.select(FLEET, {}, hot, 0).worker_id
    balanced = {w.worker_id: 2 for w in FLEET} | {home: 5}  # max-min = 3: still balanced
    assert p.select(FLEET, balanced, hot, 1).worker_id == home
    loads = {w.worker_id: 1 for w in FLEET} | {home: 10}  # 10-1 > 4 and 10 > 1.5: unbalanced
    spill = p.select(FLEET, loads, hot, 2).worker_id
    assert spill != home and loads[spill] == 1
    # The spilled-to instance now holds the prefix too: both can serve it from cache.
    _, tenants = p.trees["m"].match(hot, {w.worker_id for w in FLEET})
    assert set(tenants) == {home, spill}


def test_cache_aware_token_ids_and_no_prefix():
    p = cache()
    a = p.select(FLEET, {}, tuple(range(100)), 0).worker_id
    assert p.select(FLEET, {}, (*range(90), 7, 7), 1).worker_id == a
    # Nothing to match on: the least-loaded instance.
    assert p.select(FLEET, {"w0": 3, "w1": 0, "w2": 3, "w3": 3}, None, 2).worker_id == "w1"


def test_cache_aware_only_matches_among_the_candidates():
    p = cache()
    prompt = "a shared prefix that is long enough to count" * 2
    home = p.select(FLEET, {}, prompt, 0)
    others = [i for i in FLEET if i is not home]
    assert p.select(others, {}, prompt, 1).worker_id != home.worker_id


def test_cache_aware_forget_drops_an_instance_everywhere():
    p = cache()
    prompt = "x" * 50
    home = p.select(FLEET, {}, prompt, 0).worker_id
    p.forget(home)
    assert home not in p.trees["m"].sizes()
    assert p.trees["m"].match(prompt, {home}) == (0, [])


def test_one_tree_per_model():
    p = cache()
    a = [inst(0, "a"), inst(1, "a")]
    b = [inst(2, "b"), inst(3, "b")]
    p.select(a, {}, "prompt", 0)
    p.select(b, {}, "prompt", 0)
    assert set(p.trees) == {"a", "b"}


# -- the radix tree -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "a, b, n",
    [("", "", 0), ("abc", "abd", 2), ("abc", "abc", 3), ("abc", "ab", 2), ("x", "y", 0),
     ((1, 2, 3), (1, 2, 4), 2), ("a" * 1000 + "b", "a" * 1000 + "c", 1000)],
)  # fmt: skip
def test_common_prefix_len(a, b, n):
    assert common_prefix_len(a, b) == n


def test_radix_insert_split_match_and_sizes():
    t = RadixTree()
    t.insert("hello world", "A", 1)
    t.insert("hello there", "B", 2)
    assert t.match("hello world!", {"A", "B"}) == (11, ["A"])
    matched, tenants = t.match("hello zzz", {"A", "B"})
    assert matched == 6 and sorted(tenants) == ["A", "B"]
    assert t.match("hello world", {"B"}) == (6, ["B"])
    assert t.match("nothing", {"A", "B"}) == (0, [])
    assert t.sizes() == {"A": 11, "B": 11}
    t.insert("hello world", "B", 3)
    assert t.sizes() == {"A": 11, "B": 16}
    t.remove_tenant("A")
    assert t.sizes() == {"B": 16}
    assert t.match("hello world", {"A"}) == (0, [])


def test_radix_evicts_least_recently_used_leaves_first():
    t = RadixTree(max_size=30)
    t.insert("aaaaaaaaaa", "old", 1)  # 10
    t.insert("bbbbbbbbbb", "mid", 2)  # 10
    t.insert("cccccccccc", "new", 3)  # 10 -> 30, at the cap
    t.insert("dddddddddd", "newest", 4)  # 40 > 30: evict down to 27 -> the oldest leaf goes
    assert "old" not in t.sizes() and t.size <= 30
    assert t.match("aaaaaaaaaa", {"old"}) == (0, [])
    assert t.match("dddddddddd", {"newest"}) == (10, ["newest"])


def test_radix_eviction_keeps_the_shared_path_of_a_live_tenant():
    t = RadixTree(max_size=1000)
    t.insert("prefix-A-tail", "x", 1)
    t.insert("prefix-B-tail", "x", 5)
    t.evict(8)  # keep at most 8: "A-tail" (older) goes first, then "B-tail"
    assert t.size <= 8
    assert t.match("prefix-", {"x"})[0] in (0, 7)

"""The ids smgrl makes come from one scheme (UUIDv7); short tags take its random end; an engine
call's id is a per-process prefix and a counter."""

import uuid

import pytest

from smgrl.core import ids


def test_a_hex_id_is_a_uuid7():
    value = uuid.UUID(ids.new_hex_id())
    assert value.version == 7 and len(value.hex) == 32


def test_tags_made_in_one_millisecond_differ(monkeypatch):
    # The start of a UUIDv7 is the clock: a tag cut from it would be the same for every id made in
    # one millisecond (two processes starting together would share their "unique" tag).
    monkeypatch.setattr(ids.time, "time", lambda: 1_700_000_000.123)
    tags = {ids.new_tag(8) for _ in range(200)}
    assert len(tags) == 200
    assert all(len(t) == 8 and int(t, 16) >= 0 for t in tags)


@pytest.mark.parametrize("length", [0, 19])
def test_a_tag_longer_than_the_random_bits_is_refused(length):
    with pytest.raises(ValueError):
        ids.new_tag(length)


def test_call_ids_are_unique_and_a_forked_child_draws_its_own_prefix():
    made = [ids.new_call_id() for _ in range(1000)]
    assert len(set(made)) == 1000 and all(len(i) == 24 and int(i, 16) >= 0 for i in made)
    prefix = made[0][:16]
    assert {i[:16] for i in made} == {prefix}
    ids._fresh_calls()  # what os.register_at_fork runs in a child
    after = ids.new_call_id()
    assert after[:16] != prefix and after not in made

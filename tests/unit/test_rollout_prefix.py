"""The routing prefix of a rollout body (smgrl/dataplane/request.py): token ids only when every
id of the head is an int (a bool, float or string is not a token id), at most
ROUTING_TEXT_LIMIT of them; text cut at the same bound."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smgrl.dataplane.request import GENERATE, ROUTING_TEXT_LIMIT, parse

LIMIT = ROUTING_TEXT_LIMIT


@pytest.mark.parametrize(
    ("body", "prefix"),
    [
        ({"input_ids": [1, 2, 3]}, (1, 2, 3)),
        ({"input_ids": [[4, 5], [6]]}, (4, 5)),  # a batch: its first prompt
        ({"input_ids": [1, True, 3]}, None),  # json's true is a bool, not the token 1
        ({"input_ids": [1, 2.0]}, None),
        ({"input_ids": ["1", 2]}, None),
        ({"input_ids": [1, None]}, None),
        ({"input_ids": [1, [2]]}, None),
        ({"input_ids": []}, None),
        ({"input_ids": list(range(LIMIT + 10))}, tuple(range(LIMIT))),
        # Only the head is looked at: what follows the bound does not matter.
        ({"input_ids": [*range(LIMIT), "x"]}, tuple(range(LIMIT))),
        ({"input_ids": [*range(LIMIT - 1), "x"]}, None),
        ({"text": "hello"}, "hello"),
        ({"text": "x" * (LIMIT + 5)}, "x" * LIMIT),
    ],
)
def test_generate_prefix(body, prefix):
    assert parse(GENERATE, json.dumps(body).encode()).prefix == prefix


@given(st.lists(st.one_of(st.integers(), st.booleans(), st.floats(allow_nan=False), st.text(max_size=2))))
def test_token_prefix_is_the_ids_exactly_when_all_are_ints(ids):
    got = parse(GENERATE, json.dumps({"input_ids": ids}).encode()).prefix
    assert got == (tuple(ids) if ids and all(type(t) is int for t in ids) else None)

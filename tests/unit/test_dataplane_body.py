"""smgrl.http.bodies.dataplane_body: SMG's refusals of rollout bodies (pure). The HTTP-level rows are in
tests/api/test_dataplane.py and, side by side with SMG 1.13.0, tests/conformance."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smgrl.core.errors import InvalidRequest
from smgrl.dataplane import request as rq
from smgrl.http.bodies import dataplane_body as db
from smgrl.http.bodies.serde_body import SerdeError, serde_struct

CT = b"application/json"
MSGS = [{"role": "user", "content": "hi"}]


def test_an_escaped_surrogate_pair_stays_on_the_fast_path_and_a_lone_one_is_refused():
    pair = json.dumps({"model": "m", "messages": [{"role": "user", "content": "\U0001f600"}]}).encode()
    assert b"\\ud83d\\ude00" in pair  # ensure_ascii escapes the emoji as a pair
    assert db._fast(rq.CHAT, pair) is not None
    with pytest.raises(InvalidRequest) as info:
        db.parse(rq.CHAT, pair.replace(b"\\ude00", b""), CT)
    assert info.value.code == "invalid_json"


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        (b'{"model": 7, "messages": []' + b" " * (2 << 20) + b"}", "invalid_type", "model"),
        (b'{"messages": []' + b" " * (2 << 20) + b"}", "missing_required_parameter", "model"),
        (b"{" + b" " * (2 << 20), "invalid_json", None),
    ],
)
def test_a_large_refused_body_keeps_smgs_code_and_param_without_serdes_position(body, code, param):
    # serde's pure-Python reading would hold the event loop for seconds on a 64 MiB body.
    with pytest.raises(InvalidRequest) as info:
        db.parse(rq.CHAT, body, CT)
    assert (info.value.code, info.value.body()["error"]["param"]) == (code, param)


def test_generate_stays_lenient():
    for body in (b'{"text": ["a", "b"]}', b'{"input_ids": [[1, 2]], "sampling_params": {"x": "y"}}', b"{}"):
        assert db.parse(rq.GENERATE, body, None).model is None
    assert db.parse(rq.GENERATE, b'{"model": "m", "text": "a"}', b"text/plain").model == "m"


def test_token_id_prompts_are_forwarded_on_completions():
    for prompt in ([1, 2, 3], [[1, 2], [3]], "text", ["a", "b"]):
        body = json.dumps({"model": "m", "prompt": prompt}).encode()
        assert db.parse(rq.COMPLETIONS, body, CT).model == "m"


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8,
)
FIELDS = st.sampled_from(sorted(db.CHAT_FIELDS))


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(FIELDS, JSON, max_size=4), st.booleans())
def test_the_fast_check_never_accepts_what_serde_refuses(extra, with_messages):
    obj = {"model": "m", **({"messages": MSGS} if with_messages else {}), **extra}
    body = json.dumps(obj).encode()
    fast = db._fast(rq.CHAT, body)
    try:
        serde_struct(body, "ChatCompletionRequest", db.CHAT_FIELDS, ("messages", "model"), flatten=True,
                     untagged_ok=db.untagged_ok)  # fmt: skip
        serde_ok = True
    except SerdeError:
        serde_ok = False
    if fast is not None:
        assert serde_ok, body


OK_CHAT = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@pytest.mark.parametrize(
    ("body", "code", "text"),
    [
        (b"\xef\xbb\xbf" + OK_CHAT, "invalid_json", "expected value at line 1 column 1"),
        (OK_CHAT.decode().encode("utf-16"), "invalid_json", "expected value at line 1 column 1"),
        (OK_CHAT[:-1] + b', "messages": []}', "json_parse_error", "duplicate field `messages`"),
        (
            OK_CHAT[:-1] + b', "stream": true, "stream": false}',
            "json_parse_error",
            "duplicate field `stream`",
        ),
        (OK_CHAT[:-1] + b', "max_tokens": -0}', "invalid_type", "floating point `-0.0`, expected u32"),
        (OK_CHAT[:-1] + b', "user": "\\\\ud83d\\ude00"}', "invalid_json", "lone leading surrogate"),
    ],
    ids=[
        "utf-8 BOM",
        "utf-16",
        "duplicate messages",
        "duplicate stream",
        "-0 for a u32",
        "escaped backslash",
    ],
)
def test_bodies_python_reads_and_serde_refuses_are_refused(body, code, text):
    # Regression: the data plane's own fast check took these (json.loads reads a BOM and UTF-16,
    # keeps the last of repeated fields, reads -0 as 0, and the surrogate scan was fooled by an
    # escaped backslash); SMG refuses each. The fast path is now serde_body.fast_parse.
    with pytest.raises(InvalidRequest) as info:
        db.parse(rq.CHAT, body, CT)
    assert info.value.code == code and text in info.value.body()["error"]["message"]

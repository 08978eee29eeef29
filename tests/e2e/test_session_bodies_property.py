"""Any body on the session turn routes is answered without a gateway 5xx (hypothesis).

A real `smgrl launch` with the test tokenizer and a real fake-engine process; the bodies are
drawn from the chat body's schema with every field allowed to take the wrong type (messages,
roles, content, tool calls and their functions, reasoning_content, tools, max_tokens, stream,
template kwargs), text including lone surrogates. Each goes to a fresh session, half through
`/sessions/{id}/v1/chat/completions`, half through SMG's `x-smg-tito-session-id` header.
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smgrl.demo.procs import wait_for_workers
from smgrl.tito.testkit import make_model_dir

pytestmark = pytest.mark.e2e

# Text with every code point, lone surrogates included (json.dumps escapes them as \\udXXX).
TEXT = st.text(alphabet=st.characters(blacklist_categories=()), max_size=12)
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=6,
)


def mostly(valid: st.SearchStrategy) -> st.SearchStrategy:
    """Usually a value of the right type, sometimes any JSON: a body wrong in one place at a time
    reaches the code past the checks it passes."""
    return st.one_of(valid, valid, valid, ANY_JSON)


FUNCTION = st.fixed_dictionaries(
    {"name": mostly(TEXT)}, optional={"arguments": mostly(TEXT), "description": mostly(TEXT)}
)
TOOL_CALL = st.fixed_dictionaries(
    {"function": mostly(FUNCTION)}, optional={"id": mostly(TEXT), "type": mostly(st.just("function"))}
)
MESSAGE = st.fixed_dictionaries(
    {"role": mostly(st.sampled_from(["user", "assistant", "tool", "system"]))},
    optional={
        "content": mostly(
            TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": mostly(TEXT)}))
        ),
        "tool_calls": mostly(st.lists(mostly(TOOL_CALL), max_size=2)),
        "reasoning_content": mostly(TEXT),
        "tool_call_id": mostly(TEXT),
        "name": mostly(TEXT),
    },
)
BODY = st.fixed_dictionaries(
    {"messages": mostly(st.lists(mostly(MESSAGE), min_size=1, max_size=4))},
    optional={
        "max_tokens": mostly(st.integers(-10, 2**40)),
        "temperature": mostly(st.floats(-5, 5)),
        "stream": mostly(st.booleans()),
        "model": mostly(TEXT),
        "tools": mostly(st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": FUNCTION}))),
        "chat_template_kwargs": mostly(st.dictionaries(TEXT, ANY_JSON, max_size=2)),
        "stop": mostly(TEXT | st.lists(TEXT)),
    },
)


@pytest.fixture
def live(fakes, gateway, tmp_path):
    tok = make_model_dir(tmp_path / "tok")
    urls = fakes("sglang", 1, "--tokenizer-path", str(tok))
    gw, http, _port = gateway(
        "--enable-rl", "--disable-health-check", "--tokenizer-path", str(tok), "--worker-urls", *urls
    )
    wait_for_workers(http.base, 1, child=gw)
    with httpx.Client(base_url=http.base, timeout=60) as client:
        yield client


def turn(live: httpx.Client, data: bytes, through_header: bool) -> httpx.Response:
    """One session turn with body ``data``: in a session opened for it, or through the session
    header on the plain chat route."""
    head = {"content-type": "application/json"}
    if through_header:
        head["x-smg-tito-session-id"] = "turn-" + uuid.uuid4().hex
        return live.post("/v1/chat/completions", content=data, headers=head)
    sid = live.post("/sessions").json()["session_id"]
    return live.post(f"/sessions/{sid}/v1/chat/completions", content=data, headers=head)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=BODY, through_header=st.booleans())
def test_no_session_turn_body_gets_a_gateway_5xx(live, body, through_header):
    data = json.dumps(body).encode()
    r = turn(live, data, through_header)
    assert r.status_code < 500, (r.status_code, r.text[:500], data[:500])


@pytest.mark.parametrize("through_header", [False, True])
def test_a_completion_longer_than_the_engines_context_is_the_callers_400(live, through_header):
    """The engine refuses it (SGLang's 400 with its own words): relayed as engine_refused, not
    blamed on the engine with a 502. Found by the property above."""
    data = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 40954}).encode()
    r = turn(live, data, through_header)
    assert r.status_code == 400, r.text
    assert r.headers["x-smg-error-code"] == "engine_refused"
    error = r.json()["error"]
    assert error["code"] == "engine_refused"
    assert "the engine answered 400" in error["message"] and "context length" in error["message"]

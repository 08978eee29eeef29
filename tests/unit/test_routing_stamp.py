"""Response stamping (pure): which version an answer names, the mixed flag,
system_fingerprint on OpenAI answers, and the single-prompt rule."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smgrl.core.wire import json_bytes
from smgrl.dataplane import stamp as stamp_module
from smgrl.dataplane.stamp import (
    FingerprintEvents,
    RenderedJson,
    TokenTail,
    _reported_single,
    _tokens_single,
    stamp_generate,
    stamp_openai,
    version_tag,
)


def gen(version=None, spans=None, **extra) -> dict:
    meta = {"id": "x"}
    if version is not None:
        meta["weight_version"] = version
    if spans is not None:
        meta["weight_versions"] = [{"version": v, "start": i, "end": i + 1} for i, v in enumerate(spans)]
    return {"text": "t", "meta_info": meta, **extra}


@pytest.mark.parametrize(
    "answer, table, version, mixed",
    [
        (gen("v7"), None, "v7", False),  # engine-reported first
        (gen("v7"), "v7", "v7", False),
        (gen("42"), "042", "42", False),  # numeric versions compare by value
        (gen(), "v3", "v3", False),  # then the table
        (gen(), None, "default", False),  # then "default"
        (gen("v8"), "v7", "v8", True),  # the engine drifted from the table
        (gen("v8", spans=["v7", "v8"]), None, "v8", True),  # weights changed mid-request
        (gen("v8", spans=["v8"]), None, "v8", False),
        ([gen("v1"), gen("v2")], None, "v2", True),  # a batch whose items disagree
        ([gen("v1"), gen("v1")], "v1", "v1", False),
        (gen("bad version"), "v1", "v1", False),  # not header-safe: ignored
        (gen(True), None, "default", False),
        (gen("default"), "v3", "v3", False),  # SGLang's placeholder does not override the table
    ],
)
def test_generate_version_and_mixed(answer, table, version, mixed):
    stamp = stamp_generate(json.dumps(answer).encode(), table, single=not isinstance(answer, list))
    assert (stamp.version, stamp.mixed) == (version, mixed)
    names = dict(stamp.headers())
    assert names[b"x-smg-weight-version"] == version.encode()
    assert (b"x-smg-mixed-version" in names) == mixed


def test_single_prompt_generate_answers_one_object():
    body = json.dumps([gen("v1")]).encode()
    assert json.loads(stamp_generate(body, None, single=True).body) == gen("v1")
    assert stamp_generate(body, None, single=False).body == body  # a batch of one stays a list
    raw = json.dumps(gen("v1")).encode()
    assert stamp_generate(raw, None, single=True).body == raw  # untouched when already an object


def test_non_json_generate_is_stamped_from_the_table():
    stamp = stamp_generate(b"not json", "v2", single=True)
    assert (stamp.version, stamp.mixed, stamp.body) == ("v2", False, b"not json")


def test_openai_system_fingerprint():
    answer = {"id": "c", "object": "chat.completion", "choices": [], "metadata": {"weight_version": "v9"}}
    stamp = stamp_openai(json.dumps(answer).encode(), "v8")
    assert stamp.version == "v9" and json.loads(stamp.body)["system_fingerprint"] == "v9"
    plain = {"id": "c", "object": "text_completion", "choices": [], "system_fingerprint": None}
    stamp = stamp_openai(json.dumps(plain).encode(), "v8")
    assert stamp.version == "v8" and json.loads(stamp.body)["system_fingerprint"] == "v8"
    already = json.dumps({**plain, "system_fingerprint": "default"}).encode()
    assert stamp_openai(already, None).body == already  # nothing to change: bytes kept
    assert stamp_openai(b"[1]", None).body == b"[1]"


def test_version_tag():
    assert version_tag("v3") == b"v3" and version_tag("default") == b"-1" and version_tag(None) == b"-1"


def test_fingerprint_events_across_chunk_boundaries():
    events = [
        b'data: {"id":"a","choices":[{"delta":{"content":"x"}}]}\n\n',
        b'data: {"id":"a","choices":[],"system_fingerprint":null}\n\n',
        b'data: {"error":{"message":"boom"}}\n\n',
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(events)
    for cut in range(1, len(stream)):
        f = FingerprintEvents("v5")
        out = f.feed(stream[:cut]) + f.feed(stream[cut:]) + f.flush()
        parts = out.split(b"\n\n")
        assert json.loads(parts[0][6:])["system_fingerprint"] == "v5"
        assert json.loads(parts[1][6:])["system_fingerprint"] == "v5"
        assert parts[2] == b'data: {"error":{"message":"boom"}}'  # errors untouched
        assert parts[3] == b"data: [DONE]" and out.endswith(b"\n\n")


def test_fingerprint_events_keep_an_unterminated_tail_for_flush():
    f = FingerprintEvents("v1")
    assert f.feed(b'data: {"a":1}') == b""
    assert f.flush() == b'data: {"a":1}'


def test_first_event_version():
    from smgrl.dataplane.stamp import first_event_version

    event = b'data: {"text": "a", "meta_info": {"weight_version": "v4"}}\n\n'
    assert first_event_version(event + b"data: [DONE]\n\n") == "v4"
    assert first_event_version(event[:-2]) is None  # incomplete: the table's version
    assert first_event_version(b"data: [DONE]\n\n") is None
    assert first_event_version(b'data: {"text": "a"}\n\n') is None
    assert first_event_version(b"data: {bad\n\n") is None
    assert first_event_version(b": comment\n\n") is None


@pytest.mark.parametrize("newline", [b"\r\n", b"\r", b"\n"])
def test_fingerprint_events_with_any_legal_line_end_are_relayed_as_each_event_completes(newline):
    # An engine framing its SSE with CRLF (legal) was held until a `\n\n` that never
    # came: the whole stream reached the client at its end.
    blank = newline + newline
    first = b'data: {"id":"a","choices":[]}' + blank
    second = b'data: {"id":"b","choices":[]}' + blank + b"data: [DONE]" + blank
    f = FingerprintEvents("v2")
    out = f.feed(first)
    assert out.endswith(blank) and json.loads(out[6 : -len(blank)])["system_fingerprint"] == "v2"
    rest = f.feed(second) + f.flush()
    assert rest.endswith(b"data: [DONE]" + blank)
    assert json.loads(rest[6 : rest.index(blank)])["system_fingerprint"] == "v2"


def test_first_event_version_with_crlf_framing():
    from smgrl.dataplane.stamp import first_event_version

    event = b'data: {"text": "a", "meta_info": {"weight_version": "v4"}}\r\n\r\n'
    assert first_event_version(event) == "v4"


# -- the fast path for large answers (no full parse) ---------------------------------------------

_tricky_text = st.lists(
    st.sampled_from(['"', "\\", "{", "}", "[", "]", ",", ":", " ", "a", "é", "\n"])
    | st.sampled_from(['"meta_info":{', '"weight_version":"v9"', ',"weight_version":', '"weight_versions"']),
    max_size=12,
).map("".join)
_plain_version = st.sampled_from(["v1", "v2", "42", "042", "default", "bad version", "vé", ""])
_version_value = st.one_of(
    _plain_version,
    st.sampled_from(['v"q', "v\\1"]),
    st.integers(-5, 10**6),
    st.none(),
    st.booleans(),
    st.floats(allow_nan=False, allow_infinity=False),
)


def _rarely(draw, strategy):
    return draw(st.integers(0, 5)) == 0 and draw(strategy)


@st.composite
def _answers(draw) -> dict:
    """Mostly what engines send (meta_info with a plain weight_version, text full of JSON
    punctuation and the very keys searched for), sometimes each oddity that must fall back."""
    meta: dict = {"id": draw(_tricky_text)}
    if draw(st.integers(0, 4)):
        meta["weight_version"] = draw(_plain_version if draw(st.integers(0, 3)) else _version_value)
    if _rarely(draw, st.just(True)):
        meta["weight_versions"] = [{"version": "v1"}, {"version": "v2"}][: draw(st.integers(1, 2))]
    if draw(st.integers(0, 2)):
        meta["completion_tokens"] = draw(_token_count)
    if _rarely(draw, st.just(True)):
        meta["nested"] = {"weight_version": draw(_version_value)}  # not meta_info's own
    if _rarely(draw, st.just(True)):
        meta["usage"] = {"completion_tokens": draw(_token_count)}  # not meta_info's own
    meta["output_token_logprobs"] = [[-0.5, i, draw(_tricky_text)] for i in range(draw(st.integers(0, 3)))]
    meta = {k: meta[k] for k in draw(st.permutations(list(meta)))}
    answer: dict = {"text": draw(_tricky_text), "output_ids": draw(st.lists(st.integers(0, 9), max_size=4))}
    if draw(st.integers(0, 8)):
        answer["meta_info"] = meta
    if _rarely(draw, st.just(True)):
        answer["weight_version"] = draw(_version_value)  # top level: not meta_info's
    if _rarely(draw, st.just(True)):
        answer["extra"] = {"meta_info": {"weight_version": draw(_version_value)}}
    return {k: answer[k] for k in draw(st.permutations(list(answer)))}


_token_count = st.one_of(
    st.integers(0, 10**6), st.integers(-3, -1), st.just(2.0), st.just("7"), st.none(), st.just(True)
)


@settings(max_examples=400, deadline=None)
@given(
    answer=_answers(),
    spaced=st.booleans(),
    ascii_only=st.booleans(),
    table=st.sampled_from([None, "v1", "v2", "default"]),
)
def test_the_fast_stamp_agrees_with_the_full_parse(answer, spaced, ascii_only, table):
    separators = (", ", ": ") if spaced else (",", ":")
    body = json.dumps(answer, separators=separators, ensure_ascii=ascii_only).encode()
    assert stamp_generate(body, table, True, fast_min=0) == stamp_generate(
        body, table, True, fast_min=len(body) + 1
    )


@settings(max_examples=300, deadline=None)
@given(
    answers=st.lists(_answers(), min_size=1, max_size=3),
    batch=st.booleans(),
    single=st.booleans(),
    table=st.sampled_from([None, "v1", "v2", "default"]),
)
def test_a_rendered_answer_is_stamped_from_its_object_as_its_bytes_would_be(answers, batch, single, table):
    obj = answers if batch else answers[0]
    rendered = RenderedJson.of(obj)
    assert rendered == json_bytes(obj)
    assert stamp_generate(rendered, table, single) == stamp_generate(json_bytes(obj), table, single)
    openai = {"id": "c", "choices": [], "metadata": {"weight_version": answers[0].get("text")}}
    before = json.loads(json.dumps(openai))
    assert stamp_openai(RenderedJson.of(openai), table) == stamp_openai(json_bytes(openai), table)
    assert openai == before  # the shared object is not rewritten


def test_a_rendered_answer_is_not_parsed_again(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("parsed again")

    single = RenderedJson.of(gen("v3", completion_tokens=4))
    openai = RenderedJson.of({"id": "c", "choices": [], "metadata": {"weight_version": "v3"}})
    monkeypatch.setattr(stamp_module.json, "loads", refuse)
    assert stamp_generate(single, None, single=True).version == "v3"
    assert stamp_openai(openai, None).version == "v3"
    # The stamp took the objects: only the bytes stay held while the answer goes out, and a
    # second reader parses them.
    assert single.obj is None and openai.obj is None
    monkeypatch.undo()
    assert stamp_generate(single, None, single=True).version == "v3"
    assert stamp_openai(openai, None).version == "v3"


def test_a_large_answer_is_stamped_without_a_full_parse():
    # With logprobs, a rollout answer is hundreds of KB: the version is found by search.
    answer = gen("v3")
    answer["meta_info"]["output_token_logprobs"] = [[-0.1, i, None] for i in range(20_000)]
    body = json.dumps(answer).encode()
    assert _reported_single(body) == ["v3"]
    stamp = stamp_generate(body, "v2", True)
    assert (stamp.version, stamp.mixed, stamp.body) == ("v3", True, body)


@pytest.mark.parametrize(
    "body, version",
    [
        # Duplicate keys (json.loads keeps the last one; json.dumps never writes them).
        (b'{"meta_info":{"weight_version":"v1","weight_version":"v2"}}', "v2"),
        (b'{"meta_info":{"weight_version":"v1"},"meta_info":{"id":"x"}}', "v9"),
        (b'{ "meta_info" : { "id" : "a", "weight_version" : 7 } }', "7"),
        (b'{"meta_info":{"id":"x"},"weight_version":"v1"}', "v9"),  # not meta_info's
        (b'{"meta_info":{"w":{"weight_version":"v1"}}}', "v9"),
        (b'{"meta_info":{"weight_version":"v\\u0031"}}', "v1"),  # an escape: parsed
    ],
)
def test_the_fast_stamp_on_raw_bodies(body, version):
    assert stamp_generate(body, "v9", True, fast_min=0).version == version
    assert stamp_generate(body, "v9", True, fast_min=len(body) + 1).version == version


@pytest.mark.parametrize(
    "answer, tokens",
    [
        ({"text": "a", "meta_info": {"completion_tokens": 12}}, 12),
        ([{"meta_info": {"completion_tokens": 3}}, {"meta_info": {"completion_tokens": 4}}], 7),
        ({"text": "a", "meta_info": {"weight_version": "v1"}}, None),
        ({"meta_info": {"completion_tokens": -1}}, None),
        ({"meta_info": {"x": {"completion_tokens": 5}}}, None),
    ],
)
def test_the_stamp_reads_the_generated_tokens(answer, tokens):
    body = json.dumps(answer).encode()
    single = not isinstance(answer, list)
    assert stamp_generate(body, None, single).tokens == tokens
    if single:
        assert stamp_generate(body, None, single, fast_min=0).tokens == tokens


def test_a_large_answer_reports_its_tokens_without_a_full_parse():
    answer = gen("v3")
    answer["meta_info"]["completion_tokens"] = 20_000
    answer["meta_info"]["output_token_logprobs"] = [[-0.1, i, None] for i in range(20_000)]
    assert _tokens_single(json.dumps(answer).encode()) == 20_000


def test_openai_answers_report_usage():
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}}).encode()
    assert stamp_openai(body, None).tokens == 9
    assert stamp_openai(b'{"choices": []}', None).tokens is None


@pytest.mark.parametrize(
    "chunks, tokens",
    [
        (
            [
                b'data: {"meta_info": {"completion_tokens": 1}}\n\n',
                b'data: {"meta_info": {"completion_tokens": 2}}\n\n',
                b"data: [DONE]\n\n",
            ],
            2,
        ),
        (
            [
                b'data: {"a": 1, "meta_info": {"completion_tokens": 1}}\n\ndata: {"meta_info": {"completion_tokens": 5}}\n\n'
            ],
            5,
        ),
        ([b'data: {"usage": {"prompt_tokens": 2, "completion_tokens": 4, "total_tokens": 6}}\n\n'], 4),
        ([b'data: {"choices": []}\n\n', b"data: [DONE]\n\n"], None),
        ([b'data: {"text": "\\"completion_tokens\\": 9"}\n\n'], None),
    ],
)
def test_a_stream_reports_its_last_token_count(chunks, tokens):
    tail = TokenTail()
    for chunk in chunks:
        tail.see(chunk)
    assert tail.tokens == tokens

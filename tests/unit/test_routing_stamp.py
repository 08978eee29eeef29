"""Response stamping (pure; issue 7 step 4): which version an answer names, the mixed flag,
system_fingerprint on OpenAI answers, and the single-prompt rule."""

from __future__ import annotations

import json

import pytest

from smgrl.dataplane.stamp import FingerprintEvents, stamp_generate, stamp_openai, version_tag


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
    # Issue 10: an engine framing its SSE with CRLF (legal) was held until a `\n\n` that never
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

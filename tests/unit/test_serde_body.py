"""smgrl/http/bodies/serde_body.py: the json fast path against the serde-compatible reader.

``parse_struct`` answers from ``fast_parse`` (json + schema checks) and runs the byte-by-byte
serde reader (``serde_struct``) only when the fast path declines. The property: on generated
bodies, the fast path never accepts what serde refuses, gives serde's value when it accepts, and
declines a body serde accepts only for the rare reasons it names (invalid UTF-8 in an ignored
string, a repeated key).
"""

from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from smgrl.http.bodies import dataplane_body
from smgrl.http.bodies.serde_body import SerdeError, fast_parse, parse_struct, serde_struct
from smgrl.http.bodies.workers_body import (
    WORKER_SPEC,
    WORKER_SPEC_ALIASES,
    WORKER_SPEC_FIELDS,
    WORKER_UPDATE,
    WORKER_UPDATE_FIELDS,
)
from smgrl.http.routes.rl_writes import SCHEMAS

# (name, fields, required, field count, aliases, options): the production schemas (the data
# plane's with their flatten map and untagged enums), plus one with every kind they do not use.
DATAPLANE = {"flatten": True, "untagged_ok": dataplane_body.untagged_ok}
SCHEMA_TABLE = [
    ("WorkerSpec", WORKER_SPEC, ("url",), WORKER_SPEC_FIELDS, WORKER_SPEC_ALIASES, {}),
    ("WorkerUpdateRequest", WORKER_UPDATE, (), WORKER_UPDATE_FIELDS, {}, {}),
    *[(name, fields, required, None, {}, {}) for name, fields, required in SCHEMAS.values()],
    *[
        (name, fields, required, None, {}, DATAPLANE)
        for name, fields, required in dataplane_body.SCHEMAS.values()
    ],
    (
        "Every",
        {
            "s": "str",
            "n16": "u16",
            "nz": "usize",
            "o": "opt_usize",
            "q": "seq",
            "qs": "seq:str",
            "m": "opt_map_str",
        },
        ("s",),
        9,
        {"alias": "s"},
        {},
    ),
]
SCHEMA_BY_NAME = {schema[0]: schema for schema in SCHEMA_TABLE}
CHAT_BODY = (
    b'{"model": "m", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", '
    b'"content": [{"type": "text", "text": "hi \\u00e9"}]}], "temperature": 0.7, "top_p": 1, '
    b'"max_tokens": 64, "stream": false, "seed": 7, "logit_bias": {"5": -1.5}, "stop": "\\n", '
    b'"stream_options": {"include_usage": true}, "extra_body": {"return_logprob": true}}'
)
KEYS = sorted(
    {k for _, fields, _, _, aliases, _ in SCHEMA_TABLE for k in (*fields, *aliases)} | {"other", "id"}
)


def serde(data: bytes, schema) -> tuple:
    name, fields, required, count, aliases, options = schema
    try:
        return ("ok", serde_struct(data, name, fields, required, count, aliases, **options))
    except SerdeError as exc:
        return ("error", exc.message, exc.syntax)


def _keys_anywhere(value, out: list) -> list:
    if isinstance(value, dict):
        out += value
        for item in value.values():
            _keys_anywhere(item, out)
    elif isinstance(value, list):
        for item in value:
            _keys_anywhere(item, out)
    return out


def _declines_rightly(data: bytes, schema) -> bool:
    """The bodies serde accepts that the fast path may leave to it."""
    _, fields, _, _, aliases, _ = schema
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    repeated = []

    def pairs(items):
        repeated.append(len({k for k, _ in items}) != len(items))
        return dict(items)

    doc = json.loads(text, object_pairs_hook=pairs)
    try:
        json.dumps(doc, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True  # a lone surrogate escape (serde refuses it only in the strings it checks)
    if any(repeated):
        return True
    # A known field's name used as a key at two places (a nested namesake included: the plain
    # reading cannot tell which level a name is at).
    keys = _keys_anywhere(doc, [])
    return any(keys.count(key) > 1 for key in (*fields, *aliases) if key in doc)


def check(data: bytes, schema) -> None:
    name, fields, required, count, aliases, options = schema
    expected = serde(data, schema)
    parsed = fast_parse(data, fields, required, aliases, **options)
    fast = None if parsed is None else parsed[1]
    if expected[0] == "error":
        assert fast is None, f"fast path accepts what serde refuses ({expected[1]}): {fast}"
    elif fast is None:
        assert _declines_rightly(data, schema), (
            f"fast path declines a plain body serde accepts: {expected[1]}"
        )
    else:
        assert fast == expected[1]
        assert repr(fast) == repr(expected[1])  # -0.0 vs 0, 1 vs 1.0: equal, but not the same value
    # The public function is the serde reader's answer either way.
    try:
        assert ("ok", parse_struct(data, name, fields, required, count, aliases, **options)) == expected
    except SerdeError as exc:
        assert ("error", exc.message, exc.syntax) == expected


# -- generated bodies -----------------------------------------------------------------------------

NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["-0", "1e400", "-1e999", "1" * 30, "1.0", "0.5e-3", "1E2", "18446744073709551616"]),
)
TEXT = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["http://a:1", "regular", "prefill", "sglang", "runtime", "active", "paused", "v1"]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(TEXT, st.sampled_from(["id", "x"])), inner, max_size=4),
    ),
    max_leaves=12,
)


def dumps(value, draw) -> str:
    """JSON text with the raw-number spellings above kept raw (json.dumps would quote them)."""
    raw_numbers = ("-0", "1e400", "-1e999", "1" * 30, "1.0", "0.5e-3", "1E2")
    if isinstance(value, str) and value in raw_numbers and draw(st.booleans()):
        return value
    if isinstance(value, list):
        return "[" + draw(st.sampled_from([",", ", ", " ,\n"])).join(dumps(v, draw) for v in value) + "]"
    if isinstance(value, dict):
        sep = draw(st.sampled_from([",", ", ", "\n,\t"]))
        colon = draw(st.sampled_from([":", ": ", " :"]))
        items = [
            json.dumps(k, ensure_ascii=draw(st.booleans())) + colon + dumps(v, draw) for k, v in value.items()
        ]
        return "{" + sep.join(items) + "}"
    return json.dumps(value, ensure_ascii=draw(st.booleans()))


def typed_value(kind: str):
    """Values of the field's own type (mostly within range), so that many bodies are valid."""
    if kind.startswith("opt_"):
        return st.one_of(st.none(), typed_value(kind[4:]))
    limits = {"u16": 2**16, "u32": 2**32, "usize": 2**64, "u64": 2**64}
    if kind in limits:
        return st.one_of(
            st.integers(0, limits[kind] - 1), st.integers(0, 9), st.sampled_from([-1, limits[kind]])
        )
    signed = {"i32": 2**31, "i64": 2**63}
    if kind in signed:
        bound = signed[kind]
        return st.one_of(st.integers(-bound, bound - 1), st.sampled_from([-bound - 1, bound]))
    if kind in ("bool", "bool_nf"):
        return st.one_of(st.booleans(), st.sampled_from([None, 0, "true"]))
    if kind == "map":
        return st.one_of(st.dictionaries(TEXT, VALUES, max_size=3), st.sampled_from([[], "x"]))
    if kind == "map_f32":
        return st.dictionaries(
            TEXT, st.one_of(st.floats(allow_nan=False, allow_infinity=False), TEXT), max_size=3
        )
    if kind.startswith("untagged:"):
        return st.one_of(
            TEXT,
            st.lists(TEXT, max_size=3),
            st.lists(st.integers(0, 100), max_size=3),
            st.lists(st.lists(st.integers(0, 9), max_size=2), max_size=2),
            VALUES,
        )
    if kind == "messages":
        content = st.one_of(TEXT, st.lists(VALUES, max_size=2), st.none(), st.integers())
        message = st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "assistant", "system", "tool", "robot"])},
            optional={"content": content, "name": TEXT},
        )
        return st.lists(st.one_of(message, message, message, VALUES), max_size=3)
    if kind == "f32":
        return st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False))
    if kind == "str":
        return TEXT
    if kind == "map_str":
        return st.dictionaries(TEXT, TEXT, max_size=3)
    if kind.startswith("enum:"):
        return st.sampled_from([*kind[5:].split(","), "nope"])
    if kind == "seq:str":
        return st.lists(TEXT, max_size=3)
    if kind == "seq:struct:ModelCard":
        return st.lists(st.fixed_dictionaries({"id": TEXT}, optional={"other": VALUES}), max_size=3)
    if kind.startswith("struct:"):
        return st.dictionaries(TEXT, VALUES, max_size=3)
    return st.lists(VALUES, max_size=3)


@st.composite
def bodies(draw, schema) -> bytes:
    _, fields, required, _, aliases, _ = schema
    keys = st.sampled_from(KEYS)
    known = st.sampled_from(sorted(fields)).flatmap(lambda k: st.tuples(st.just(k), typed_value(fields[k])))
    chosen = draw(st.lists(known, max_size=5, unique_by=lambda item: item[0]))
    if draw(st.integers(0, 4)):
        present = {field for field, _ in chosen}
        chosen += [(field, draw(typed_value(fields[field]))) for field in required if field not in present]
    chosen += draw(st.lists(st.tuples(keys, VALUES), max_size=2))  # unknown (or repeated) fields
    chosen = draw(st.permutations(chosen))
    if aliases and draw(st.integers(0, 3)) == 0:
        alias = draw(st.sampled_from(sorted(aliases)))
        chosen.append((alias, draw(typed_value(fields[aliases[alias]]))))
    text = "{" + ",".join(json.dumps(k) + ":" + dumps(v, draw) for k, v in chosen) + "}"
    if draw(st.integers(0, 3)) == 0:
        text = (
            draw(st.sampled_from(["", " ", "\n\t"])) + text + draw(st.sampled_from(["", " ", "x", ",", "}"]))
        )
    data = text.encode()
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):  # some bytes spoiled, inserted or dropped
        at = draw(st.integers(0, len(data)))
        spoiler = draw(
            st.sampled_from([b'"', b"\\", b"{", b"[", b",", b":", b"0", b"-", b"\xff", b"\x01", b"\\ud800"])
        )
        kind = draw(st.sampled_from(["insert", "replace", "delete"]))
        if kind == "insert":
            data = data[:at] + spoiler + data[at:]
        elif kind == "replace":
            data = data[:at] + spoiler + data[at + 1 :]
        else:
            data = data[:at] + data[at + 1 :]
    return data


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SCHEMA_TABLE).flatmap(lambda schema: st.tuples(bodies(schema), st.just(schema))))
@example((b'{"url": "http://a:1", "labels": {"a": "\\ud800"}}', SCHEMA_TABLE[0]))
@example((b'{"url": "http://a:1", "other": "\\ud800x\\udc00"}', SCHEMA_TABLE[0]))
@example((b'{"url": "http://a:1", "other": ["\xff"]}', SCHEMA_TABLE[0]))
@example((b'{"url": "http://a:1", "runtime": "sglang", "runtime_type": "vllm"}', SCHEMA_TABLE[0]))
@example((b'{"url":"runtime","runtime":"unspecified"}', SCHEMA_TABLE[0]))
@example((b'{"url": "u", "labels": {"url": "x"}, "url" : "v"}', SCHEMA_TABLE[0]))
@example((b'{"url": "http://a:1", "priority": -0}', SCHEMA_TABLE[0]))
@example((b'{"url": "http://a:1", "cost": NaN}', SCHEMA_TABLE[0]))
@example((b'\xef\xbb\xbf{"url": "http://a:1"}', SCHEMA_TABLE[0]))
@example(('{"url": "http://a:1"}'.encode("utf-16"), SCHEMA_TABLE[0]))
@example((b'{"s": "x", "q": ["a\\u0041", -0, 1e2, 18446744073709551616]}', SCHEMA_TABLE[-1]))
# Rollout bodies as clients send them (the data plane's hot path).
@example((CHAT_BODY, SCHEMA_BY_NAME["ChatCompletionRequest"]))
@example((CHAT_BODY.replace(b'"user"', b'"robot"'), SCHEMA_BY_NAME["ChatCompletionRequest"]))
@example((CHAT_BODY.replace(b'"stream": false', b'"stream": null'), SCHEMA_BY_NAME["ChatCompletionRequest"]))
@example(
    (CHAT_BODY.replace(b'"seed": 7', b'"seed": 9223372036854775808'), SCHEMA_BY_NAME["ChatCompletionRequest"])
)
@example((b'{"model": "m", "prompt": [[1, 2], [3]], "stop": ["x"]}', SCHEMA_BY_NAME["CompletionRequest"]))
@example((b'{"model": "m", "prompt": [[1, 2], ["x"]]}', SCHEMA_BY_NAME["CompletionRequest"]))
def test_fast_path_agrees_with_the_serde_reader(case):
    check(*case)


@pytest.mark.parametrize("depth", [125, 126, 127, 128, 200])
def test_recursion_limit_is_serde_s(depth):
    schema = SCHEMA_TABLE[-1]
    data = b'{"s": "x", "q": ' + b"[" * depth + b"]" * depth + b"}"
    check(data, schema)


def test_a_5000_digit_number_is_serde_s_error_not_a_crash():
    # Regression: int() refuses more than 4300 digits with ValueError, which escaped as a 500.
    data = b'{"url": "http://a:1", "other": ' + b"1" * 5000 + b"}"
    with pytest.raises(SerdeError, match="^other: number out of range at line 1 column 5031$"):
        parse_struct(data, *SCHEMA_TABLE[0][:2], SCHEMA_TABLE[0][2])


def test_escapes_in_an_ignored_value_are_decoded():
    # Regression: the serde reader dropped \\u escapes from values it only syntax-checks, and a
    # `seq` field hands such values back.
    assert serde_struct(b'{"s": "x", "q": ["a\\u0041"]}', "Every", SCHEMA_TABLE[-1][1]) == {
        "s": "x",
        "q": ["aA"],
    }


# -- the conformance bodies -----------------------------------------------------------------------

CASES = pathlib.Path(__file__).parents[1] / "conformance" / "cases"
CASE_BODIES = sorted(
    {
        json.loads(line)["body"]
        for path in CASES.glob("*.jsonl")
        for line in path.read_text().splitlines()
        if line.strip() and isinstance(json.loads(line).get("body"), str)
    }
)


@pytest.mark.parametrize("schema", SCHEMA_TABLE, ids=[s[0] for s in SCHEMA_TABLE])
def test_every_conformance_body_gets_the_serde_reader_s_answer(schema):
    assert len(CASE_BODIES) > 50
    for body in CASE_BODIES:
        check(body.encode(), schema)

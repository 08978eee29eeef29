"""Selector grammar, errors and matching (docs/rl-control-plane.md, "Selectors"; SMG's selector.rs)."""

import pytest

from smgrl.core.selector import (
    Selector,
    SelectorError,
    Term,
    parse_selector,
    quote_value,
    rust_trim,
)

VIEW = {"engine": "sglang", "tp_size": "2", "role": "policy"}

OPERATOR = "expected operator (`=`, `!=`, `in`, `notin`)"


# -- crate: parses_and_matches_each_operator (the 18 reference cases) ---------------------------

MATCH_CASES = [
    ("engine=sglang", True),
    ("engine=vllm", False),
    ("engine!=vllm", True),
    ("engine!=sglang", False),
    ("tp_size in (1,2,4)", True),
    ("tp_size in (8)", False),
    ("role notin (reward, judge)", True),
    ("role notin (policy)", False),
    ("engine=sglang, tp_size=2", True),
    ("engine=sglang,tp_size=4", False),
    ("  engine = sglang ,  role = policy  ", True),
    ("engine in(sglang,vllm)", True),
    ("missing=x", False),
    ("missing!=x", True),
    ("missing in (x)", False),
    ("missing notin (x)", True),
    ('role="policy"', True),
    ('role="pol\\"icy"', False),
]


@pytest.mark.parametrize(("expr", "expected"), MATCH_CASES)
def test_parses_and_matches_each_operator(expr, expected):
    assert parse_selector(expr).matches(VIEW) is expected


def test_quoted_values_allow_commas_and_escapes():
    view = {"model_path": "/models/a,b", "q": 'say "hi"'}
    assert parse_selector('model_path="/models/a,b"').matches(view)
    assert parse_selector('q="say \\"hi\\""').matches(view)


def test_keeps_source_text():
    assert parse_selector("engine=sglang").source == "engine=sglang"


def test_source_is_the_trimmed_text():
    assert parse_selector("  engine=sglang \t\n").source == "engine=sglang"


def test_parsed_terms():
    sel = parse_selector('a=1, b!=2, c in (x, "y z"), d notin (w)')
    assert sel == Selector(
        source='a=1, b!=2, c in (x, "y z"), d notin (w)',
        terms=(
            Term("a", "=", ("1",)),
            Term("b", "!=", ("2",)),
            Term("c", "in", ("x", "y z")),
            Term("d", "notin", ("w",)),
        ),
    )


# -- errors: every row of SMG's error table plus the crate's offsets ----------------------------

ERROR_CASES = [
    ("", 0, "expected key"),
    ("=x", 0, "expected key"),
    (",engine=sglang", 0, "expected key"),
    ("engine", 6, OPERATOR),
    ("en gine=x", 3, OPERATOR),
    ("engine!x", 6, OPERATOR),
    ("engine==x", 7, "expected value after `=`"),
    ("engine=", 7, "expected value"),
    ("engine in x", 10, "expected `(`"),
    ("engine in (a,", 13, "expected value"),
    ("engine in ()", 11, "expected value"),
    ("engine in(a b)", 12, "expected `,` or `)`"),
    ("engine=a b", 9, "expected `,` or end of selector"),
    ("engine=sglang)", 13, "expected `,` or end of selector"),
    ("engine=a(b", 8, "expected `,` or end of selector"),
    ('engine="unterminated', 20, "unterminated quoted value"),
    ("engine=a,", 9, "expected key after `,`"),
    ("engine=sglang,,tp_size=2", 14, "expected key"),
    ('k="a\\n"', 6, "invalid escape in quoted value"),
]


@pytest.mark.parametrize(("expr", "offset", "reason"), ERROR_CASES)
def test_reports_parse_errors_with_offsets(expr, offset, reason):
    with pytest.raises(SelectorError) as info:
        parse_selector(expr)
    assert (info.value.offset, info.value.reason) == (offset, reason)
    assert str(info.value) == f"invalid selector at byte {offset}: {reason}"
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("expr", "offset", "reason"),
    [
        ("  engine", 6, OPERATOR),
        ("\t engine=", 7, "expected value"),
        ("engine inx (a)", 7, OPERATOR),
        ("engine notinx (a)", 7, OPERATOR),
        ("enginein(a)", 8, OPERATOR),
        ("engine IN (a)", 7, OPERATOR),
        ("engine<3", 6, OPERATOR),
        ("engine in (a,)", 13, "expected value"),
        ("engine in (a", 12, "expected `,` or `)`"),
        ("engine in", 7, OPERATOR),
        ("engine in ", 7, OPERATOR),  # trimmed to "engine in": nothing follows the word
        ("engine in\t(a b)", 13, "expected `,` or `)`"),
        ("engine=a,,", 9, "expected key"),
        ("engine=a, ", 9, "expected key after `,`"),  # trimmed to "engine=a,"
        ("engine=a , ,", 11, "expected key"),
        ("!engine=x", 0, "expected key"),
        ("engine=a,=b", 9, "expected key"),
        ('k="a', 4, "unterminated quoted value"),
        ('k="a\\', 5, "invalid escape in quoted value"),  # a trailing backslash escapes nothing
        ('k="\\x"', 5, "invalid escape in quoted value"),
        ('k=a"b', 3, "expected `,` or end of selector"),
        ("k=(a)", 2, "expected value"),
        ('k="a"b', 5, "expected `,` or end of selector"),
        ("énginé=x", 0, "expected key"),  # keys are ASCII only
        ("k=é x", 5, "expected `,` or end of selector"),  # é is two bytes
        ("k=\u3000x y", 7, "expected `,` or end of selector"),  # U+3000 is whitespace, 3 bytes
        ("k=v,\u00e9=x", 4, "expected key"),
        ("%ZZ", 0, "expected key"),  # as SMG 1.13.0: `%ZZ` stays literal and fails at 0
    ],
)
def test_more_error_offsets(expr, offset, reason):
    with pytest.raises(SelectorError) as info:
        parse_selector(expr)
    assert (info.value.offset, info.value.reason) == (offset, reason)


# -- bare values, whitespace, matching details ---------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "labels"),
    [
        ("url=http://rollout:30000", {"url": "http://rollout:30000"}),
        ("url=http://host:30000@0", {"url": "http://host:30000@0"}),
        ("model=Qwen/Qwen3-8B, tp_size=1", {"model": "Qwen/Qwen3-8B", "tp_size": "1"}),
        ("engine=a=b", {"engine": "a=b"}),
        ("x=!#$%&'*+-./:;<=>?@[]^_`{|}~", {"x": "!#$%&'*+-./:;<=>?@[]^_`{|}~"}),
        ("k='quoted'", {"k": "'quoted'"}),  # single quotes are literal characters
        ("k=é", {"k": "é"}),  # non-ASCII bare values: the grammar only excludes ws , ( ) "
        ('k=""', {"k": ""}),  # quoted values may be empty
        ('k="a (b), c"', {"k": "a (b), c"}),
        ('k="back\\\\slash"', {"k": "back\\slash"}),
        ("k\t=\nv", {"k": "v"}),  # tabs and newlines are whitespace
        ("k\u00a0=\u2003v", {"k": "v"}),  # so are NBSP and EM SPACE (Unicode White_Space)
        ("k=v\x1c", {"k": "v\x1c"}),  # U+001C is whitespace to Python, not to Rust: part of the value
        ("a.b/c-d_e=1", {"a.b/c-d_e": "1"}),
        ("rl.pause_modes=abort", {"rl.pause_modes": "abort"}),
        ("engine=sglang,engine=sglang", {"engine": "sglang"}),
        ("weight_version!=42", {"weight_version": "41"}),
        ("weight_version=default", {"weight_version": "default"}),
    ],
)
def test_values_that_parse_and_match(expr, labels):
    assert parse_selector(expr).matches(labels)


def test_duplicate_keys_are_anded():
    assert not parse_selector("engine=sglang,engine=vllm").matches({"engine": "sglang"})


def test_values_are_strings_not_numbers():
    assert not parse_selector("tp_size=2").matches({"tp_size": "02"})
    assert not parse_selector("tp_size in (2)").matches({"tp_size": "2.0"})


def test_matching_is_case_sensitive():
    assert not parse_selector("engine=SGLang").matches({"engine": "sglang"})
    assert not parse_selector("Engine=sglang").matches({"engine": "sglang"})


def test_negations_match_missing_keys_and_positives_do_not():
    sel = {e: parse_selector(e) for e in ("k=v", "k!=v", "k in (v)", "k notin (v)")}
    assert [s.matches({}) for s in sel.values()] == [False, True, False, True]


def test_documented_cheat_sheet_parses():
    for expr in (
        "engine=sglang",
        "engine in (sglang,vllm)",
        "role!=reward",
        "url=http://rollout:30000",
        "model=Qwen/Qwen3-8B, tp_size=1",
        "id in (0192-a,0192-b)",
        "worker_type=regular",
        "control=active",
        "weight_version!=42",
    ):
        parse_selector(expr)


@pytest.mark.parametrize(
    ("text", "trimmed"),
    [
        ("  x  ", "x"),
        ("\t\n\x0b\x0c\rx\r\n", "x"),
        ("\x85\xa0\u1680x\u2000\u200a\u2028\u2029\u202f\u205f\u3000", "x"),
        ("\x1cx\x1f", "\x1cx\x1f"),  # whitespace to Python, not to Rust
        ("\u200bx", "\u200bx"),  # ZERO WIDTH SPACE is not White_Space
    ],
)
def test_rust_trim(text, trimmed):
    assert rust_trim(text) == trimmed


def test_python_only_whitespace_is_not_trimmed_before_parsing():
    with pytest.raises(SelectorError) as info:
        parse_selector("\x1fengine=x")
    assert (info.value.offset, info.value.reason) == (0, "expected key")


@pytest.mark.parametrize("value", ["", "plain", 'say "hi"', "a\\b", "(x), y", "é\u3000"])
def test_quote_value_round_trips(value):
    assert parse_selector(f"k={quote_value(value)}").matches({"k": value})


def test_term_rejects_unknown_operators():
    with pytest.raises(ValueError):
        Term("k", "==", ("v",))

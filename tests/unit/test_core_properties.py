"""Hypothesis properties of the pure core: parsers fail only in their own way, and round-trip."""

from __future__ import annotations

from hypothesis import assume, example, given
from hypothesis import strategies as st

from smgrl.core.capability import capabilities_for
from smgrl.core.control_url import resolve_control_url
from smgrl.core.path import EnginePathError, metric_op, passthrough_query, validate_engine_path
from smgrl.core.selector import RUST_WHITESPACE, SelectorError, parse_selector, quote_value, rust_trim
from smgrl.core.version import MalformedVersion, compare_versions, observed_version, validate_version

# Text biased towards the grammar's own alphabet, plus whitespace Python and Rust disagree on.
GRAMMAR = '=!,()" \\inotabck_./-\t\n\x1c\x1f\u3000\u00a0é'
selector_text = st.one_of(
    st.text(),
    st.text(alphabet=GRAMMAR, max_size=40),
    st.lists(
        st.sampled_from(["k", "=", "!=", " in ", " notin ", "(", ")", ",", '"', "\\", " ", "v", "é"])
    ).map("".join),
)
KEY = st.text(alphabet="abcXYZ019_./-", min_size=1, max_size=12)


@given(selector_text)
@example("")
@example('k="a\\')
@example("\x1c")
def test_the_parser_raises_only_selector_errors_with_offsets_in_bounds(text):
    try:
        sel = parse_selector(text)
    except SelectorError as e:
        assert 0 <= e.offset <= len(rust_trim(text).encode("utf-8", "surrogatepass"))
        assert str(e) == f"invalid selector at byte {e.offset}: {e.reason}"
    else:
        assert sel.source == rust_trim(text)
        assert sel.terms


@given(KEY, st.text())
def test_any_string_quoted_round_trips(key, value):
    assert parse_selector(f"{key}={quote_value(value)}").matches({key: value})
    assert not parse_selector(f"{key}!={quote_value(value)}").matches({key: value})
    assert parse_selector(f" {key} in ( {quote_value(value)} , x ) ").matches({key: value})


@given(KEY, st.text(), st.text())
def test_quoted_equality_is_exact(key, value, other):
    assert parse_selector(f"{key}={quote_value(value)}").matches({key: other}) == (value == other)


@given(KEY, st.text(alphabet=st.characters(blacklist_characters=',()"'), min_size=1))
def test_bare_values_round_trip_when_they_have_no_special_characters(key, value):
    assume(not any(c in RUST_WHITESPACE for c in value))
    assert parse_selector(f"{key}!={value}").matches({key: value + "x"})
    # `k==v` is an error ("expected value after `=`"), so `=` cannot start a value after `=`.
    assume(not value.startswith("="))
    assert parse_selector(f"{key}={value}").matches({key: value})


@given(st.dictionaries(KEY, st.text(max_size=5), max_size=4), KEY, st.lists(st.text(max_size=5), min_size=1))
def test_in_and_notin_are_complements(labels, key, values):
    quoted = ",".join(quote_value(v) for v in values)
    pos = parse_selector(f"{key} in ({quoted})").matches(labels)
    neg = parse_selector(f"{key} notin ({quoted})").matches(labels)
    assert pos != neg
    assert pos == (key in labels and labels[key] in values)


path_text = st.one_of(
    st.text(),
    st.lists(st.sampled_from(["a", "B9", "/", ".", "..", "_", "-", "?", "#", " ", "é", "%2F", ""])).map(
        "".join
    ),
)


@given(path_text)
def test_validate_engine_path_returns_or_raises_engine_path_error(raw):
    try:
        path = validate_engine_path(raw)
    except EnginePathError as e:
        assert str(e) == f"invalid engine path: {e.reason}"
    else:
        assert path == raw.removeprefix("/")
        assert 1 <= len(path.split("/")) <= 4
        assert validate_engine_path(path) == path  # idempotent once validated
        assert metric_op(path) in (path, "other")


query_piece = st.one_of(
    st.just("selector=engine%3Dsglang"),
    st.just("selector"),
    st.just(""),
    st.text(alphabet="abcselector=%&+", max_size=12).filter(lambda p: "&" not in p),
)


@given(st.lists(query_piece, max_size=8))
def test_passthrough_query_drops_selector_pieces_and_keeps_the_rest_in_order(pieces):
    out = passthrough_query("&".join(pieces))
    kept = [p for p in pieces if p and p.split("=", 1)[0] != "selector"]
    if not kept:
        assert out is None
    else:
        assert out is not None and out.split("&") == kept
        assert all(p.split("=", 1)[0] != "selector" for p in out.split("&"))


@given(st.text(), st.text())
def test_resolve_control_url_never_raises(advertised, worker):
    out = resolve_control_url(advertised, worker)
    assert isinstance(out, str)
    assert not out.endswith("/") or not rust_trim(advertised).rstrip("/")


@given(
    st.sampled_from(["sglang", "vllm", "tokenspeed", "trtllm", "x"]), st.dictionaries(st.text(), st.text())
)
def test_capabilities_never_raise_and_lists_have_no_blank_items(engine, labels):
    caps = capabilities_for(engine, labels).to_json()
    assert all(item and item == rust_trim(item) for item in caps["pause_modes"] + caps["update_from"])


@given(st.text())
def test_validate_version_returns_printable_ascii_or_raises(raw):
    try:
        v = validate_version(raw)
    except MalformedVersion as e:
        assert e.reason in ("empty", "too_long", "not_printable_ascii")
    else:
        assert 1 <= len(v.encode()) <= 128 and all(0x21 <= b <= 0x7E for b in v.encode())


@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(), st.lists(st.integers())))
def test_observed_version_is_none_or_valid(value):
    v = observed_version(value)
    assert v is None or validate_version(v) == v


@given(st.integers(min_value=0, max_value=2**64 - 1), st.integers(min_value=0, max_value=2**64 - 1))
def test_numeric_versions_order_by_value_with_leading_zeros(a, b):
    assert compare_versions(f"00{a}", str(b)) == (a > b) - (a < b)


@given(st.text(alphabet="abc-", min_size=1), st.text(alphabet="abc-", min_size=1))
def test_text_versions_order_lexically_and_antisymmetrically(a, b):
    assert compare_versions(a, b) == (a > b) - (a < b) == -compare_versions(b, a)

"""The escaping shared by log lines and `smgrl journal` output (pure; hypothesis)."""

import json

from hypothesis import given
from hypothesis import strategies as st

from smgrl.core.printable import UNSAFE, escape, escape_for_json, escape_lines

ANY = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=40)


def test_every_unsafe_character_is_unprintable():
    # The fast path (str.isprintable) may only skip text the regex would leave alone.
    unsafe = [chr(c) for c in range(0x110000) if UNSAFE.match(chr(c))]
    assert len(unsafe) > 2000 and not any(ch.isprintable() for ch in unsafe)


@given(ANY)
def test_escape_leaves_nothing_unsafe_on_one_line(text):
    out = escape(text)
    assert not UNSAFE.search(out) and "\n" not in out
    assert escape(out) == out  # already safe text is left alone


@given(ANY)
def test_escape_lines_keeps_newlines_only(text):
    out = escape_lines(text)
    assert out.count("\n") == text.count("\n")
    assert not UNSAFE.search(out.replace("\n", ""))


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | ANY, lambda c: st.lists(c) | st.dictionaries(ANY, c)
    )
)
def test_escape_for_json_keeps_the_same_json(value):
    for indent in (None, 2):
        raw = json.dumps(value, ensure_ascii=False, indent=indent)
        out = escape_for_json(raw)
        assert json.loads(out) == json.loads(raw)
        assert not UNSAFE.search(out.replace("\n", ""))

"""The one integer parser for client-written text (``smgrl/core/numbers.py``)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from smgrl.core.numbers import parse_int, parse_uint

REFUSED = [
    "",
    " 1",
    "1 ",
    "+1",
    "1_0",
    "0x10",
    "1e3",
    "1.0",
    "²",
    "١",
    "٣",
    "１",
    "-",
    "--1",
    "9" * 21,
    "9" * 5000,
]


@pytest.mark.parametrize("text", REFUSED)
def test_only_plain_ascii_digits_are_integers(text):
    assert parse_uint(text) is None
    assert parse_int(text) is None
    assert parse_uint(text.encode("utf-8")) is None


@pytest.mark.parametrize(
    ("text", "uint", "sint"), [("0", 0, 0), ("007", 7, 7), ("10", 10, 10), ("-3", None, -3)]
)
def test_accepted(text, uint, sint):
    assert (parse_uint(text), parse_int(text)) == (uint, sint)


@given(st.integers(min_value=-(10**19), max_value=10**19))
def test_round_trips_every_decimal_integer_in_range(n):
    assert parse_int(str(n)) == n
    assert parse_uint(str(n)) == (n if n >= 0 else None)


@given(st.binary(max_size=24) | st.text("0123456789", max_size=24).map(str.encode))
def test_bytes_read_as_their_latin1_text(raw):
    # parse_uint's fast path for bytes answers what the text path answers.
    assert parse_uint(raw) == parse_uint(raw.decode("latin-1"))


def test_header_lengths_go_through_the_one_parser():
    # A Content-Length past int()'s 4,300-digit limit raised ValueError in the /v1/rl body check
    # (bytes.isdigit() then int()); it is simply "too large" now, as parse_uint reads it.
    from smgrl.http.bodies.control_bodies import _large

    scope = {"headers": [(b"content-length", b"9" * 5000)]}
    assert _large(scope) is True
    assert _large({"headers": [(b"content-length", b"12")]}) is False

"""fmt_ts's arithmetic rounding against the datetime it stands for."""

from __future__ import annotations

import datetime as dt

from hypothesis import example, given
from hypothesis import strategies as st

from smgrl.history.values import fmt_ts


def _by_datetime(ts: float) -> str:
    when = dt.datetime.fromtimestamp(ts, dt.UTC)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


@given(
    st.floats(min_value=-1e9, max_value=4e9, allow_nan=False)
    | st.integers(0, 4 * 10**9).map(lambda s: s + 0.9999996)
)
@example(1796110060.1259515)
@example(1796110060.9999995)  # rounds up into the next second
@example(1796110060.0000005)
@example(-0.0000004)
@example(-1.5)
def test_fmt_ts_is_what_datetime_makes(ts):
    assert fmt_ts(ts) == _by_datetime(ts)
    assert fmt_ts(ts) == _by_datetime(ts)  # again: the cached second's text


def test_fmt_ts_none_is_a_dash():
    assert fmt_ts(None) == "-"

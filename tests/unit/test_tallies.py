"""The hot-path counters and histograms (smgrl/telemetry/tallies.py) scrape as prometheus_client's
own ``Counter`` and ``Histogram`` do after the same updates, byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from smgrl.telemetry import metrics  # its import turns the *_created series off, as in the gateway
from smgrl.telemetry.tallies import Spread, Tally

OPS = st.sampled_from(["pause_generation", "continue_generation", "flush_cache", 'odd"op\\'])
RESULTS = st.sampled_from(["success", "error", "timeout"])
# Latencies from 0 up to past the last bucket, bucket bounds themselves included.
SECONDS = st.one_of(
    st.floats(min_value=0, max_value=10_000, allow_nan=False, allow_infinity=False),
    st.sampled_from(metrics.DURATION_BUCKETS),
)


def _pair():
    ref, fast = CollectorRegistry(auto_describe=False), CollectorRegistry(auto_describe=False)
    return ref, fast


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(OPS, RESULTS, SECONDS, st.integers(1, 5)), max_size=40))
def test_labelled_counter_and_histogram_scrape_as_prometheus_client(updates):
    ref, fast = _pair()
    c_ref = Counter("smg_rl_control_calls", "calls, by op and result", ["op", "result"], registry=ref)
    h_ref = Histogram(
        "smg_rl_control_call_duration_seconds",
        "latency",
        ["op"],
        buckets=metrics.DURATION_BUCKETS,
        registry=ref,
    )
    c_fast = Tally("smg_rl_control_calls", "calls, by op and result", ["op", "result"], registry=fast)
    h_fast = Spread(
        "smg_rl_control_call_duration_seconds",
        "latency",
        ["op"],
        buckets=metrics.DURATION_BUCKETS,
        registry=fast,
    )
    for op, result, seconds, n in updates:
        c_ref.labels(op, result).inc(n)
        c_fast.inc((op, result), n)
        h_ref.labels(op).observe(seconds)
        h_fast.observe((op,), seconds)
    assert generate_latest(fast) == generate_latest(ref)


@settings(max_examples=100, deadline=None)
@given(st.lists(SECONDS, max_size=30))
def test_unlabelled_ones_scrape_as_prometheus_client_from_the_start(values):
    ref, fast = _pair()
    c_ref = Counter("smgrl_journal_transactions", "transactions", registry=ref)
    h_ref = Histogram("smg_rl_fanout_duration_seconds", "wall time", buckets=(0.01, 0.5, 7), registry=ref)
    c_fast = Tally("smgrl_journal_transactions", "transactions", registry=fast)
    h_fast = Spread("smg_rl_fanout_duration_seconds", "wall time", buckets=(0.01, 0.5, 7), registry=fast)
    assert generate_latest(fast) == generate_latest(ref)  # before any update: zeros, as there
    for v in values:
        c_ref.inc()
        c_fast.inc()
        h_ref.observe(v)
        h_fast.observe((), v)
    assert generate_latest(fast) == generate_latest(ref)


def test_buckets_out_of_order_are_refused():
    with pytest.raises(ValueError, match="increasing"):
        Spread("x_seconds", "x", buckets=(1, 0.5), registry=CollectorRegistry())

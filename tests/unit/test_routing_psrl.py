"""PSRL's pure selection rules: the KV gate, PSManager's int64 ids and versions, and how
CanReserveRequest / GetReserveIndicator answers narrow and order candidates."""

from __future__ import annotations

import math

import pytest

from smgrl.core.config import PsrlConfig
from smgrl.dataplane.instance_stats import InstanceStats
from smgrl.routing.psrl import (
    by_indicator,
    kv_gate_on,
    kv_refusal,
    psm_request_id,
    psm_version,
    reservable,
    unique_versions,
)


@pytest.mark.parametrize(
    ("cfg", "stats", "reason"),
    [
        (PsrlConfig(), InstanceStats(waiting=5, kv_usage=0.99), None),  # gate off
        (PsrlConfig(reject_on_waiting=True), InstanceStats(waiting=1), "engine_waiting"),
        (PsrlConfig(reject_on_waiting=True), InstanceStats(running=9, waiting=0), None),
        (PsrlConfig(kv_capacity_threshold=0.8), InstanceStats(kv_usage=0.8), "kv_full"),
        (PsrlConfig(kv_capacity_threshold=0.8), InstanceStats(kv_usage=0.79), None),
        (PsrlConfig(reject_on_waiting=True, kv_capacity_threshold=0.5), None, None),  # never reported
    ],
)
def test_kv_gate(cfg, stats, reason):
    assert kv_refusal(stats, cfg) == reason


def test_kv_gate_is_off_by_default():
    assert not kv_gate_on(PsrlConfig()) and kv_gate_on(PsrlConfig(kv_capacity_threshold=0.9))


@pytest.mark.parametrize(("text", "value"), [("3", 3), (None, 0), ("v2", 0), ("-1", -1), (str(2**63), 0)])
def test_versions_as_int64(text, value):
    assert psm_version(text) == value


@pytest.mark.parametrize(("text", "value"), [("17", 17), ("gnt-1", None), (None, None), (str(2**64), None)])
def test_request_ids_as_int64(text, value):
    assert psm_request_id(text) == value


# The fork reads these with Rust's ``str::trim().parse::<i64>()``: a sign and ASCII digits,
# surrounding whitespace trimmed; Python's ``int()`` would also take digit separators and
# non-ASCII digits, which Rust refuses.
@pytest.mark.parametrize(
    ("text", "value"),
    [
        (" 12 ", 12),
        ("+5", 5),
        ("1_000", None),
        ("\u0661\u0662", None),
        ("", None),
        ("-", None),
        ("0x1f", None),
    ],
)
def test_int64_reads_as_the_fork_parses(text, value):
    assert psm_request_id(text) == value


def test_reservable_keeps_the_versions_answered_yes_and_treats_missing_answers_as_no():
    cands = ["a1", "b2", "c2", "d3"]
    version = lambda c: int(c[1])
    versions = unique_versions(cands, version)
    assert versions == [1, 2, 3]
    assert reservable(cands, version, versions, [False, True, True]) == ["b2", "c2", "d3"]
    assert reservable(cands, version, versions, [True]) == ["a1"]


def test_indicator_order_lowest_first_ties_by_version_direction_nan_last():
    cands = ["a1", "b2", "c3", "d2"]
    version = lambda c: int(c[1])
    ind = {1: 0.5, 2: 0.1, 3: math.nan}
    assert by_indicator(cands, version, ind, versioned=False) == ["b2", "d2", "a1", "c3"]
    same = {1: 0.0, 2: 0.0, 3: 0.0}
    assert by_indicator(cands, version, same, versioned=False) == ["c3", "b2", "d2", "a1"]  # newest first
    assert by_indicator(cands, version, same, versioned=True) == ["a1", "b2", "d2", "c3"]  # lowest first

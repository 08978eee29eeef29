"""PSRL routing metadata (docs/data-plane.md, "PSRL routing"): headers, the body fields they
override, and the stable 400 for bad values."""

from __future__ import annotations

import pytest

from smgrl.dataplane.affinity import Routed
from smgrl.routing.metadata import PLAIN, InstanceId, InvalidRoutingMetadata, RoutingMeta, parse
from smgrl.routing.version_policy import InvalidVersionPolicy


def meta(headers=None, body=None) -> RoutingMeta:
    return parse((headers or {}).get, body or {})


OK_CASES = [
    ({}, {}, RoutingMeta()),
    ({"x-request-id": " 17 ", "x-prompt-id": "g1"}, {}, RoutingMeta(request_id="17", prompt_id="g1")),
    ({}, {"request_id": 17, "prompt_id": 3}, RoutingMeta(request_id="17", prompt_id="3")),
    ({"x-prompt-id": "h"}, {"prompt_id": "b"}, RoutingMeta(prompt_id="h")),  # header wins
    ({"x-version-tag": "-1"}, {}, RoutingMeta()),
    ({"x-version-tag": " 7 "}, {}, None),  # floor 7 (checked below)
    ({}, {"version_tag": 7}, None),
    ({"x-is-validate": "YES", "x-is-sticky": "t"}, {}, RoutingMeta(is_validate=True, is_sticky=True)),
    ({"x-is-sticky": "0"}, {"is_sticky": True}, RoutingMeta()),  # header wins
    ({}, {"is_validate": True, "is_sticky": "y"}, RoutingMeta(is_validate=True, is_sticky=True)),
    ({"x-force-pin-once": "1"}, {}, RoutingMeta(force_pin_once=True)),
    (
        {"x-base-worker-id": "w1", "x-target-dp-rank": "2"},
        {"rollout_instance_id": ["b", 0]},
        RoutingMeta(hint=InstanceId("w1", 2)),
    ),
    ({}, {"rollout_instance_id": ["b", 1]}, RoutingMeta(hint=InstanceId("b", 1))),
    ({}, {"rollout_instance_hint": {"replica_id": "r", "dp_rank": 3}}, RoutingMeta(hint=InstanceId("r", 3))),
    ({}, {"base_worker_id": "w", "target_dp_rank": 0}, RoutingMeta(hint=InstanceId("w", 0))),
]


@pytest.mark.parametrize(("headers", "body", "expected"), OK_CASES)
def test_parses(headers, body, expected):
    got = meta(headers, body)
    if expected is None:
        assert got.version_tag == "7" and str(got.floor) == "7"
    else:
        assert got == expected


BAD_CASES = [
    ({"x-is-sticky": "maybe"}, {}, "x-is-sticky"),
    ({"x-is-validate": ""}, {}, "x-is-validate"),
    ({}, {"is_sticky": 2}, "is_sticky"),
    ({"x-force-pin-once": "on"}, {}, "x-force-pin-once"),
    ({"x-base-worker-id": "w"}, {}, "x-target-dp-rank"),
    ({"x-target-dp-rank": "1"}, {}, "x-base-worker-id"),
    ({"x-base-worker-id": "w", "x-target-dp-rank": "-1"}, {}, "x-target-dp-rank"),
    ({"x-base-worker-id": "w", "x-target-dp-rank": "1.5"}, {}, "x-target-dp-rank"),
    ({"x-base-worker-id": "w", "x-target-dp-rank": "70000"}, {}, "x-target-dp-rank"),
    ({"x-base-worker-id": " ", "x-target-dp-rank": "0"}, {}, "x-base-worker-id"),
    ({"x-prompt-id": ""}, {}, "x-prompt-id"),
    ({"x-prompt-id": "a b"}, {}, "x-prompt-id"),
    ({"x-prompt-id": "x" * 129}, {}, "x-prompt-id"),
    ({}, {"prompt_id": [1]}, "prompt_id"),
    ({}, {"prompt_id": True}, "prompt_id"),
    ({}, {"rollout_instance_id": ["w"]}, "rollout_instance_id"),
    ({}, {"rollout_instance_hint": {"worker_id": "w"}}, "rollout_instance_hint"),
    ({}, {"base_worker_id": "w"}, "base_worker_id"),
    ({}, {"version_tag": [1]}, "version_tag"),
]


@pytest.mark.parametrize(("headers", "body", "name"), BAD_CASES)
def test_bad_values_name_the_header_or_field(headers, body, name):
    with pytest.raises(InvalidRoutingMetadata) as info:
        meta(headers, body)
    assert info.value.name == name
    assert info.value.code == "invalid_routing_metadata"
    assert f"`{name}`" in str(info.value)


@pytest.mark.parametrize("tag", ["", "a b", "x" * 129])
def test_bad_version_tag_keeps_the_version_policy_error(tag):
    with pytest.raises(InvalidVersionPolicy):
        meta({"x-version-tag": tag})


def test_staged_only_with_a_prompt_group_or_a_hint():
    assert not meta({"x-request-id": "1", "x-version-tag": "3", "x-is-sticky": "1"}).staged
    assert meta({"x-prompt-id": "p"}).staged
    assert meta({}, {"rollout_instance_id": ["w", 0]}).staged


@pytest.mark.parametrize(
    ("sticky", "once", "honoured"), [(False, False, False), (True, False, True), (False, True, True)]
)
def test_hint_is_honoured_only_when_opted_in(sticky, once, honoured):
    routed = Routed(RoutingMeta(hint=InstanceId("w", 0), is_sticky=sticky, force_pin_once=once))
    assert (routed.hint() is not None) is honoured
    routed.selections = 1  # force-pin-once: the first selection only
    assert (routed.hint() is not None) is sticky
    routed.loop_hint = InstanceId("v", 1)  # a loopback's own hint always pins
    assert routed.hint() == InstanceId("v", 1)


def test_a_request_with_no_routing_header_or_field_is_plain():
    # The data plane answers PLAIN for such a request without calling parse (api/dataplane.py).
    assert parse(lambda name: None) == PLAIN
    assert parse(lambda name: None, {}) == PLAIN
    assert not PLAIN.staged

"""Discovery rows, DP collapsing and the selector view (docs/rl-control-plane.md, "Discovery"; SMG's discovery.rs tests)."""

import pytest

from smgrl.core.ids import new_operation_id, new_worker_id, uuid7
from smgrl.core.selector import parse_selector
from smgrl.core.view import (
    RL_WORKER_ENTRY_ADDITIONS,
    RL_WORKER_ENTRY_FIELDS,
    EngineFacts,
    collapse,
    control_url,
    dp_ranks_for,
    row,
    selector_view,
    workers_response,
)
from smgrl.core.worker import Worker, dp_rank_of, parse_size, strip_rank


def w(id, url, *, dp=False, status="ready", labels=None, runtime="sglang", mode="http", model_id=None):
    base = strip_rank(url)
    return Worker(
        id=id,
        url=url,
        base_url=base,
        runtime=runtime,
        connection_mode=mode,
        status=status,
        discovered_labels=labels or {},
        dp_aware=dp,
        dp_rank=dp_rank_of(url) if dp else None,
        group=id,
        model_id=model_id,
    )


def test_collapse_groups_dp_ranks_and_sorts():
    workers = [
        w("b1", "http://b:1@1", dp=True),
        w("a", "http://a:1"),
        w("b0", "http://b:1@0", dp=True),
        w("b2", "http://b:1@2", dp=True),
    ]
    groups = collapse(workers)
    assert [(g.representative.id, g.ranks) for g in groups] == [("a", 1), ("b0", 3)]


def test_collapse_keeps_a_non_dp_worker_sharing_a_dp_base_url():
    r0, r1, n = w("r0", "http://b:1@0", dp=True), w("r1", "http://b:1@1", dp=True), w("n", "http://b:1")
    groups = collapse([r0, r1, n])
    assert [(g.representative.id, g.ranks) for g in groups] == [("n", 1), ("r0", 2)]
    assert dp_ranks_for(r1, [r0, r1, n]) == 2
    assert dp_ranks_for(n, [r0, r1, n]) == 1


def test_ties_keep_the_first_seen_and_strictly_lower_replaces():
    a, b = w("x", "http://b:1@0", dp=True), w("y", "http://b:1@0", dp=True)
    assert collapse([a, b])[0].representative.id == "x"
    assert collapse([w("z", "http://b:1@3", dp=True), b])[0].representative.id == "y"


def test_pending_workers_are_invisible():
    assert collapse([w("p", "http://p:1", status="pending")]) == []


@pytest.mark.parametrize(
    "url, rank, base",
    [
        ("http://h:1@0", 0, "http://h:1"),
        ("http://h:1@12", 12, "http://h:1"),
        ("http://h:1", 0, "http://h:1"),
        ("http://h:1@x", 0, "http://h:1@x"),
        ("http://user@h:1/p", 0, "http://user@h:1/p"),
        ("http://h:1@²", 0, "http://h:1@²"),  # "²".isdigit(), but no rank (int() raised)
        ("http://h:1@" + "9" * 5000, 0, "http://h:1@" + "9" * 5000),  # past usize
    ],
)
def test_rank_parsing(url, rank, base):
    assert dp_rank_of(url) == rank
    assert strip_rank(url) == base


@pytest.mark.parametrize(
    "text, value",
    [
        ("2", 2),
        (" 4 ", 4),
        ("x", None),
        ("-1", None),
        ("", None),
        (None, None),
        ("٣", None),
        (str(2**64), None),
        ("²", None),
        ("9" * 5000, None),  # int() refuses 4,300+ digits: GET /v1/rl/workers answered 500
        ("0" * 30 + "7", 7),  # as Rust's u64 parse
    ],
)
def test_sizes_parse_as_unsigned(text, value):
    assert parse_size(text) == value


def test_merged_labels_add_synthetic_keys_that_shadow():
    worker = w(
        "i1",
        "http://h:1",
        labels={
            "engine": "spoofed",
            "id": "x",
            "tp_size": "2",
            "role": "policy",
            "weight_version": "7",
            "model": "m-label",
        },
        model_id="m",
    )
    view = selector_view(worker)
    assert view["engine"] == "sglang"
    assert view["id"] == "i1"
    assert view["model"] == "m"
    assert view["url"] == view["base_url"] == "http://h:1"
    assert view["health"] == "ready"
    assert view["weight_version"] == "7" and view["role"] == "policy" and view["tp_size"] == "2"
    assert "control" not in view
    assert parse_selector("engine=sglang, tp_size=2").matches(view)
    assert not parse_selector("engine=spoofed").matches(view)


def test_selector_view_uses_the_journal_facts():
    worker = w("i1", "http://h:1", labels={"weight_version": "default"})
    view = selector_view(worker, EngineFacts(weight_version="42", control="paused"))
    assert view["weight_version"] == "42" and view["control"] == "paused"


def test_row_fields_and_order():
    worker = w(
        "i1",
        "http://h:1",
        labels={
            "version": "0.5.23",
            "tp_size": "garbage",
            "dp_size": "1",
            "weight_version": "default",
            "served_model_name": "m",
        },
    )
    entry = row(worker, 1)
    assert list(entry) == list(RL_WORKER_ENTRY_FIELDS)
    assert entry["engine_version"] == "0.5.23"
    assert entry["tp_size"] is None and entry["dp_size"] == 1 and entry["pp_size"] is None
    assert entry["model_id"] == "m" and entry["role"] is None
    assert entry["weight_version"] == "default"
    assert entry["control_url"] == "http://h:1"
    assert entry["capabilities"]["source"] == "static"
    assert entry["capabilities"]["pause_modes"][0] == "abort"
    assert workers_response([entry]) == {"protocol_version": 1, "workers": [entry], "total": 1}


def test_row_reports_journal_facts_in_added_fields():
    worker = w("i1", "http://h:1", labels={"weight_version": "default"})
    entry = row(worker, 1, EngineFacts(weight_version="9", version_source="passthrough", control="paused"))
    assert entry["weight_version"] == "9"
    assert entry["version_source"] == "passthrough" and entry["control"] == "paused"
    assert entry["version_status"] == "consistent"
    assert list(entry) == [*RL_WORKER_ENTRY_FIELDS, *RL_WORKER_ENTRY_ADDITIONS]
    unknown = row(worker, 1, EngineFacts(version_known=False, control="unknown"))
    assert unknown["weight_version"] == "default" and unknown["version_status"] == "unknown"
    assert row(worker, 1, EngineFacts(mixed=True))["version_status"] == "mixed"


@pytest.mark.parametrize(
    "mode, url, labels, expected",
    [
        ("http", "http://h:1", {"rl.control_url": "http://other:2"}, "http://h:1"),
        (
            "grpc",
            "grpc://10.0.0.5:30000",
            {"rl.control_url": "http://0.0.0.0:40100"},
            "http://10.0.0.5:40100",
        ),
        ("grpc", "grpc://10.0.0.5:30000", {}, None),
        ("grpc", "grpc://10.0.0.5:30000", {"rl.control_url": "  "}, None),
        ("zmq", "ipc:///tmp/x", {"rl.control_url": "http://ctl:1/"}, "http://ctl:1"),
    ],
)
def test_control_url(mode, url, labels, expected):
    assert control_url(w("i", url, mode=mode, labels=labels)) == expected


def test_unknown_runtime_is_shown_as_unknown():
    assert w("i", "http://h:1", runtime="unspecified").engine == "unknown"
    assert w("i", "http://h:1", runtime="TokenSpeed").engine == "tokenspeed"


def test_worker_ids_are_uuid_v7_and_sortable():
    a = uuid7(now_ms=1_000)
    b = uuid7(now_ms=2_000)
    assert len(a) == 36 and a[14] == "7" and a[19] in "89ab"
    assert a < b
    for made in (new_worker_id(), new_operation_id()):
        assert made[14] == "7" and made[19] in "89ab" and made != a

"""engine_load: /v1/loads and /metrics answers as SMG 1.13.0 shows them in GET /workers rows.

The expected values are what the 1.13.0 wheel showed for the same engine answers (recorded by
hand on 2026-12-01: a logging proxy in front of a fake engine answering these bodies)."""

import json

import pytest

from smgrl.core.engine_load import (
    MAX_LOADS_BYTES,
    MAX_RANKS,
    LoadsTooLarge,
    NotALoadResponse,
    metrics_load,
    parse_loads,
    scrape,
)

# Every field SMG knows, unknown keys at each level, optional sections partly filled.
RICH = {
    "timestamp": "T1",
    "version": "9.9",
    "accelerator": "cuda",
    "num_accelerators": 2,
    "dp_rank_count": 7,
    "aggregate": {"total_running_reqs": 5},
    "extra_top": 1,
    "loads": [
        {
            "dp_rank": 3,
            "num_running_reqs": 4,
            "num_waiting_reqs": 2,
            "num_reqs": 6,
            "num_total_reqs": 11,
            "num_waiting_uncached_tokens": 13,
            "num_used_tokens": 100,
            "max_total_num_tokens": 1000,
            "token_usage": 0.1,
            "active_token_usage": 0.2,
            "gen_throughput": 1.5,
            "cache_hit_rate": 0.25,
            "utilization": 0.5,
            "max_running_requests": 64,
            "extra_row": "x",
            "memory": {"weight_gb": 1.0, "extra_mem": 2},
            "queues": {"waiting": 2, "extra_q": 3},
            "speculative": None,
            "lora": {"num_loaded_adapters": 1},
        }
    ],
}
RICH_SMG = {
    "timestamp": "T1",
    "version": "9.9",
    "dp_rank_count": 7,
    "loads": [
        {
            "dp_rank": 3,
            "num_running_reqs": 4,
            "num_waiting_reqs": 2,
            "num_waiting_uncached_tokens": 13,
            "num_total_reqs": 11,
            "num_used_tokens": 100,
            "max_total_num_tokens": 1000,
            "token_usage": 0.1,
            "active_token_usage": 0.2,
            "gen_throughput": 1.5,
            "cache_hit_rate": 0.25,
            "utilization": 0.5,
            "max_running_requests": 64,
            "memory": {"weight_gb": 1.0, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": 0},
            "queues": {"waiting": 2, "grammar": 0, "paused": 0, "retracted": 0},
        }
    ],
    "aggregate": {
        "total_running_reqs": 5,
        "total_waiting_reqs": 0,
        "total_reqs": 0,
        "avg_token_usage": 0.0,
        "avg_throughput": 0.0,
        "avg_utilization": 0.0,
    },
}
# The TokenSpeed fake's /v1/loads (its own, smaller shape).
TOKENSPEED = {"loads": [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_pages": 0}]}
TOKENSPEED_SMG = {
    "timestamp": "",
    "version": "",
    "dp_rank_count": 0,
    "loads": [
        {
            "dp_rank": 0,
            "num_running_reqs": 0,
            "num_waiting_reqs": 0,
            "num_waiting_uncached_tokens": 0,
            "num_total_reqs": 0,
            "num_used_tokens": 0,
            "max_total_num_tokens": 0,
            "token_usage": 0.0,
            "gen_throughput": 0.0,
            "cache_hit_rate": 0.0,
            "utilization": 0.0,
            "max_running_requests": 0,
        }
    ],
}


@pytest.mark.parametrize(("body", "expected"), [(RICH, RICH_SMG), (TOKENSPEED, TOKENSPEED_SMG)])
def test_a_load_answer_becomes_smgs_shape(body, expected):
    out = parse_loads(json.dumps(body).encode())
    assert out == expected
    assert list(out) == list(expected)  # SMG's field order, too
    assert [list(r) for r in out["loads"]] == [list(r) for r in expected["loads"]]
    assert isinstance(out["loads"][0]["token_usage"], float)


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"loads": {}}',
        b'{"loads": [1]}',
        b'{"timestamp": 5, "loads": [{}]}',
        b'{"loads": [{"num_running_reqs": 4.0}]}',  # serde: a float is not an i32
        b'{"loads": [{"num_running_reqs": true}]}',
        b'{"loads": [{"num_running_reqs": null}]}',  # a defaulted field may be missing, not null
        b'{"loads": [{"num_running_reqs": 2147483648}]}',
        b'{"loads": [{"token_usage": "0.1"}]}',
        b'{"loads": [{"token_usage": NaN}]}',
        b'{"loads": [{"token_usage": 1e400}]}',
        b'{"loads": [{"memory": []}]}',
    ],
)
def test_what_is_not_a_load_response(body):
    with pytest.raises(NotALoadResponse):
        parse_loads(body)


def test_no_rank_yet_is_no_sample_and_null_optionals_are_left_out():
    assert parse_loads(b'{"timestamp": "t", "loads": []}') is None
    out = parse_loads(b'{"loads": [{"memory": null, "active_token_usage": null, "token_usage": 1}]}')
    assert "memory" not in out["loads"][0] and "active_token_usage" not in out["loads"][0]
    assert out["loads"][0]["token_usage"] == 1.0 and "aggregate" not in out


SGLANG_METRICS = """# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",dp_rank="0"} 0.25
sglang:token_usage{model_name="m",dp_rank="1"} 0.75
sglang:num_running_reqs{model_name="m",dp_rank="0"} 3
sglang:num_running_reqs{model_name="m",dp_rank="1"} 4 1700000000
sglang:num_queue_reqs{model_name="a b}c"} 2
sglang:gen_throughput 10.5
bogus line
sglang:utilization{x="1"} notanumber
"""


def test_metrics_fallback_synthesizes_one_rank():
    out = metrics_load("sglang", SGLANG_METRICS)
    rank = out["loads"][0]
    assert (out["timestamp"], out["version"], out["dp_rank_count"]) == ("", "", 1)
    assert rank["num_running_reqs"] == 7 and rank["num_waiting_reqs"] == 2
    assert rank["token_usage"] == 0.5 and rank["gen_throughput"] == 10.5 and rank["utilization"] == 0.0
    vllm = "vllm:kv_cache_usage_perc 0.5\nvllm:num_requests_running 2\nvllm:num_requests_waiting NaN\n"
    assert metrics_load("vllm", vllm)["loads"][0]["num_waiting_reqs"] == 0  # Rust's `NaN as i32`
    # Without the KV-usage gauge there is no sample (an idle-looking 0.0 would be a lie).
    assert metrics_load("sglang", "sglang:num_running_reqs 3\n") is None
    assert metrics_load("tokenspeed", SGLANG_METRICS) is None


def test_scrape_ignores_labels_and_timestamps():
    m = scrape('a{l="x y"} 1 17\nb 2\n# c 3\n')
    assert m == {"a": [1.0], "b": [2.0]}


def test_get_loads_totals_are_smgs():
    """Recorded from the 1.13.0 wheel: two ranks (3+1 and 5+2 requests, num_total_reqs 7 and 11):
    total_reqs is running + waiting (11), not the sum of num_total_reqs; the rest are means."""
    from smgrl.core.engine_load import loads_summary, rfc3339_now

    ranks = [
        {"dp_rank": 0, "num_running_reqs": 3, "num_waiting_reqs": 1, "num_total_reqs": 7, "token_usage": 0.1,
         "gen_throughput": 10.0, "utilization": 0.2},
        {"dp_rank": 1, "num_running_reqs": 5, "num_waiting_reqs": 2, "num_total_reqs": 11, "token_usage": 0.3,
         "gen_throughput": 30.0, "utilization": 0.6},
    ]  # fmt: skip
    sample = parse_loads(json.dumps({"loads": ranks}).encode())
    out = loads_summary([("http://h:1", "regular", sample)], "T", "v")
    assert [list(r)[:3] for r in out["loads"]] == [["worker", "worker_type", "dp_rank"]] * 2
    assert out["aggregate"] == {
        "total_running_reqs": 8,
        "total_waiting_reqs": 3,
        "total_reqs": 11,
        "avg_token_usage": 0.2,
        "avg_throughput": 20.0,
        "avg_utilization": 0.4,
    }
    assert loads_summary([], "T", "v") == {"timestamp": "T", "version": "v", "dp_rank_count": 0, "loads": []}
    # chrono's to_rfc3339: only the fractional digits needed (SMG: 2026-12-01T08:50:05.361495294+00:00).
    assert rfc3339_now(1_796_114_405_361_495_294) == "2026-12-01T08:40:05.361495294+00:00"
    assert rfc3339_now(1_796_114_405_361_000_000) == "2026-12-01T08:40:05.361+00:00"
    assert rfc3339_now(1_796_114_405_000_000_000) == "2026-12-01T08:40:05+00:00"


@pytest.mark.parametrize(
    "body",
    [
        b'{"loads": [' + b",".join([b"{}"] * (MAX_RANKS + 1)) + b"]}",  # 3 bytes a rank, ~1 KB each in memory
        b'{"version": "' + b"v" * MAX_LOADS_BYTES + b'", "loads": [{}]}',
        b"x" * (MAX_LOADS_BYTES + 1),  # too large is decided before parsing (cut off at the probe cap)
    ],
)
def test_an_answer_too_large_to_keep_is_refused_this_time_only(body):
    # Not NotALoadResponse: that one would stop the monitor asking the engine for good.
    with pytest.raises(LoadsTooLarge):
        parse_loads(body)
    assert not issubclass(LoadsTooLarge, NotALoadResponse)


def test_the_largest_answer_kept():
    out = parse_loads(b'{"loads": [' + b",".join([b"{}"] * MAX_RANKS) + b"]}")
    assert len(out["loads"]) == MAX_RANKS

"""Pure pieces of ``--workers N``: the workers' flags and the merged metrics exposition."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from smgrl.cluster.metrics_merge import merge_expositions
from smgrl.cluster.supervisor import child_args


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--workers", "2", "--port", "1"], ["--port", "1"]),
        (["--port", "1", "--workers=3"], ["--port", "1"]),
        (["--worker-urls", "a", "b", "--workers", "2"], ["--worker-urls", "a", "b"]),
        (["--port", "1"], ["--port", "1"]),
    ],
)
def test_workers_get_the_launch_flags_without_workers(argv, expected):
    assert child_args(argv) == expected


WORKER = """# HELP smgrl_requests_total Requests
# TYPE smgrl_requests_total counter
smgrl_requests_total{route="generate"} 3.0
# HELP smgrl_workers Registry entries, by health
# TYPE smgrl_workers gauge
smgrl_workers{health="ready"} 2.0
# HELP smgrl_latency_seconds Latency
# TYPE smgrl_latency_seconds histogram
smgrl_latency_seconds_bucket{le="0.1"} 1.0
smgrl_latency_seconds_bucket{le="+Inf"} 2.0
smgrl_latency_seconds_count 2.0
smgrl_latency_seconds_sum 0.3
"""


def test_merged_exposition_labels_every_sample_and_parses_back():
    text = merge_expositions({"0": WORKER, "1": WORKER.replace(" 3.0", " 5.0")}, label="gateway_worker")
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) == {"smgrl_requests", "smgrl_workers", "smgrl_latency_seconds"}
    assert families["smgrl_requests"].type == "counter"
    requests = {s.labels["gateway_worker"]: s.value for s in families["smgrl_requests"].samples}
    assert requests == {"0": 3.0, "1": 5.0}
    assert all("gateway_worker" in s.labels for f in families.values() for s in f.samples)
    assert len(families["smgrl_latency_seconds"].samples) == 8
    # Each family's HELP and TYPE once.
    assert text.count("# TYPE smgrl_workers gauge") == 1


def test_label_values_are_escaped():
    text = merge_expositions({'a"b\\c': WORKER}, label="gateway_worker")
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "smgrl_workers"]
    assert fam.samples[0].labels["gateway_worker"] == 'a"b\\c'


def test_nothing_to_merge_is_an_empty_exposition():
    assert merge_expositions({}, label="gateway_worker") == ""

"""Load, CI-sized (benchmarks/load.py runs the full 1,000 fan-outs over 64 engines): fan-outs back to
back while two clients poll discovery and the journal routes, through real processes. Asserted:
zero errors, and resident memory growth under 10% from the 100th to the last fan-out (memory, not
wall-clock: the timings are printed, never asserted)."""

from __future__ import annotations

import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _load_benchmark():
    spec = importlib.util.spec_from_file_location("smgrl_benchmark_load", ROOT / "benchmarks" / "load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fanouts_under_polling_have_no_errors_and_flat_memory(tmp_path, record_property):
    load = _load_benchmark()
    result = load.run(fanouts=300, engines=16, pollers=2, journal_dir=str(tmp_path), bound_secs=300)
    print(load.render(result))
    record_property("rss_growth_pct", round(result["rss_growth"] * 100, 1))
    assert result["fanout_errors"] == []
    assert result["poll_errors"] == []
    assert result["poll_requests"] > 100  # the pollers really ran alongside
    assert result["rss_growth"] < load.MAX_GROWTH, result["rss_kib"]
    assert result["gateway_exit"] == 0

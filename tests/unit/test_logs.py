"""Log lines: text and JSON formats, written by the writer thread in order, tracebacks kept."""

import io
import json
import logging

import pytest

from smgrl import logs


@pytest.fixture
def capture():
    buf = io.StringIO()
    yield buf
    logs.shutdown()


def test_text_lines_keep_fields_order_and_tracebacks(capture):
    logs.configure("info", False, capture)
    log = logging.getLogger("smgrl.rl")
    logs.event(log, "rl.proxy", worker_id="w1", path="flush_cache", status=200, latency_ms=3)
    logs.event(log, "rl.fanout", selector="engine=sglang, role=a", total=2)
    logs.event(log, "hidden", level=logging.DEBUG, x=1)
    try:
        raise ValueError("bad")
    except ValueError:
        log.exception("failed")
    logs.shutdown()
    lines = capture.getvalue().splitlines()
    assert lines[0].endswith("INFO  smgrl.rl: rl.proxy worker_id=w1 path=flush_cache status=200 latency_ms=3")
    assert lines[1].endswith('rl.fanout selector="engine=sglang, role=a" total=2')
    assert "hidden" not in capture.getvalue()
    assert "ERROR smgrl.rl: failed" in lines[2] and lines[-1] == "ValueError: bad"


def test_json_lines_are_one_object_each(capture):
    logs.configure("debug", True, capture)
    log = logging.getLogger("smgrl.audit")
    logs.event(log, "control_plane_audit", principal="k1", outcome="denied", status=401)
    try:
        raise KeyError("x")
    except KeyError:
        log.exception("boom")
    logs.shutdown()
    objs = [json.loads(line) for line in capture.getvalue().splitlines()]
    assert objs[0]["message"] == "control_plane_audit" and objs[0]["status"] == 401
    assert objs[0]["level"] == "info" and objs[0]["target"] == "smgrl.audit"
    assert objs[1]["exception"].endswith("KeyError: 'x'")

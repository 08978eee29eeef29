"""Log lines: text and JSON formats, written by the writer thread in order, tracebacks kept."""

import io
import json
import logging
import os
import threading

import pytest

from smgrl.telemetry import logs


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
    assert "ERROR smgrl.rl: failed" in lines[2] and lines[-1] == "    ValueError: bad"


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


# What a client or an engine sends must not forge fields or lines in either format.
ATTACKS = [
    "abc\tprincipal=admin\toutcome=success",  # tabs writing fake key=value fields
    "x\n2026-01-01T00:00:00.000Z INFO  smgrl.telemetry.audit: control_plane_audit principal=admin",
    "a\rb",
    "nel\x85line",
    "ls\u2028ps\u2029",
    "bidi\u202egnp.exe",
    "esc\x1b]0;title\x07bell",
    "del\x7f",
    "lone\ud800surrogate",
    'quote" principal=admin',
    "back\\slash",
]
UNSAFE = [chr(c) for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, 0x202E, 0xD800]]


@pytest.mark.parametrize("value", ATTACKS)
def test_text_lines_escape_what_clients_send(capture, value):
    logs.configure("info", False, capture)
    log = logging.getLogger("smgrl.audit")
    logs.event(log, "control_plane_audit", request_id=value, path="/v1/rl/" + value, status=401)
    log.warning("path %s", value)
    try:
        raise ValueError(value)
    except ValueError:
        log.exception("failed on %s", value)
    logs.shutdown()
    text = capture.getvalue()
    assert not any(ch in text.replace("\n", "") for ch in UNSAFE)
    lines = text.split("\n")[:-1]
    # One line per record, plus the traceback's lines, every one of them indented.
    assert [line[:4] for line in lines[:3]] == ["20" + lines[0][2:4]] * 3
    assert all(line.startswith("    ") for line in lines[3:])
    head = lines[0].split("control_plane_audit ", 1)[1]
    # The fields are exactly the three that were logged: nothing a value carried became a field.
    assert _logfmt_keys(head) == ["request_id", "path", "status"]


def _logfmt_keys(text: str) -> list[str]:
    """The keys of a logfmt tail: bare values end at a space, quoted ones at an unescaped quote."""
    keys, i = [], 0
    while i < len(text):
        eq = text.index("=", i)
        keys.append(text[i:eq])
        i = eq + 1
        if text[i : i + 1] == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
        else:
            while i < len(text) and text[i] != " ":
                i += 1
        i += 1
    return keys


@pytest.mark.parametrize("value", ATTACKS)
def test_json_lines_escape_what_clients_send(capture, value):
    logs.configure("info", True, capture)
    log = logging.getLogger("smgrl.audit")
    logs.event(log, "control_plane_audit", request_id=value, status=401)
    try:
        raise ValueError(value)
    except ValueError:
        log.exception("failed on %s", value)
    logs.shutdown()
    text = capture.getvalue()
    assert not any(ch in text.replace("\n", "") for ch in UNSAFE)
    objs = [json.loads(line) for line in text.split("\n")[:-1]]
    assert len(objs) == 2
    assert objs[0]["request_id"] == value and objs[1]["message"] == f"failed on {value}"


def test_plain_values_stay_bare_and_unicode_stays_readable(capture):
    logs.configure("info", False, capture)
    logs.event(logging.getLogger("smgrl.rl"), "m", a="w1", b="modèle-中文", c="", d="k=v", e=None)
    logs.shutdown()
    assert capture.getvalue().rstrip("\n").endswith(' m a=w1 b=modèle-中文 c="" d="k=v" e=None')


def test_a_regular_file_is_written_where_the_line_is_logged(tmp_path):
    """No writer thread and no queue for a file: the line is in the file when the call returns."""
    path = tmp_path / "gateway.log"
    threads = threading.active_count()
    with open(path, "w") as stream:
        logs.configure("info", False, stream)
        try:
            assert threading.active_count() == threads
            logs.event(logging.getLogger("smgrl.rl"), "rl.fanout", op_id="op1", total=8)
            assert path.read_text().endswith("INFO  smgrl.rl: rl.fanout op_id=op1 total=8\n")
        finally:
            logs.shutdown()


def test_a_pipe_keeps_the_writer_thread():
    """A pipe can stall its writer while the reader lags: lines go through the writer thread."""
    read_fd, write_fd = os.pipe()
    threads = threading.active_count()
    with os.fdopen(read_fd) as reader, os.fdopen(write_fd, "w") as stream:
        logs.configure("info", False, stream)
        try:
            assert threading.active_count() == threads + 1
            logs.event(logging.getLogger("smgrl.rl"), "rl.fanout", op_id="op1", total=8)
        finally:
            logs.shutdown()
        stream.flush()
        assert reader.readline().endswith("rl.fanout op_id=op1 total=8\n")


def test_records_skip_thread_and_process_names_until_shutdown(capture):
    """No format prints them, so configure() turns the stdlib's lookups off; shutdown() restores
    the switches as it found them (a test process's other loggers keep theirs)."""
    assert logging.logThreads and logging.logProcesses
    logs.configure("info", False, capture)
    assert not (logging.logThreads or logging.logProcesses or logging.logMultiprocessing)
    logs.event(logging.getLogger("smgrl.rl"), "rl.fanout", total=1)
    logs.shutdown()
    assert logging.logThreads and logging.logProcesses and logging.logMultiprocessing
    assert capture.getvalue().endswith("INFO  smgrl.rl: rl.fanout total=1\n")

"""``smgrl fake-engine`` / ``python -m smgrl.fake``: port parsing, the ready line, clean exit."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import click
import httpx
import pytest
import trio
from click.testing import CliRunner

from smgrl.fake.cli import fake_engine, parse_ports


@pytest.mark.parametrize(
    ("spec", "ports"),
    [
        ("31000-31003", [31000, 31001, 31002, 31003]),
        ("31000,31005", [31000, 31005]),
        ("0", [0]),
        ("0,0,0", [0, 0, 0]),
        ("1-2, 7", [1, 2, 7]),
    ],
)
def test_parse_ports(spec, ports):
    assert parse_ports(spec) == ports


@pytest.mark.parametrize("spec", ["", "abc", "5-3", "70000", "1,1", "1-3,2"])
def test_parse_ports_rejects(spec):
    with pytest.raises(click.BadParameter):
        parse_ports(spec)


def test_help_lists_the_flags():
    result = CliRunner().invoke(fake_engine, ["--help"])
    assert result.exit_code == 0
    for flag in ("--kind", "--ports", "--host", "--dp-size", "--tp-size", "--model-path", "--served-model-name",
                 "--weight-version", "--api-key", "--latency-ms", "--require-weight-session",
                 "--no-require-weight-session", "--real-distributed"):  # fmt: skip
        assert flag in result.output


def test_non_loopback_host_is_refused():
    result = CliRunner().invoke(fake_engine, ["--host", "0.0.0.0"])
    assert result.exit_code == 2 and "loopback" in result.output


async def _read_line(stream: trio.abc.ReceiveStream) -> bytes:
    data = b""
    while not data.endswith(b"\n"):  # bounded by the caller's fail_after
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        data += chunk
    return data


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_subprocess_ready_line_and_clean_exit(sig):
    cmd = [sys.executable, "-m", "smgrl.fake", "--kind", "vllm", "--ports", "0,0", "--weight-version", "w0"]
    proc = await trio.lowlevel.open_process(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        with trio.fail_after(30):
            line = json.loads(await _read_line(proc.stdout))
        assert line["ready"] is True and line["kind"] == "vllm" and line["pid"] == proc.pid
        assert len(line["urls"]) == 2
        async with httpx.AsyncClient() as c:
            for url in line["urls"]:
                assert (await c.get(url + "/version")).json() == {"version": "0.33.0"}
                assert (await c.get(url + "/weight_info")).json() == {"weight_version": "w0"}
        proc.send_signal(sig)  # our own child, by PID
        with trio.fail_after(30):
            code = await proc.wait()
        assert code == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()

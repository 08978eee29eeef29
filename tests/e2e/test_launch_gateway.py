"""Starting a gateway for a test: a port taken between ``free_port()`` and the gateway's bind is
retried on a fresh one; a port the caller chose is not, and the gateway's own words are raised."""

from __future__ import annotations

import socket

import pytest

from smgrl.demo import procs


@pytest.fixture
def taken():
    """A loopback port held by this test (bound, so no one else can bind it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def test_a_port_taken_before_the_bind_is_retried_on_a_fresh_one(monkeypatch, taken, tmp_path, children):
    real = procs.free_port
    handed = iter([taken])
    # The first port handed out is the one another process took: the race, made certain.
    monkeypatch.setattr(procs, "free_port", lambda: next(handed, None) or real())
    child, port = procs.launch_gateway(["--journal", str(tmp_path / "j.db")], log_dir=tmp_path)
    children.append(child)
    assert port != taken
    assert "cannot listen on" in (tmp_path / f"gateway-{taken}.log").read_text()
    assert child.proc.poll() is None and child.log_path == tmp_path / f"gateway-{port}.log"


def test_a_port_the_caller_chose_is_not_retried(taken, tmp_path):
    with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{taken}"):
        procs.launch_gateway(["--journal", str(tmp_path / "j.db")], log_dir=tmp_path, port=taken)

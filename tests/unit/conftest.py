"""tests/unit is the pure axis: no test here opens a network socket or starts a process (those
live in tests/api, tests/loopback, tests/e2e...). Enforced for every test of this folder."""

import socket
import subprocess

import pytest

_NETWORK = (socket.AF_INET, socket.AF_INET6)


class OpensASocket(AssertionError):
    pass


@pytest.fixture(autouse=True)
def _no_network_no_processes(monkeypatch):
    bind, connect, connect_ex = socket.socket.bind, socket.socket.connect, socket.socket.connect_ex

    def refuse(real):
        def call(self, address):
            if self.family in _NETWORK:
                raise OpensASocket(f"a test in tests/unit opened a network socket ({address!r}): move it")
            return real(self, address)

        return call

    def no_process(self, *args, **kwargs):
        raise OpensASocket("a test in tests/unit started a process: move it")

    monkeypatch.setattr(socket.socket, "bind", refuse(bind))
    monkeypatch.setattr(socket.socket, "connect", refuse(connect))
    monkeypatch.setattr(socket.socket, "connect_ex", refuse(connect_ex))
    monkeypatch.setattr(subprocess.Popen, "__init__", no_process)

"""Child processes for the demo and the end-to-end tests: fake engines and a gateway.

Every child is started by this module and stopped by its own PID (SIGTERM, then SIGKILL after a
bound); nothing here ever signals a process it did not start. All listeners are on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence

import attrs

READY_TIMEOUT_SECS = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@attrs.define
class Child:
    proc: subprocess.Popen
    name: str
    # Fake engines serving gRPC (``--grpc``): each engine's HTTP control URL, beside its gRPC URL.
    control_urls: list[str] = attrs.Factory(list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)


def start_fake_engines(kind: str, count: int, extra: Sequence[str] = (), log=None) -> tuple[Child, list[str]]:
    """Start ``count`` fake engines of ``kind`` in one process; return it and the engines' URLs."""
    argv = [sys.executable, "-m", "smgrl.fake", "--kind", kind, "--ports", ",".join(["0"] * count), *extra]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log or subprocess.DEVNULL, text=True)
    child = Child(proc, f"fake-{kind}")
    deadline = time.monotonic() + READY_TIMEOUT_SECS
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.strip().startswith("{"):
            break
        if proc.poll() is not None:
            raise RuntimeError(f"fake {kind} engines exited early (code {proc.returncode})")
    try:
        ready = json.loads(line)
    except ValueError:
        child.kill()
        raise RuntimeError(f"fake {kind} engines did not report ready: {line!r}") from None
    child.control_urls = list(ready.get("control_urls", ready["urls"]))
    return child, list(ready["urls"])


def start_gateway(args: Sequence[str], *, port: int, env: dict | None = None, log=None) -> Child:
    argv = [sys.executable, "-m", "smgrl", "launch", "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(
        argv,
        stdout=log or subprocess.DEVNULL,
        stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )
    return Child(proc, "smgrl")


def wait_for_workers(
    base: str,
    count: int,
    *,
    token: str | None = None,
    timeout: float = READY_TIMEOUT_SECS,
    child: Child | None = None,
) -> list[dict]:
    """Poll ``GET /v1/rl/workers`` until ``count`` rows are listed (registration is asynchronous)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    deadline = time.monotonic() + timeout
    rows: list[dict] = []
    while time.monotonic() < deadline:
        if child is not None and child.proc.poll() is not None:
            raise RuntimeError(f"the gateway exited early (code {child.proc.returncode})")
        try:
            req = urllib.request.Request(base + "/v1/rl/workers", headers=headers)
            with urllib.request.urlopen(req, timeout=2) as r:
                rows = json.loads(r.read())["workers"]
            if len(rows) >= count:
                return rows
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{count} workers not listed within {timeout:g}s (saw {len(rows)})")


def wait_listening(base: str, *, timeout: float = READY_TIMEOUT_SECS, child: Child | None = None) -> None:
    """Poll ``GET /liveness`` until the gateway answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and child.proc.poll() is not None:
            raise RuntimeError(f"the gateway exited early (code {child.proc.returncode})")
        try:
            with urllib.request.urlopen(base + "/liveness", timeout=2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"the gateway at {base} did not answer within {timeout:g}s")

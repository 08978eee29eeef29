"""Child processes for the demo and the end-to-end tests: fake engines and a gateway.

Every child is started by this module and stopped by its own PID (SIGTERM, then SIGKILL after a
bound); nothing here ever signals a process it did not start. All listeners are on 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import pathlib
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
    # Where the child's output goes, when it was started with a log of its own.
    log_path: pathlib.Path | None = None

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


def launch_gateway(
    args: Sequence[str],
    *,
    log_dir: pathlib.Path,
    env: dict | None = None,
    port: int | None = None,
    attempts: int = 3,
) -> tuple[Child, int]:
    """Start a gateway and wait until it answers; return it and its port.

    A port ``free_port()`` saw free can be taken before the gateway binds it (a test suite opens
    loopback connections by the thousand, each on an ephemeral port). A gateway that says it
    cannot listen is started again on fresh ports, up to ``attempts`` times, unless the caller
    chose its port. The gateway's output goes to ``log_dir/gateway-<port>.log``
    (``Child.log_path``); ``--prometheus-port`` gets a free port unless ``args`` name one. Any
    other early exit raises with the gateway's own last words.
    """
    for attempt in range(attempts):
        chosen = port or free_port()
        metrics = [] if "--prometheus-port" in args else ["--prometheus-port", str(free_port())]
        argv = [*args, *metrics]
        path = log_dir / f"gateway-{chosen}.log"
        log = open(path, "a")  # noqa: SIM115 - held by the child for its lifetime
        child = start_gateway(argv, port=chosen, env=env, log=log)
        child.log_path = path
        try:
            wait_listening(f"http://127.0.0.1:{chosen}", child=child)
        except RuntimeError as exc:
            said = path.read_text(errors="replace")
            if "cannot listen on" in said and port is None and attempt < attempts - 1:
                log.close()  # that gateway has exited: its log is complete
                continue
            raise RuntimeError(f"{exc}; the gateway said: {said[-2000:]}") from None
        except BaseException:
            child.kill()  # it may still be starting: it is ours to end
            raise
        return child, chosen
    raise AssertionError("unreachable: the last attempt returns or raises")


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

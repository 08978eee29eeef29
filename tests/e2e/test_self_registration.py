"""A gateway asked to register its own URL as a worker refuses it, so /generate can never
loop through itself. Real processes: the gateway, a TCP forwarder standing for another name of the
same listener (a second address, a port-forward, a load balancer), and `smgrl journal`."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

from click.testing import CliRunner

from smgrl.cli.journal import journal_group
from smgrl.demo.procs import free_port


class Forwarder:
    """Accepts on a free loopback port and pipes each connection to ``target`` (bounded: closed
    by the test; each pipe ends when either side closes)."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                # The gateway is not listening yet (its load monitor or health checker can reach
                # this port first): refuse this one connection, as the target did, and go on.
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        self.sock.close()


def _events(journal: str) -> list[dict]:
    out = CliRunner().invoke(journal_group, ["--journal", journal, "events", "--json"]).output
    return [json.loads(line) for line in out.splitlines()]


def test_a_gateway_refuses_to_register_itself(gateway, fakes, tmp_path):
    (engine,) = fakes("sglang", 1)
    journal = str(tmp_path / "j.db")
    _child, http, port = gateway(
        "--enable-rl", "--disable-health-check", "--worker-urls", engine, journal=journal
    )
    with urllib.request.urlopen(f"{http.base}/health", timeout=10) as r:
        assert r.status == 200 and len(r.headers["x-smgrl-gateway-id"]) == 32

    # Its own listener, by address or by loopback name: refused at once, nothing journaled.
    for url in (f"http://127.0.0.1:{port}", f"http://localhost:{port}/", f"http://127.0.0.1:{port}@0"):
        status, _, body = http.request("POST", "/workers", {"url": url})
        assert status == 400 and body["code"] == "BAD_REQUEST", body
        assert "reaches this gateway itself" in body["error"]

    # Another name for it (here a forwarder on another port): discovery sees the gateway's id on
    # GET /health and removes the registration before it was ever discovered.
    forwarder = Forwarder(port)
    try:
        looped = f"http://127.0.0.1:{forwarder.port}"
        status, _, body = http.request("POST", "/workers", {"url": looped})
        assert status == 202
        wid = body["worker_id"]
        deadline = time.monotonic() + 20
        while http.request("GET", f"/workers/{wid}")[0] != 404:
            assert time.monotonic() < deadline, "the self-registration was not refused"
            time.sleep(0.05)
    finally:
        forwarder.close()

    events = _events(journal)
    mine = [e for e in events if e["payload"].get("worker_id") == wid]
    assert [e["type"] for e in mine] == ["worker.registered", "worker.removed"]
    assert "reaches this gateway itself" in mine[-1]["payload"]["reason"]
    registered = [e["payload"]["url"] for e in events if e["type"] == "worker.registered"]
    assert registered == [engine, looped]  # the refused-at-once URLs were never journaled
    # Rollouts still go to the real engine only (no loop, no 504).
    status, _headers, _ = http.request(
        "POST", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    )
    assert status == 200


def test_launch_refuses_its_own_address(tmp_path):
    import subprocess
    import sys

    port = free_port()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "smgrl",
            "launch",
            "--port",
            str(port),
            "--journal",
            str(tmp_path / "j.db"),
            "--worker-urls",
            f"http://127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        (
            f"error: Invalid value for field 'worker_url': http://127.0.0.1:{port} - this URL reaches "
            "this gateway itself; register the engines' own URLs (a gateway routing to itself loops until the "
            "request times out)"
        )
    ]
    assert not (tmp_path / "j.db").exists()


def test_a_ready_worker_that_leads_back_is_removed_by_the_health_checker(gateway, fakes, tmp_path):
    """A journal written before this check (or an address that later answers for the gateway):
    the worker was discovered and is ready; the health checker sees the gateway's own id and
    removes it."""
    from journal import Append, SqliteStore
    from smgrl.events import WorkerDiscovered, WorkerRegistered

    (engine,) = fakes("sglang", 1)
    journal = str(tmp_path / "old.db")
    port = free_port()
    forwarder = Forwarder(port)  # forwards to the gateway started below
    looped = f"http://127.0.0.1:{forwarder.port}"
    store = SqliteStore.open(journal)
    wid = "01a22fbd-0000-7000-8000-000000000001"
    store.append_batch(
        [
            Append(
                f"worker:{wid}",
                WorkerRegistered(worker_id=wid, url=looped, base_url=looped, source="api"),
            ),
            Append(
                f"worker:{wid}",
                WorkerDiscovered(
                    worker_id=wid,
                    runtime="sglang",
                    labels={},
                    model_id="m",
                    dp_rank_ids=[],
                ),
            ),
        ]
    )
    store.close()
    try:
        _child, http, _ = gateway(
            "--enable-rl",
            "--health-check-interval-secs",
            "1",
            "--worker-urls",
            engine,
            journal=journal,
            port=port,
        )
        deadline = time.monotonic() + 30
        while http.request("GET", f"/workers/{wid}")[0] != 404:
            assert time.monotonic() < deadline, "the looping worker was not removed"
            time.sleep(0.1)
    finally:
        forwarder.close()
    removed = [e for e in _events(journal) if e["type"] == "worker.removed"]
    assert [e["payload"]["worker_id"] for e in removed] == [wid]
    assert "reaches this gateway itself" in removed[0]["payload"]["reason"]

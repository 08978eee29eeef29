"""Fail-stop with a real process: a projection that cannot apply a committed event stops
`smgrl launch` with one error line and exit status 1; the journal keeps the event and verifies.

The projection bug is injected by a wrapper script that patches the registry fold before running
the real CLI (there is no such bug to trigger from outside, which is the point of fail-stop).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

from journal import SqliteStore
from smgrl.demo.procs import free_port, wait_listening

WRAPPER = textwrap.dedent(
    """
    import sys
    from smgrl.state.registry import RegistryState
    original = RegistryState.apply

    def buggy(self, seq, event):
        if getattr(event, "TYPE", None) == "worker.registered" and event.labels.get("boom"):
            raise RuntimeError("an injected projection bug")
        return original(self, seq, event)

    RegistryState.apply = buggy
    from smgrl.cli.main import main
    main(sys.argv[1:])
    """
)


def test_a_projection_failure_stops_the_process_with_one_line(tmp_path):
    journal = str(tmp_path / "journal.db")
    port = free_port()
    argv = [
        sys.executable,
        "-c",
        WRAPPER,
        "launch",
        "--port",
        str(port),
        "--prometheus-port",
        str(free_port()),
        "--disable-health-check",
        "--log-level",
        "error",
        "--journal",
        journal,
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_listening(base)
        body = json.dumps({"url": f"http://127.0.0.1:{free_port()}", "labels": {"boom": "1"}}).encode()
        req = urllib.request.Request(
            base + "/workers", data=body, method="POST", headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                status = r.status
        except urllib.error.HTTPError as e:
            status = e.code
        except OSError:
            status = None  # the process went down before answering
        assert status in (503, None)  # never a 202 for a change memory did not take
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert proc.returncode == 1
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("error: applying journal events ") and "to memory failed" in last, stderr
    assert last.endswith("the gateway stopped (restart it to replay the journal)")
    with SqliteStore.open(journal, readonly=True) as store:
        assert store.verify().ok
        assert [r.event.labels for r in store.read(types=["worker.registered"])] == [{"boom": "1"}]

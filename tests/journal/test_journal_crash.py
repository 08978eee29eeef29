"""SIGKILL: every append that returned is in the journal after the process is killed, chain intact.

A child process appends through JournalWriter from many tasks and prints each receipt once
``append`` has returned; the parent kills it with SIGKILL mid-stream and reopens the file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from journal import SqliteStore

REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent(
    """
    import sys
    import trio
    from journal import JournalWriter, SqliteStore
    from smgrl.events import ControlOutcome

    async def appender(writer, k):
        i = 0
        while True:
            event = ControlOutcome(op_id=f"op{k}-{i}", worker_id="w1", url="http://w1", latency_ms=1)
            rec = await writer.append("control", event)
            # Printed only after append returned: the receipt promises durability.
            print(rec.seq, rec.hash, flush=True)
            i += 1

    async def main():
        store = SqliteStore.open(sys.argv[1])
        writer = JournalWriter(store)
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            for k in range(16):
                nursery.start_soon(appender, writer, k)

    trio.run(main)
    """
)


def test_receipts_survive_sigkill(tmp_path):
    path = tmp_path / "j.db"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    receipts: dict[int, str] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seq, hash_ = line.split()
            receipts[int(seq)] = hash_
            if len(receipts) >= 2000:
                break
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert len(receipts) >= 2000
    with SqliteStore.open(path) as store:  # read-write: recovers the WAL like the next gateway start
        stored = {r.seq: r.hash for r in store.read()}
        assert store.verify().ok
    assert receipts.items() <= stored.items()
    assert sorted(stored) == list(range(1, len(stored) + 1))

"""Several processes on one journal: an operation another process closed is never closed again.

A process whose event loop stalled past its presence lease has its open operations recorded
``control.interrupted`` by the process holding the recovery lease. When the stalled one wakes and
finishes the operation, it must not then record outcomes and a ``control.finished`` beside that
close (before the fence the journal held both and ``ops show`` said "no outcome recorded"). In
process: the real control service on a real SQLite file, a second connection appending as the
other process does, real fake engines on loopback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from journal import Append, SqliteStore
from smgrl.core.config import Config, RlConfig
from smgrl.events import ControlInterrupted
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

FANOUT = "/v1/rl/engine/flush_cache?selector=engine%3Dsglang"


@pytest.mark.parametrize("applied", [False, True], ids=["close-not-yet-read", "close-already-applied"])
async def test_a_stalled_process_does_not_close_an_operation_another_process_closed(
    tmp_path: Path, applied: bool
) -> None:
    path = tmp_path / "journal.db"
    SqliteStore.open(path).close()
    store, other = SqliteStore.open(path), SqliteStore.open(path)
    try:
        with trio.fail_after(30):
            async with (
                fake_fleet("sglang", n=2, latency_ms=1500) as fleet,
                gateway_in_process(
                    Config(rl=RlConfig(enabled=True)), store=store, worker_urls=fleet.urls, shared=True
                ) as gw,
            ):
                gw.gateway.control.identity = "gateway:1:stalled"
                answers = []

                async def fan_out() -> None:
                    answers.append(await gw.client.post(FANOUT, json={}))

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(fan_out)
                    while not (started := list(other.read(types=["control.started"]))):
                        await trio.sleep(0.01)
                    op_id = started[0].event.op_id
                    # The recovery lease's holder (another process) closes it: this one looked dead.
                    interrupted = ControlInterrupted(
                        op_id=op_id,
                        reason="gateway_restart",
                        recorded_targets=[],
                        missing_targets=[t["worker_id"] for t in started[0].event.targets],
                    )
                    other.append_batch([Append(f"op:{op_id}", interrupted)])
                    if applied:
                        await gw.writer.catch_up()
                        assert gw.gateway.fleet.operations.open.get(op_id) is None
        stream = [r.event.TYPE for r in other.read(stream=f"op:{op_id}")]
        audits = [r for r in other.read(types=["audit.control_plane"])]
    finally:
        store.close()
        other.close()
    assert stream == ["control.started", "control.interrupted"]  # one close, the other's
    assert answers and answers[0].headers.get("x-smgrl-journal") == "unavailable"
    assert audits  # the request itself is still audited

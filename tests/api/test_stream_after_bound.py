"""``GET /v1/rl/journal/stream?after=N`` with N past SQLite's 64-bit integers (regression).

parse_uint takes up to 20 digits (past 2**63 - 1): such an ``after`` reached ``store.read`` and
SQLite's OverflowError ended the stream right after its ``hello``. ``/v1/rl/journal`` caps it
(past every event); the stream now does the same and stays open, following the journal."""

from __future__ import annotations

import trio
import trio.testing
from asgi_call import AsgiCall
from rl_api_helpers import rl_cfg

from journal import SqliteStore
from smgrl.testing import gateway_in_process


async def test_a_stream_after_past_every_sqlite_integer_stays_open(tmp_path):
    store = SqliteStore.open(str(tmp_path / "journal.db"))
    async with gateway_in_process(rl_cfg(), store=store) as gw, trio.open_nursery() as nursery:
        s = AsgiCall(gw.app, "/v1/rl/journal/stream?after=" + "9" * 20)
        await nursery.start(s.run)
        await s.wait_for(lambda s: b"event: hello" in s.body)
        # Every task blocked: the stream either ended on an error or waits for new records.
        await trio.testing.wait_all_tasks_blocked()
        assert s.status == 200
        assert not s.done.is_set(), s.body
        s.gone.set()
        nursery.cancel_scope.cancel()
    store.close()

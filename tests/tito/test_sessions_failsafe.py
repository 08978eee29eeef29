"""Sessions a client cannot use to stall, bloat or crash the gateway, and that fail safe when the
journal does (in process: the real session service and fronts; fake engines on loopback)."""

from __future__ import annotations

import pytest
import trio
from test_sessions_api import cfg

from journal import MemoryStore
from smgrl.testing import gateway_in_process


@pytest.fixture
def tok(model_dirs):
    from smgrl.fake import model

    with model.tokenizer_scope(model_dirs["chatml"]) as chat:
        yield chat


class FailingStore(MemoryStore):
    """Commits fail while ``down`` is set (a journal outage: a full disk, an unreachable server)."""

    down = False

    def append_batch(self, items, *, wait=None, **kw):
        if self.down:
            raise OSError(28, "No space left on device")
        return super().append_batch(items, wait=wait, **kw)


async def test_a_session_created_during_a_journal_outage_is_503_and_takes_no_slot(tok, model_dirs):
    store = FailingStore()
    config = cfg(model_dirs["chatml"], sessions={"max_sessions": 2})
    with trio.fail_after(20):
        async with gateway_in_process(config, store=store) as gw:
            store.down = True
            for route in ("/sessions", "/tito/sessions", "/sessions", "/tito/sessions"):
                r = await gw.client.post(route)
                assert r.status_code == 503, r.text
                assert r.json()["error"]["code"] == "journal_unavailable"
            assert gw.app.sessions.sessions == {}  # nothing held for an id never answered
            store.down = False
            # The bound is whole again: both slots can be taken, the next is refused.
            for _ in range(2):
                assert (await gw.client.post("/sessions")).status_code == 201
            assert (await gw.client.post("/sessions")).status_code == 429
            created = [r for r in store.read(types=["session.created"])]
            assert len(created) == 2 == len(gw.app.sessions.sessions)

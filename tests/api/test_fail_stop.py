"""Memory and journal agree, or the gateway stops.

A batch that committed but could not be applied to the projections must not leave a gateway
serving state that misses events: the writer stops, the request that wrote it gets 503, the
gateway's task tree ends with ProjectionError, and a restart replays the journal in full.
"""

from __future__ import annotations

import pytest
import trio
from rl_api_helpers import rl_cfg

from journal import MemoryStore, ProjectionError
from smgrl.fake import fake_fleet
from smgrl.history.replay import replay
from smgrl.state.fleet import FleetState
from smgrl.state.registry import RegistryState
from smgrl.testing import gateway_in_process


async def test_a_projection_that_cannot_apply_a_committed_event_stops_the_gateway(monkeypatch):
    store = MemoryStore()
    answers: list[int] = []
    original = RegistryState.apply

    def buggy(self, seq, event):
        if getattr(event, "TYPE", None) == "worker.labels_changed":
            raise RuntimeError("a projection bug")
        return original(self, seq, event)

    with pytest.raises(ExceptionGroup) as raised:
        async with fake_fleet("sglang", 1) as fleet, gateway_in_process(rl_cfg(), store=store) as gw:
            (wid,) = await gw.register(fleet.urls)
            monkeypatch.setattr(RegistryState, "apply", buggy)
            r = await gw.client.patch(f"/workers/{wid}", json={"labels": {"role": "policy"}})
            answers.append(r.status_code)
            with trio.fail_after(10):  # bounded: a gateway that keeps serving fails the test
                await trio.sleep_forever()  # the writer's failure ends the gateway, and this with it
    assert raised.value.subgroup(ProjectionError) is not None
    # The request that wrote the event was not told it worked (503, or no answer at all).
    assert answers in ([], [503])
    monkeypatch.setattr(RegistryState, "apply", original)
    # The journal has the event; a restart folds it.
    (changed,) = [r.event for r in store.read(types=["worker.labels_changed"])]
    fleet_state = FleetState()
    replay(store, fleet_state)
    assert fleet_state.registry.get(changed.worker_id).caller_labels == {"role": "policy"}

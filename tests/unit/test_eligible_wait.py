"""How long a rollout waits for an eligible engine (smgrl/dataplane/waiting.py; docs/data-plane.md).

The data plane's own wait loop on a fleet folded from journal events (no engine, no network), on
trio's autojump clock: time is the subject here. What this guards:

* a fleet that nothing in progress will make eligible (every engine quarantined, or unhealthy)
  answers a retryable 503 after the short default wait, not after the whole request timeout, and
  the 503 names why each engine was held out;
* while a sync is in progress (an engine paused, dispatch paused, a refit saga open) the request
  waits as before, up to its deadline, and goes out as soon as an engine is back;
* a version floor above every engine's version with no sync in progress answers at once
  (``version_floor_unmet``); with a sync in progress it waits for it.
"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.core.errors import NoEligibleWorkers, VersionFloorUnmet
from smgrl.dataplane.request import RolloutRequest
from smgrl.dataplane.service import DataPlane
from smgrl.dataplane.waiting import QUIET_WAIT_SECS
from smgrl.events import (
    EngineStateSet,
    EngineVersionSet,
    RefitStarted,
    WorkerDiscovered,
    WorkerQuarantined,
    WorkerRegistered,
)
from smgrl.registry import KeyRing
from smgrl.routing import parse_floor
from smgrl.state import FleetState
from smgrl.upstream import PoolSet

MODEL = "m"
REQUEST_TIMEOUT = 1800.0


class Fleet:
    def __init__(self, versions: list[str]) -> None:
        self.state = FleetState()
        self.seq = 0
        self.ids = []
        for i, version in enumerate(versions):
            wid, url = f"w{i}", f"http://127.0.0.1:{31000 + i}"
            self.apply(WorkerRegistered(worker_id=wid, url=url, base_url=url, model_id=MODEL, source="api"))
            self.apply(WorkerDiscovered(worker_id=wid, runtime="sglang", labels={}, model_id=MODEL))
            self.apply(
                EngineVersionSet(
                    weight_version=version,
                    targets=[{"worker_id": wid, "url": url, "base_url": url}],
                )
            )
            self.ids.append((wid, url))

    def apply(self, event) -> None:
        self.seq += 1
        self.state.apply_records([_Rec(self.seq, event)])

    def quarantine(self, i: int) -> None:
        wid, url = self.ids[i]
        self.apply(
            WorkerQuarantined(worker_id=wid, base_url=url, reason="refit r: load failed", refit_id="r")
        )

    def set_control(self, i: int, control: str) -> None:
        wid, url = self.ids[i]
        self.apply(EngineStateSet(control=control, targets=[{"worker_id": wid, "url": url, "base_url": url}]))


class _Rec:
    def __init__(self, seq, event) -> None:
        self.seq, self.event, self.ts = seq, event, None


def dataplane(fleet: Fleet, wait: float | None = None) -> DataPlane:
    cfg = Config(
        rl=RlConfig(enabled=True),
        policy="round_robin",
        request_timeout_secs=REQUEST_TIMEOUT,
        dataplane=DataPlaneConfig(eligible_wait_secs=wait),
    )
    return DataPlane(cfg=cfg, fleet=fleet.state, pools=PoolSet(), keys=KeyRing())


async def pick(dp: DataPlane, floor: str | None = None):
    _, wait_until = dp.deadlines()
    req = RolloutRequest(route="/generate", model=MODEL, stream=False, prefix=None)
    return await dp.pick(
        req, MODEL, routing_key=None, wait_until=wait_until, floor=parse_floor(floor) if floor else None
    )


async def test_a_quarantined_fleet_answers_after_the_short_wait_naming_each_engine(autojump_clock):
    fleet = Fleet(["1", "1"])
    fleet.quarantine(0)
    fleet.quarantine(1)
    dp = dataplane(fleet)
    started = trio.current_time()
    with pytest.raises(NoEligibleWorkers) as info:
        await pick(dp)
    waited = trio.current_time() - started
    assert waited == pytest.approx(QUIET_WAIT_SECS) and waited < REQUEST_TIMEOUT
    err = info.value
    assert err.code == "no_eligible_workers" and err.context["reasons"] == {"quarantined": 2}
    assert [(e["worker_id"], e["reason"]) for e in err.context["engines"]] == [
        ("w0", "quarantined"),
        ("w1", "quarantined"),
    ]
    assert "http://127.0.0.1:31000: quarantined" in str(err)


async def test_a_paused_fleet_waits_through_the_sync_and_goes_out_when_an_engine_resumes(autojump_clock):
    fleet = Fleet(["1", "1"])
    fleet.set_control(0, "paused")
    fleet.set_control(1, "paused")
    dp = dataplane(fleet)
    got = []

    async def rollout():
        got.append(await pick(dp))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(rollout)
        await trio.sleep(10 * QUIET_WAIT_SECS)  # a long sync: far past the short wait
        assert got == [] and dp.waiting == 1
        fleet.set_control(1, "active")
    assert got[0].instance.worker_id == "w1"


async def test_the_short_wait_counts_from_the_end_of_the_sync(autojump_clock):
    """A sync that ends with every engine still held out (quarantined by it): the request waits
    only the short wait more, not its whole deadline."""
    fleet = Fleet(["1"])
    fleet.set_control(0, "paused")
    dp = dataplane(fleet)
    started = trio.current_time()

    async def sync_ends_badly():
        await trio.sleep(300)
        fleet.quarantine(0)
        fleet.set_control(0, "active")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sync_ends_badly)
        with pytest.raises(NoEligibleWorkers) as info:
            await pick(dp)
    assert trio.current_time() - started == pytest.approx(300 + QUIET_WAIT_SECS)
    assert info.value.context["reasons"] == {"quarantined": 1}


async def test_an_open_refit_saga_counts_as_a_sync_in_progress(autojump_clock):
    fleet = Fleet(["1"])
    fleet.quarantine(0)
    wid, url = fleet.ids[0]
    plan = {"steps": [{"phase": "pause", "calls": []}]}
    fleet.apply(
        RefitStarted(refit_id="r2", source="disk", weight_version="2", on_failure="quarantine",
            model_path="/x", engines=[{"worker_id": wid, "url": url, "base_url": url, "engine": "sglang",
                                       "pause_mode": "retract", "plan": plan}],
        )
    )  # fmt: skip
    dp = dataplane(fleet)
    with trio.move_on_after(10 * QUIET_WAIT_SECS) as scope:
        await pick(dp)
    assert scope.cancelled_caught  # still waiting: the refit may release it


async def test_a_floor_above_every_engine_with_no_sync_answers_at_once(autojump_clock):
    fleet = Fleet(["3", "5"])
    dp = dataplane(fleet)
    started = trio.current_time()
    with pytest.raises(VersionFloorUnmet) as info:
        await pick(dp, floor="6")
    assert trio.current_time() == started
    err = info.value
    assert err.code == "version_floor_unmet" and err.status == 503
    assert err.context["versions"] == ["3", "5"] and {e["reason"] for e in err.context["engines"]} == {
        "stale"
    }
    assert "x-version-tag 6" in str(err) and "no refit or weight sync is in progress" in str(err)
    # Met by an engine: served at once.
    assert (await pick(dp, floor="5")).instance.worker_id == "w1"


async def test_a_floor_above_every_engine_waits_while_a_sync_is_in_progress(autojump_clock):
    fleet = Fleet(["3", "5"])
    fleet.set_control(1, "paused")  # between its pause and its new version
    dp = dataplane(fleet)
    got = []

    async def rollout():
        got.append(await pick(dp, floor="6"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(rollout)
        await trio.sleep(5 * QUIET_WAIT_SECS)
        assert got == []
        wid, url = fleet.ids[1]
        fleet.apply(
            EngineVersionSet(
                weight_version="6",
                targets=[{"worker_id": wid, "url": url, "base_url": url}],
            )
        )
        fleet.set_control(1, "active")
    assert got[0].instance.worker_id == "w1"


async def test_an_explicit_eligible_wait_bounds_every_wait(autojump_clock):
    fleet = Fleet(["1"])
    fleet.set_control(0, "paused")
    dp = dataplane(fleet, wait=5)
    started = trio.current_time()
    with pytest.raises(NoEligibleWorkers) as info:
        await pick(dp)
    assert trio.current_time() - started == pytest.approx(5)
    assert info.value.context["reasons"] == {"paused": 1}

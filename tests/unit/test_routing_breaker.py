"""Circuit breakers (pure, time injected) and the admission queue."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from smgrl.core.config import BreakerConfig
from smgrl.core.errors import QueueFull, QueueTimeout
from smgrl.dataplane.admission import Admission, default_limit
from smgrl.dataplane.breaker import CLOSED, HALF_OPEN, OPEN, Breaker, Breakers

CFG = BreakerConfig(failure_threshold=3, success_threshold=2, timeout_secs=10, window_secs=5)


def test_failures_inside_the_window_open_the_breaker():
    b = Breaker(CFG)
    b.record(False, 0)
    b.record(False, 1)
    b.record(True, 2)  # successes do not reset a closed breaker's window count
    assert b.state == CLOSED
    b.record(False, 3)
    assert b.state == OPEN and not b.allows(3) and not b.allows(12.9)


def test_failures_outside_the_window_do_not_count():
    b = Breaker(CFG)
    for t in (0, 1, 7, 8):
        b.record(False, t)
    assert b.state == CLOSED  # 0 and 1 fell out of the 5 s window before 8
    b.record(False, 9)
    assert b.state == OPEN


def test_half_open_after_the_timeout_then_closed_or_reopened():
    b = Breaker(CFG)
    for t in (0, 0, 0):
        b.record(False, t)
    assert b.allows(10) and b.state == HALF_OPEN
    b.record(True, 10)
    assert b.state == HALF_OPEN
    b.record(True, 11)
    assert b.state == CLOSED
    for t in (20, 20, 20):
        b.record(False, t)
    assert b.allows(30) and b.state == HALF_OPEN
    b.record(False, 30)
    assert b.state == OPEN and not b.allows(31) and b.reopens_at() == 40


def test_breakers_per_engine_and_disabled():
    bs = Breakers(CFG)
    assert bs.allows("a", 0) and bs.state("a") == CLOSED and bs.by_engine == {}
    bs.record("a", True, 0)
    assert bs.by_engine == {}  # healthy engines cost nothing
    for _ in range(3):
        bs.record("a", False, 1)
    assert bs.state("a") == OPEN and bs.open_count == 1 and not bs.allows("a", 2) and bs.allows("b", 2)
    assert bs.next_reopen(["a", "b"]) == 11
    assert bs.allows("a", 11)
    bs.record("a", True, 11)
    bs.record("a", True, 11)
    assert bs.state("a") == CLOSED and bs.open_count == 0
    off = Breakers(CFG, enabled=False)
    for _ in range(10):
        off.record("a", False, 0)
    assert off.allows("a", 0) and off.by_engine == {}


def test_only_the_engines_a_request_could_use_set_the_wake_up_time_and_removed_ones_are_pruned():
    # An open breaker of an engine the table holds out (or removed) is never consulted,
    # so its reopen time stays in the past: waiting on it returned at once and selection spun.
    bs = Breakers(CFG)
    for url in ("held", "live"):
        for _ in range(3):
            bs.record(url, False, 0 if url == "held" else 5)
    assert bs.next_reopen(["live"]) == 15  # not "held"'s 10, long past at t=12
    assert bs.next_reopen(["other"]) is None
    bs.prune({"live"})
    assert set(bs.by_engine) == {"live"} and bs.open_count == 1
    bs.prune(set())
    assert bs.by_engine == {} and bs.open_count == 0 and bs.allows("live", 6)


def test_default_limit_is_smgs():
    assert default_limit() >= 4096
    assert Admission(-1, 1, 1).limit == default_limit()


async def test_admission_queue_is_fifo_bounded_and_times_out(autojump_clock):
    adm = Admission(limit=1, queue_size=2, queue_timeout=5)
    order = []
    release = trio.Event()

    async def holder():
        async with adm.slot():
            order.append("holder")
            await release.wait()

    async def waiter(name):
        async with adm.slot():
            order.append(name)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(holder)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "w1")
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "w2")
        await trio.testing.wait_all_tasks_blocked()
        assert len(adm.queue) == 2
        with pytest.raises(QueueFull):
            async with adm.slot():
                pass
        release.set()
    assert order == ["holder", "w1", "w2"] and adm.active == 0 and not adm.queue

    async with adm.slot():
        with pytest.raises(QueueTimeout):
            async with adm.slot():
                pass
        assert not adm.queue
    assert adm.active == 0


async def test_a_cancelled_waiter_passes_a_granted_slot_on(autojump_clock):
    adm = Admission(limit=1, queue_size=5, queue_timeout=100)
    got = []
    async with trio.open_nursery() as nursery:
        holder_done = trio.Event()

        async def holder():
            async with adm.slot():
                await holder_done.wait()

        async def waiter(name, scope_box):
            with trio.CancelScope() as scope:
                scope_box.append(scope)
                async with adm.slot():
                    got.append(name)
                    await trio.sleep(1)

        nursery.start_soon(holder)
        await trio.testing.wait_all_tasks_blocked()
        box1, box2 = [], []
        nursery.start_soon(waiter, "w1", box1)
        nursery.start_soon(waiter, "w2", box2)
        await trio.testing.wait_all_tasks_blocked()
        box1[0].cancel()  # w1 leaves the queue before its turn
        await trio.testing.wait_all_tasks_blocked()
        holder_done.set()
    assert got == ["w2"] and adm.active == 0 and not adm.queue


async def test_unlimited_admission():
    adm = Admission(limit=0, queue_size=0, queue_timeout=0)
    async with adm.slot(), adm.slot():
        assert adm.active == 0

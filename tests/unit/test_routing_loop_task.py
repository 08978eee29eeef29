"""The routing loop's task (smgrl.runtime.routing_loop) over its queues, on trio's autojump clock:
turns per pass bounded by the batch size, each turn after the previous attempt ended, the check
interval only for requests held out by answers no event announces, and a left request skipped."""

from __future__ import annotations

import trio

from smgrl.core.config import RoutingLoopConfig
from smgrl.dataplane import DispatchQueues, Turn
from smgrl.routing import QueueFacts
from smgrl.runtime.routing_loop import one_pass, run_routing_loop


class Requests:
    """Requests as the data plane's pick runs them: wait for a turn, attempt, wait again."""

    def __init__(self, queues: DispatchQueues, capacity: int = 0) -> None:
        self.queues = queues
        self.capacity = capacity
        self.grants: list[str] = []
        self.taken: list[str] = []

    async def run(self, name: str, *, tried: bool, recheck: bool = False, facts: QueueFacts | None = None):
        queues, turn = self.queues, Turn()
        facts = facts or QueueFacts()
        queues.wait_again(turn, "m", facts, tried=tried, recheck=recheck)
        try:
            while True:
                await turn.go.wait()
                self.grants.append(name)
                await trio.sleep(0.001)  # the attempt spans a checkpoint (PSManager, the hook)
                if self.capacity > 0:
                    self.capacity -= 1
                    self.taken.append(name)
                    queues.attempt_done(turn)
                    return
                queues.wait_again(turn, "m", facts, tried=True, recheck=recheck)
        finally:
            queues.leave(turn)


async def test_one_pass_hands_out_at_most_the_batch_size_in_order(autojump_clock):
    queues = DispatchQueues(RoutingLoopConfig(dispatch_batch_size=2, sort_key="small_id"))
    reqs = Requests(queues, capacity=10)
    async with trio.open_nursery() as nursery:
        for rid in ("5", "1", "4", "2", "3"):
            nursery.start_soon(lambda r=rid: reqs.run(r, tried=False, facts=QueueFacts(request_id=r)))
        await trio.testing.wait_all_tasks_blocked()
        assert await one_pass(queues, 2) == 2
        assert reqs.taken == ["1", "2"] and len(queues) == 3
        assert await one_pass(queues, 2) == 2
        assert await one_pass(queues, 2) == 1
        assert reqs.taken == ["1", "2", "3", "4", "5"] and len(queues) == 0


async def test_each_turn_waits_for_the_previous_attempt(autojump_clock):
    queues = DispatchQueues(RoutingLoopConfig())
    reqs = Requests(queues, capacity=1)
    async with trio.open_nursery() as nursery:
        for name in ("a", "b", "c"):
            nursery.start_soon(lambda n=name: reqs.run(n, tried=False))
            await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(run_routing_loop, queues)
        await trio.sleep(1)
        # One instance slot: a took it; b and c were each handed a turn once and wait for a
        # change (no check interval for them: nothing they wait on changes silently).
        assert reqs.taken == ["a"] and reqs.grants == ["a", "b", "c"]
        reqs.capacity = 1
        queues.change()
        await trio.sleep(1)
        assert reqs.taken == ["a", "b"] and reqs.grants == ["a", "b", "c", "b", "c"]
        nursery.cancel_scope.cancel()


async def test_the_check_interval_re_asks_only_requests_that_need_it(autojump_clock):
    queues = DispatchQueues(RoutingLoopConfig(check_interval_secs=0.1))
    reqs = Requests(queues)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_routing_loop, queues)
        nursery.start_soon(lambda: reqs.run("psm", tried=True, recheck=True))  # PSManager said no
        nursery.start_soon(lambda: reqs.run("paused", tried=True))  # waits for a resume event
        await trio.sleep(1.05)
        assert 9 <= reqs.grants.count("psm") <= 11
        assert reqs.grants.count("paused") == 0
        nursery.cancel_scope.cancel()


async def test_nothing_waiting_for_events_wakes_the_loop_on_a_timer(autojump_clock):
    queues = DispatchQueues(RoutingLoopConfig(check_interval_secs=0.01))
    reqs = Requests(queues)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_routing_loop, queues)
        for i in range(100):
            nursery.start_soon(lambda i=i: reqs.run(str(i), tried=True))  # a paused dispatch
        await trio.sleep(60)
        assert reqs.grants == [] and queues.turns == 0
        nursery.cancel_scope.cancel()


async def test_a_request_that_left_is_not_handed_a_turn(autojump_clock):
    queues = DispatchQueues(RoutingLoopConfig())
    reqs = Requests(queues, capacity=5)
    async with trio.open_nursery() as nursery:
        scopes = {}
        for name in ("a", "b"):
            scopes[name] = trio.CancelScope()

            async def one(n=name) -> None:
                with scopes[n]:
                    await reqs.run(n, tried=False, facts=QueueFacts(input_len=ord(n)))

            nursery.start_soon(one)
        await trio.testing.wait_all_tasks_blocked()
        scopes["a"].cancel()  # its client left while queued
        await trio.testing.wait_all_tasks_blocked()
        assert len(queues) == 1
        with trio.fail_after(1):  # a left turn would hold the pass for ATTEMPT_BOUND_SECS
            assert await one_pass(queues, 10) == 1
        assert reqs.taken == ["b"]

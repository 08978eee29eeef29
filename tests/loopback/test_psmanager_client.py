"""smgrl's PSManager client against the grpcio fake: every RPC of the fork's ``.proto`` carries its
fields both ways, failures and a slow PSManager end within the bound as PSManagerError, and the
checked-in messages are what the regeneration script makes from the fork's file."""

from __future__ import annotations

import hashlib

import grpc
import pytest
import trio

from smgrl.fake.psmanager import FakePSManager
from smgrl.upstream.psmanager import regen
from smgrl.upstream.psmanager.client import (
    InvalidPsManagerAddress,
    PSManager,
    PSManagerError,
    parse_ps_manager_addr,
)


@pytest.fixture
def fake():
    server = FakePSManager().start()
    yield server
    server.stop()


def test_checked_in_messages_match_the_generator():
    assert regen.main(["--check"]) == 0
    assert hashlib.sha256(regen.ORIGINAL.read_bytes()).hexdigest() == regen.SOURCE_SHA256


@pytest.mark.parametrize(
    ("addr", "parsed"),
    [("10.0.0.1:50051", ("10.0.0.1", 50051)), ("grpc://h:1", ("h", 1)), ("http://[::1]:7", ("::1", 7))],
)
def test_addresses_as_the_fork_accepts_them(addr, parsed):
    assert parse_ps_manager_addr(addr) == parsed


@pytest.mark.parametrize("addr", ["https://h:1", "h", "h:x", "h:1/path"])
def test_bad_addresses_are_refused(addr):
    with pytest.raises(InvalidPsManagerAddress):
        parse_ps_manager_addr(addr)


async def test_every_rpc_round_trips(fake):
    psm = PSManager(fake.addr, timeout_secs=5)
    s = fake.script
    s.reservable, s.indicators, s.aborted = {2}, {1: 0.25}, {7}
    s.instance_versions[("w", 1)] = 9
    try:
        assert await psm.can_reserve([5], [1, 2], [True]) == [False, True]
        (req,) = fake.calls("CanReserveRequest")
        assert (list(req.request_ids), list(req.model_versions), list(req.is_validate)) == (
            [5],
            [1, 2],
            [True],
        )
        assert await psm.reserve_indicator(5, [1, 2], False) == [0.25, 0.0]
        assert await psm.reserve(("w", 1), 5, 2, True) == (True, "")
        (req,) = fake.calls("ReserveRolloutInstanceRequests")
        assert (req.rollout_instance_ids[0].worker_id, req.rollout_instance_ids[0].dp_rank) == ("w", 1)
        assert (list(req.request_ids), list(req.model_versions), req.is_validate) == ([5], [2], True)
        assert await psm.update_instance(5, ("w", 0), False) is True
        assert await psm.update_version_tag(5, 3, False) is True
        assert await psm.check_aborted([7, 8]) == [True, False]
        assert await psm.check_aborted([7]) == [False]  # remove=True consumed it
        assert await psm.check_aborted_versions([1]) == [False]
        assert await psm.instance_version(("w", 1)) == 9
        assert await psm.update_status([5], "completed", [2], [("w", 1)], False) == [True]
    finally:
        await psm.aclose()


async def test_a_failing_slow_or_absent_psmanager_is_an_error_within_the_bound(fake):
    fake.script.fail = grpc.StatusCode.UNAVAILABLE
    # A bound far above a loopback call's cost: on a loaded machine the first call (a new
    # connection to the fake) can take longer than the 0.5 s bound the slow case tests.
    failing = PSManager(fake.addr, timeout_secs=30.0)
    with pytest.raises(PSManagerError, match="UNAVAILABLE"):
        await failing.check_aborted([1])
    await failing.aclose()
    psm = PSManager(fake.addr, timeout_secs=0.5)
    fake.script.fail, fake.script.delay_secs = None, 5.0
    started = trio.current_time()
    with pytest.raises(PSManagerError, match="DEADLINE_EXCEEDED"):
        await psm.can_reserve([1], [0], [False])
    assert trio.current_time() - started < 2.0
    await psm.aclose()
    fake.stop()
    down = PSManager(fake.addr, timeout_secs=0.5)
    with pytest.raises(PSManagerError):
        await down.check_aborted([1])
    await down.aclose()

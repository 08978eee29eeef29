"""The admission hook (--admission-hook module:object): refused instances are skipped,
a request every instance refuses waits, reservations are given back exactly once."""

from __future__ import annotations

import sys
from collections import Counter

import attrs
import pytest
import trio

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.core.errors import ConfigError
from smgrl.dataplane.hook import HookError, Refusal, resolve
from smgrl.fake import fake_fleet
from smgrl.runtime.startup import validate
from smgrl.testing import gateway_in_process

GEN = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 3}}


def cfg(wait: float | None = 0) -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        dataplane=DataPlaneConfig(eligible_wait_secs=wait),
    )


class Hook:
    """Refuses the workers in ``refuse``; at most ``capacity`` reservations at once."""

    def __init__(self, refuse=(), capacity: int = 1 << 30, fail: bool = False) -> None:
        self.refuse = set(refuse)
        self.capacity = capacity
        self.fail = fail
        self.held: set[int] = set()
        self.peak = 0
        self.requests = []
        self.released: list[int] = []
        self._n = 0

    async def reserve(self, instance, request):
        self.requests.append((instance, request))
        if self.fail:
            raise RuntimeError("capacity service down")
        if instance.worker in self.refuse or len(self.held) >= self.capacity:
            return Refusal("full")
        self._n += 1
        self.held.add(self._n)
        self.peak = max(self.peak, len(self.held))
        return self._n

    async def release(self, reservation):
        self.held.remove(reservation)  # a double release would raise here
        self.released.append(reservation)


async def test_refused_instances_are_skipped_and_every_reservation_is_released():
    async with (
        fake_fleet("sglang", n=3) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        ids = [gw.gateway.fleet.registry.id_for_url(u) for u in fleet.urls]
        hook = gw.app.dataplane.hook = Hook(refuse={ids[0]})
        served = Counter()
        for _ in range(6):
            r = await gw.client.post(
                "/generate",
                json=GEN,
                headers={"x-request-id": "r1", "x-prompt-id": "g", "x-is-validate": "1"},
            )
            assert r.status_code == 200, r.text
            served[r.headers["x-smgrl-worker-id"]] += 1
        assert ids[0] not in served and sum(served.values()) == 6
        assert not hook.held and len(hook.released) == 6
        _, request = hook.requests[-1]
        assert (request.request_id, request.prompt_id, request.is_validate, request.route) == (
            "r1",
            "g",
            True,
            "/generate",
        )


async def test_when_every_instance_refuses_the_request_waits_for_a_release():
    async with (
        fake_fleet("sglang", n=2, token_latency_ms=5) as fleet,
        gateway_in_process(cfg(wait=30), worker_urls=fleet.urls) as gw,
    ):
        hook = gw.app.dataplane.hook = Hook(capacity=1)
        codes = []

        async def one():
            body = {**GEN, "sampling_params": {"max_new_tokens": 10}}
            codes.append((await gw.client.post("/generate", json=body)).status_code)

        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(one)
        assert codes == [200, 200, 200]
        assert hook.peak == 1 and not hook.held and len(hook.released) == 3


async def test_a_failing_hook_refuses_and_the_answer_names_it():
    async with (
        fake_fleet("sglang", n=2) as fleet,
        gateway_in_process(cfg(wait=0), worker_urls=fleet.urls) as gw,
    ):
        gw.app.dataplane.hook = Hook(fail=True)
        r = await gw.client.post("/generate", json=GEN, headers={"x-prompt-id": "g"})
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "no_eligible_workers"
        assert r.json()["error"]["reasons"] == {"refused": 2}
        assert not fleet.engines[0].calls_to("/generate") and not fleet.engines[1].calls_to("/generate")


def test_resolve_loads_module_object_and_refuses_bad_specs(tmp_path, monkeypatch):
    (tmp_path / "my_capacity.py").write_text(
        "class Hook:\n"
        "    async def reserve(self, instance, request):\n        return 1\n"
        "    async def release(self, reservation):\n        pass\n"
        "class Sync:\n"
        "    def reserve(self, instance, request):\n        return 1\n"
        "    async def release(self, reservation):\n        pass\n"
        "hook = Hook()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert type(resolve("my_capacity:Hook")).__name__ == "Hook"  # a class is instantiated
    assert resolve("my_capacity:hook") is sys.modules["my_capacity"].hook
    for spec, words in [
        ("my_capacity", "expected module:object"),
        ("no_such_module_xyz:Hook", "cannot import"),
        ("my_capacity:Missing", "has no `Missing`"),
        ("my_capacity:Sync", "`reserve` must be an async method"),
    ]:
        with pytest.raises(HookError, match=words):
            resolve(spec)
        bad = attrs.evolve(cfg(), dataplane=DataPlaneConfig(admission_hook=spec))
        with pytest.raises(ConfigError, match="--admission-hook"):
            validate(bad)

#!/usr/bin/env python3
"""What a prompt-group pin costs when gateways share a journal (docs/scale-out.md, "Prompt-group
pins"): CPU per request and per group, A/B in one process, interleaved.

Everything runs in this process (one trio loop): in-process fake SGLang engines, and either a
lone gateway (pins in memory: the baseline) or two gateways on one SQLite journal, both following
it (``shared``: each group's pin is a conditional append, its release rides with the next one,
and the other gateway folds both, as a second ``--workers`` process would). Requests go to the
first gateway in groups of ``--group-size`` running together (``x-prompt-id``), and the process's
CPU time (``time.process_time``: client, fakes and both gateways alike) is divided by the
requests; the difference between the modes is what pins cost, the other gateway's tail
included. Rounds alternate the modes, so a busy machine weighs on both alike.

    python benchmarks/pins.py [--groups 200] [--group-size 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from journal import ChangeWatcher, SqliteStore
from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.fake import fake_fleet
from smgrl.testing import gateway_in_process

GEN = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}


def cfg() -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        dataplane=DataPlaneConfig(eligible_wait_secs=0),
    )


async def load(gw, groups: int, size: int, tag: str) -> tuple[float, int]:
    """``groups`` groups of ``size`` concurrent requests, one group after another; CPU seconds."""
    cpu0 = time.process_time()
    for g in range(groups):
        headers = {"x-prompt-id": f"{tag}-{g}"}
        async with trio.open_nursery() as nursery:
            for _ in range(size):
                nursery.start_soon(functools.partial(gw.client.post, "/generate", json=GEN, headers=headers))
    return time.process_time() - cpu0, groups * size


async def run(args) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"lone": [], "shared": []}
    with tempfile.TemporaryDirectory(prefix="smgrl-bench-pins-") as tmp:
        async with fake_fleet("sglang", n=4) as engines:
            path = os.path.join(tmp, "j.db")
            with SqliteStore.open(path) as store_a, SqliteStore.open(path) as store_b:
                async with (
                    gateway_in_process(cfg(), worker_urls=engines.urls) as lone,
                    gateway_in_process(cfg(), store=store_a, worker_urls=engines.urls, shared=True) as a,
                    gateway_in_process(cfg(), store=store_b, shared=True) as b,
                    trio.open_nursery() as tails,
                ):
                    tails.start_soon(a.writer.follow, ChangeWatcher(store_a))
                    tails.start_soon(b.writer.follow, ChangeWatcher(store_b))
                    await b.writer.catch_up()
                    await load(lone, 10, args.group_size, "warm")
                    await load(a, 10, args.group_size, "warm")
                    for r in range(args.rounds):
                        for mode, gw in (
                            (("lone", lone), ("shared", a)) if r % 2 == 0 else (("shared", a), ("lone", lone))
                        ):
                            cpu, n = await load(gw, args.groups, args.group_size, f"{mode}-{r}")
                            out[mode].append(cpu / n * 1e6)
                            print(f"round {r} {mode:6s} {cpu / n * 1e6:7.0f} us CPU/request", flush=True)
                    pins = a.gateway.dataplane.pins
                    out["decided"] = [pins.decided]
                    out["commits"] = [a.writer.commits]
                    tails.cancel_scope.cancel()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=200)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    out = trio.run(run, args)
    lone, shared = statistics.median(out["lone"]), statistics.median(out["shared"])
    per_request = shared - lone
    print(
        f"median CPU/request: lone {lone:.0f} us, shared {shared:.0f} us; pins cost {per_request:+.0f} us"
        f" per request, {per_request * args.group_size:+.0f} us per group of {args.group_size}"
        f" (pins decided: {out['decided'][0]}, journal commits of the deciding gateway: {out['commits'][0]})"
    )


if __name__ == "__main__":
    main()

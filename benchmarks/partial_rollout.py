#!/usr/bin/env python3
"""Partial-rollout loopback: useful decoded tokens per second with a weight sync
every few seconds, with loopback versus without, and the staged selection's cost.

1. **Throughput.** In one trio process: E fake SGLang engines (``--token-latency-ms`` per
   token) and a gateway (in process, the shipped raw ASGI data plane over the real upstream
   pool), C rollout clients sending ``/generate`` with ``input_ids`` (``max_new_tokens`` T,
   ``ignore_eos``) for D seconds, and a trainer that sends ``update_weight_version`` (SGLang
   aborts every running request by default) through the gateway every S seconds.
   * ``loopback``: ``--max-loopbacks 8``; every rollout completes, no decoded token is thrown
     away;
   * ``no loopback``: ``--max-loopbacks 0``; an aborted rollout's tokens are thrown away and
     the client sends it again (what a trainer does without the gateway's help).
   Reported: rollouts completed, useful tokens per second (tokens of completed rollouts),
   tokens the engines decoded, and the wasted share.
2. **Selection cost.** ``smgrl.routing.staged.select`` over 256 instances (a prompt group pin,
   a version floor, 4 versions) versus the plain policy's pick over the same 256, p50/p99 per
   call (``time.perf_counter_ns``), cache_aware and round_robin.

Everything listens on 127.0.0.1 (ephemeral ports); every loop is bounded by a deadline or a
count. Numbers depend on the machine's load: run it twice and report ranges.

    python benchmarks/partial_rollout.py [--engines 2] [--clients 16] [--tokens 64]
        [--duration 6] [--sync-every 1.0] [--token-latency-ms 2] [--calls 20000]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.dataplane.table import Entry
from smgrl.fake import fake_fleet
from smgrl.routing import staged
from smgrl.routing.instance import Instance
from smgrl.routing.metadata import InstanceId
from smgrl.routing.policy import make_policy
from smgrl.testing import gateway_in_process


async def throughput(args, loopback: bool) -> dict:
    cfg = Config(
        rl=RlConfig(enabled=True, control_timeout_secs=30),
        policy="round_robin",
        request_timeout_secs=120,
        dataplane=DataPlaneConfig(max_loopbacks=8 if loopback else 0),
    )
    stats = {"completed": 0, "useful": 0, "aborted": 0, "wasted": 0, "syncs": 0}
    async with (
        fake_fleet("sglang", n=args.engines, token_latency_ms=args.token_latency_ms) as fleet,
        gateway_in_process(cfg, worker_urls=fleet.urls) as gw,
    ):
        deadline = trio.current_time() + args.duration

        async def client(i: int) -> None:
            body = {
                "input_ids": [3000 + i, 1, 2, 3],
                "sampling_params": {"max_new_tokens": args.tokens, "ignore_eos": True},
            }
            while trio.current_time() < deadline:
                r = await gw.client.post("/generate", json=body)
                out = r.json()
                if out["meta_info"]["finish_reason"]["type"] == "length":
                    stats["completed"] += 1
                    stats["useful"] += len(out["output_ids"])
                else:
                    stats["aborted"] += 1  # thrown away: sent again
                    stats["wasted"] += len(out["output_ids"])

        async def trainer() -> None:
            k = 0
            while trio.current_time() + args.sync_every < deadline:
                await trio.sleep(args.sync_every)
                k += 1
                r = await gw.client.post(
                    "/v1/rl/engine/update_weight_version",
                    params={"selector": "engine=sglang"},
                    json={"new_version": str(k)},
                )
                assert r.status_code == 200, r.text
                stats["syncs"] += 1

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trainer)
            for i in range(args.clients):
                nursery.start_soon(client, i)
        wall = trio.current_time() - started
    stats["wall"] = wall
    stats["tokens_per_s"] = stats["useful"] / wall
    return stats


def _timed(call, calls: int) -> tuple[float, float]:
    times = []
    for i in range(calls):
        t = time.perf_counter_ns()
        call(i)
        times.append(time.perf_counter_ns() - t)
    times.sort()
    return times[len(times) // 2] / 1000, times[int(len(times) * 0.99)] / 1000


def _cost_of(policy_name: str, calls: int) -> dict:
    rng = random.Random(1)
    entries = []
    for n in range(256):  # 32 engines x 8 DP ranks, 4 versions
        engine = f"e{n // 8}"
        inst = Instance(f"w{n}", f"http://{engine}@{n % 8}", f"http://{engine}", engine, n % 8, "m", None)
        entries.append(Entry(inst, None, str(10 + n % 4), "active"))
    policy = make_policy(policy_name, rng)
    loads = {e.instance.worker_id: rng.randrange(4) for e in entries}
    prompts = [tuple(rng.randrange(1000) for _ in range(64)) for _ in range(64)]
    by_instance = {e.instance: e for e in entries}
    instances = [e.instance for e in entries]

    def plain(i: int):
        return by_instance[policy.select(instances, loads, prompts[i % 64], 0.0)]

    def staged_pick(i: int, pinned: bool):
        prefix = prompts[i % 64]
        return staged.select(
            entries,
            floor=None,
            hint=None,
            group_pin=InstanceId(f"e{i % 32}", i % 8) if pinned else None,
            refused=(),
            choose=lambda group: by_instance[policy.select([e.instance for e in group], loads, prefix, 0.0)],
        ).chosen

    return {
        "plain": _timed(plain, calls),
        "staged (no pin)": _timed(lambda i: staged_pick(i, False), calls),
        "staged (group pin)": _timed(lambda i: staged_pick(i, True), calls),
    }


def selection_cost(args) -> dict:
    out = {}
    for policy_name in ("round_robin", "cache_aware"):
        for name, cost in _cost_of(policy_name, args.calls).items():
            out[(policy_name, name)] = cost
    return out


async def main_async(args) -> None:
    print(
        f"throughput: {args.engines} engines, {args.clients} clients, {args.tokens} tokens per rollout, "
        f"{args.token_latency_ms:g} ms/token, a sync every {args.sync_every:g}s for {args.duration:g}s"
    )
    print(
        "| mode | syncs | rollouts completed | aborted (thrown away) | tokens thrown away | useful tokens/s |"
    )
    print("|---|---|---|---|---|---|")
    results = {}
    for loopback in (False, True):
        s = await throughput(args, loopback)
        results[loopback] = s
        name = "loopback" if loopback else "no loopback"
        print(
            f"| {name} | {s['syncs']} | {s['completed']} | {s['aborted']} | {s['wasted']} "
            f"| {s['tokens_per_s']:,.0f} |"
        )
    gain = results[True]["tokens_per_s"] / max(results[False]["tokens_per_s"], 1e-9)
    print(f"gain: {gain:.2f}x useful tokens per second with loopback")


# argparse flags shaped like the other benchmarks' (each benchmark its own knobs).
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", type=int, default=2)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--sync-every", type=float, default=1.0)
    ap.add_argument("--token-latency-ms", type=float, default=2.0)
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    trio.run(main_async, args)
    print(f"\nselection cost over 256 instances ({args.calls} calls each), microseconds per call:")
    print("| policy | selection | p50 us | p99 us |")
    print("|---|---|---|---|")
    for (policy, name), (p50, p99) in selection_cost(args).items():
        print(f"| {policy} | {name} | {p50:.1f} | {p99:.1f} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The gRPC client's own cost: Generate stream messages decoded per client CPU-second.

Sources (each its own process, on 127.0.0.1):

* ``replay``: benchmarks/grpc_replay_source.py answers every call with the same pre-encoded
  stream (``--messages`` SGLang chunks then OK): the client, not the server, is the limit;
* ``fake``: ``smgrl fake-engine --kind sglang --grpc`` (grpcio's server, the fake model; it
  cannot feed more than some 17k messages/s on a 2-core machine, so its rows say more about
  wall time than about the client).

Clients (each run in a fresh process so its CPU time is its own, ``time.process_time``, which
counts every thread, grpcio's core threads included): ``smgrl`` (smgrl.upstream.grpc on trio)
and ``grpcio`` (grpcio's asyncio client, ``grpc.aio``; the benchmark is the only place asyncio
runs). Each runs ``--streams`` concurrent Generate streams (default 256) for ``--rounds``
rounds after one warm-up round, every message parsed into a GenerateResponse.

    python benchmarks/grpc_client.py [--streams 256] [--messages 200] [--rounds 4] [--out FILE]
    python benchmarks/grpc_client.py --profile      # cProfile of the smgrl client on replay
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PATH = "/sglang.grpc.scheduler.SglangScheduler/Generate"


def request(messages: int):
    from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

    return pb.GenerateRequest(
        request_id="bench",
        tokenized=pb.TokenizedInput(input_ids=list(range(12))),
        sampling_params=pb.SamplingParams(max_new_tokens=messages, ignore_eos=True),
        stream=True,
    )


def run_smgrl(port: int, streams: int, rounds: int, messages: int) -> dict:
    import trio
    from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

    from smgrl.upstream.grpc import Channel

    req = request(messages)

    async def main():
        ch = Channel("127.0.0.1", port, max_message_bytes=1 << 20)
        counts = [0]

        async def one():
            n = 0
            async with ch.server_stream(PATH, req, pb.GenerateResponse, timeout=120) as s:
                async for _ in s:
                    n += 1
            counts[0] += n

        async def round_():
            async with trio.open_nursery() as nursery:
                for _ in range(streams):
                    nursery.start_soon(one)

        await round_()  # warm-up: connection, first allocations
        counts[0] = 0
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(rounds):
            await round_()
        result = {
            "messages": counts[0],
            "cpu_s": time.process_time() - cpu,
            "wall_s": time.perf_counter() - wall,
        }
        await ch.aclose()
        return result

    return trio.run(main)


def run_grpcio(port: int, streams: int, rounds: int, messages: int) -> dict:
    import asyncio

    import grpc
    from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb

    req = request(messages)

    async def main():
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_stream(
                PATH, pb.GenerateRequest.SerializeToString, pb.GenerateResponse.FromString
            )
            counts = [0]

            async def one():
                n = 0
                async for _ in call(req, timeout=120):
                    n += 1
                counts[0] += n

            async def round_():
                await asyncio.gather(*(one() for _ in range(streams)))

            await round_()
            counts[0] = 0
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(rounds):
                await round_()
            return {
                "messages": counts[0],
                "cpu_s": time.process_time() - cpu,
                "wall_s": time.perf_counter() - wall,
            }

    return asyncio.run(main())


def start_replay(messages: int) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "grpc_replay_source.py"), "--messages", str(messages)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    return proc, int(proc.stdout.readline())


def start_fake() -> tuple[subprocess.Popen, int]:
    smgrl = os.path.join(os.path.dirname(sys.executable), "smgrl")
    proc = subprocess.Popen(
        [smgrl, "fake-engine", "--kind", "sglang", "--grpc"], stdout=subprocess.PIPE, text=True
    )
    line = json.loads(proc.stdout.readline())
    return proc, int(line["urls"][0].rsplit(":", 1)[1])


def stop(proc: subprocess.Popen) -> None:
    if proc.stdin:
        proc.stdin.close()
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def client(name: str, port: int, args) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--client", name, "--port", str(port), "--streams", str(args.streams),
         "--rounds", str(args.rounds), "--messages", str(args.messages)],
        capture_output=True, text=True, check=True, timeout=900,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--fake-rounds", type=int, default=1)
    parser.add_argument("--client", choices=["smgrl", "grpcio"])
    parser.add_argument("--port", type=int)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    runners = {"smgrl": run_smgrl, "grpcio": run_grpcio}
    if args.client:
        print(json.dumps(runners[args.client](args.port, args.streams, args.rounds, args.messages)))
        return
    if args.profile:
        # benchmarks/profile.py would shadow the standard library's profile module.
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
        import cProfile
        import pstats

        proc, port = start_replay(args.messages)
        try:
            cProfile.runctx(
                "run_smgrl(port, args.streams, args.rounds, args.messages)",
                globals(),
                locals(),
                "/tmp/grpc.prof",
            )
        finally:
            stop(proc)
        pstats.Stats("/tmp/grpc.prof").sort_stats("tottime").print_stats(25)
        return
    rows = []
    for source, start, rounds in (("replay", lambda: start_replay(args.messages), args.rounds),
                                  ("fake", start_fake, args.fake_rounds)):  # fmt: skip
        proc, port = start()
        try:
            for name in ("smgrl", "grpcio"):
                r = client(name, port, argparse.Namespace(**{**vars(args), "rounds": rounds}))
                rows.append({"source": source, "client": name, **r,
                             "msg_per_cpu_s": r["messages"] / r["cpu_s"], "msg_per_s": r["messages"] / r["wall_s"]})  # fmt: skip
        finally:
            stop(proc)
    lines = [
        f"gRPC client, {args.streams} concurrent Generate streams x {args.messages} messages",
        "| source | client | messages | client CPU s | msg / client CPU-s | msg / s (wall) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['source']} | {r['client']} | {r['messages']} | {r['cpu_s']:.2f} | "
                     f"{r['msg_per_cpu_s']:,.0f} | {r['msg_per_s']:,.0f} |")  # fmt: skip
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()

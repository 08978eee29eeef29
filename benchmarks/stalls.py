#!/usr/bin/env python3
"""Event-loop stalls: the longest single trio task step while one session turn with a large prompt
(``--mb`` megabytes of message text) is served, and which task ran it.

    python benchmarks/stalls.py [--mb 1 4]

One gateway in process with ``--tokenizer-path`` (the in-process test tokenizer) and one fake
SGLang engine (real loopback socket, context length raised so the prompt is accepted); a trio
instrument times every task step and keeps the longest per task name, plus the longest gap of a
10 ms heartbeat task. The fake engine runs on the same loop: its own steps are listed too, apart.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

import trio

from smgrl.core.config import Config, SessionsConfig
from smgrl.fake import fake_fleet, model
from smgrl.testing import gateway_in_process
from smgrl.tito.testkit import make_model_dir

WORDS = ["the", "file", "read", "list", "run", "test", "error", "line", "code", "def"]


class Sampler:
    """A thread that, while the heartbeat is late by over 50 ms, samples the loop thread's stack
    (the innermost smgrl/journal frames): who runs on the loop during a stall."""

    def __init__(self) -> None:
        self.beat = time.perf_counter()
        self.loop_thread = threading.get_ident()
        self.hits: collections.Counter = collections.Counter()
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.005):
            if time.perf_counter() - self.beat < 0.05:
                continue
            frame = sys._current_frames().get(self.loop_thread)
            names = []
            while frame is not None and len(names) < 3:
                f = frame.f_code.co_filename
                if "/smgrl/" in f or "/journal/" in f:
                    names.append(
                        f"{f.rsplit('/', 2)[-2]}/{Path(f).name}:{frame.f_lineno} {frame.f_code.co_name}"
                    )
                frame = frame.f_back
            self.hits[" < ".join(names) or "-"] += 1


class Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.worst: dict[str, float] = {}
        self._t: float | None = None

    def before_task_step(self, task) -> None:
        self._t = time.perf_counter()

    def after_task_step(self, task) -> None:
        if self._t is None:  # the step that added the instrument
            return
        d = time.perf_counter() - self._t
        if d > self.worst.get(task.name, 0.0):
            self.worst[task.name] = d


def text(mb: float) -> str:
    rnd = random.Random(1)
    n = int(mb * 1_000_000) // 5
    return " ".join(rnd.choice(WORDS) for _ in range(n))


async def one(model_dir, mb: float) -> dict:
    cfg = Config(policy="round_robin", sessions=SessionsConfig(tokenizer_path=str(model_dir)))
    content = text(mb)
    with model.tokenizer_scope(model_dir):
        async with (
            fake_fleet("sglang", n=1, context_length=10_000_000) as fleet,
            gateway_in_process(cfg, worker_urls=fleet.urls) as gw,
        ):
            steps = Steps()
            gap = [0.0]
            done = trio.Event()

            sampler = Sampler()
            watcher = threading.Thread(target=sampler.run, daemon=True)
            watcher.start()

            async def heartbeat():
                last = time.perf_counter()
                while not done.is_set():
                    await trio.sleep(0.01)
                    now = sampler.beat = time.perf_counter()
                    gap[0] = max(gap[0], now - last - 0.01)
                    last = now

            body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8}
            t0 = time.perf_counter()
            trio.lowlevel.add_instrument(steps)
            async with trio.open_nursery() as n:
                n.start_soon(heartbeat)
                r = await gw.client.post(
                    "/v1/chat/completions", json=body, headers={"x-smg-tito-session-id": f"stall-{mb}"}
                )
                done.set()
            trio.lowlevel.remove_instrument(steps)
            sampler.stop.set()
            watcher.join()
            assert r.status_code == 200, r.text[:300]
            worst = sorted(steps.worst.items(), key=lambda kv: -kv[1])[:6]
            return {
                "mb": mb,
                "turn_s": round(time.perf_counter() - t0, 2),
                "heartbeat_max_gap_s": round(gap[0], 3),
                "longest_steps": [(name.rsplit(".", 1)[-1][:60], round(d, 3)) for name, d in worst],
                "stall_samples_5ms": sampler.hits.most_common(8),
            }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, nargs="+", default=[1.0, 4.0])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir(Path(tmp) / "tok")
        for mb in args.mb:
            print(trio.run(one, model_dir, mb))


if __name__ == "__main__":
    main()

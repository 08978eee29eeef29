#!/usr/bin/env python3
"""Event-loop stalls: the worst ``GET /health`` latency, the longest heartbeat gap and the longest
single trio task step while one hostile request of ``--mb`` megabytes is served, per shape:

* ``content``, ``tool-description``, ``tool-arguments``: a session turn whose text is in the
  message content, in a tool's description, in a tool call's arguments;
* ``deep-json``: a turn body nested ``--mb`` million levels deep;
* ``workers-invalid``, ``workers-valid-large``: a ``POST /workers`` body invalid only at its end,
  and a valid one carrying a large label;
* ``session-snapshot``: ``GET /sessions/{id}`` of a session whose captured token ids make a
  snapshot of about ``--mb`` MB.

    python benchmarks/stalls.py [--mb 1 8] [--shape content deep-json ...] [--gc-tuned]

One gateway in process with ``--tokenizer-path`` (the in-process test tokenizer) and one fake
SGLang engine in a process of its own (real loopback socket; a prompt longer than its context is
refused after the gateway prepared and sent it, which is the work measured); a trio
instrument times every task step and keeps the longest per task name, plus the longest gap of a
10 ms heartbeat task, and a ``gc.callbacks`` timer the longest garbage collection of each
generation (the collector holds the GIL: a full collection stalls the loop for as long as it
walks every tracked container alive).
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
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
from smgrl.demo.procs import start_fake_engines
from smgrl.testing import gateway_in_process
from smgrl.tito.ids import held
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
    """The longest task step per task name, in wall time, and the most CPU any one step used
    (wall time on a loaded machine also counts the time the process waited for a core)."""

    def __init__(self) -> None:
        self.worst: dict[str, float] = {}
        self.worst_cpu = 0.0
        self._t: float | None = None
        self._cpu = 0.0

    def before_task_step(self, task) -> None:
        self._t, self._cpu = time.perf_counter(), time.thread_time()

    def after_task_step(self, task) -> None:
        if self._t is None:  # the step that added the instrument
            return
        d = time.perf_counter() - self._t
        if d > self.worst.get(task.name, 0.0):
            self.worst[task.name] = d
        self.worst_cpu = max(self.worst_cpu, time.thread_time() - self._cpu)


class Collections:
    """A ``gc.callbacks`` timer: the longest collection per generation, in wall time and in CPU
    time of the collecting thread, and how many ran (a collection holds the GIL: the loop stands
    still for as long as it takes; on a loaded machine wall time also counts the time the process
    waited for a core). With ``why``, for the longest one: its generation, how many objects it
    freed, and the largest containers it walked (type, referent count; looked up before its
    timer starts)."""

    def __init__(self, why: bool = False) -> None:
        self.worst = [0.0, 0.0, 0.0]
        self.worst_cpu = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self.why = why
        self.biggest: list = []
        self.worst_why: list = []
        self._t = self._cpu = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        g = info["generation"]
        if phase == "start":
            if self.why:
                sizes = ((type(o).__name__, len(gc.get_referents(o))) for o in gc.get_objects(generation=g))
                self.biggest = sorted(sizes, key=lambda kv: -kv[1])[:3]
            self._t, self._cpu = time.perf_counter(), time.thread_time()
            return
        self.count[g] += 1
        self.worst[g] = max(self.worst[g], time.perf_counter() - self._t)
        cpu = time.thread_time() - self._cpu
        if cpu > max(self.worst_cpu):
            self.worst_why = [g, info["collected"], *self.biggest]
        self.worst_cpu[g] = max(self.worst_cpu[g], cpu)


def text(mb: float) -> str:
    rnd = random.Random(1)
    n = int(mb * 1_000_000) // 5
    return " ".join(rnd.choice(WORDS) for _ in range(n))


def _assistant_call(arguments: str) -> list[dict]:
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": arguments}}
    return [
        {"role": "user", "content": "read it"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]


def shape(name: str, mb: float) -> tuple[str, str, bytes]:
    """(method, path, body) of one hostile request of about ``mb`` MB."""
    size = int(mb * 1_000_000)
    turn = "/sessions/{sid}/v1/chat/completions"
    if name == "content":
        body = {"messages": [{"role": "user", "content": text(mb)}], "max_tokens": 8}
    elif name == "tool-description":
        tool = {"type": "function", "function": {"name": "f", "description": text(mb)}}
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": [tool], "max_tokens": 8}
    elif name == "tool-arguments":
        body = {"messages": _assistant_call(text(mb)), "max_tokens": 8}
    elif name == "deep-json":
        return "POST", turn, b'{"messages": ' + b"[" * size + b"]" * size + b"}"
    elif name == "workers-invalid":
        # A registration body that is JSON-shaped but invalid only at its very end.
        return "POST", "/workers", b'{"url": "http://127.0.0.1:1", "labels": {"a": "' + b"x" * size + b'", }'
    elif name == "workers-valid-large":
        return (
            "POST",
            "/workers",
            json.dumps({"url": "http://127.0.0.1:1", "labels": {"a": "x" * size}}).encode(),
        )
    elif name == "session-snapshot":
        return "GET", "/sessions/{sid}", b""
    else:
        raise SystemExit(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    return "POST", turn, json.dumps(body).encode()


SHAPES = (
    "content",
    "tool-description",
    "tool-arguments",
    "deep-json",
    "workers-invalid",
    "workers-valid-large",
    "session-snapshot",
)


async def one(model_dir, name: str, mb: float, gc_tuned: bool = False, gc_why: bool = False) -> dict:
    cfg = Config(policy="round_robin", sessions=SessionsConfig(tokenizer_path=str(model_dir)))
    # The engine in a process of its own: its tokenization must not count as the gateway's stall.
    # A prompt longer than its context is refused (a 502 here) after the gateway did all its work.
    engine, urls = start_fake_engines("sglang", 1, ["--tokenizer-path", str(model_dir)])
    try:
        async with gateway_in_process(cfg, worker_urls=urls) as gw:
            if gc_tuned:
                gc.freeze()  # as a launched gateway freezes what its startup built (gctune)
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            if name == "session-snapshot":
                # A session whose captured ids make a snapshot of about mb MB (a short turn's
                # ids repeated: the fake's context is too short for a turn that long, and the
                # snapshot's encoding is what is measured).
                body = {"messages": [{"role": "user", "content": text(0.01)}], "max_tokens": 8}
                r = await gw.client.post(f"/sessions/{sid}/v1/chat/completions", json=body)
                assert r.status_code == 200, r.text[:300]
                (node,) = gw.app.sessions.sessions[sid].tree.entries.values()
                # Held as the tree holds a run that long (an array('i'), ``smgrl.tito.ids``).
                many = list(node.token_ids) * max(1, int(mb * 1_000_000 / 6 / len(node.token_ids)))
                node.token_ids = held(many)
            method, path, payload = shape(name, mb)
            path = path.format(sid=sid)
            steps = Steps()
            gap = [0.0]
            health = [0.0, 0]
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

            async def prober():
                # GET /health every 10 ms through the same gateway. Its latency is counted from
                # when the probe was due (a client outside the process sends on time; a stalled
                # loop only reads it late): what an operator's probe sees meanwhile.
                while not done.is_set():
                    due = time.perf_counter() + 0.01
                    await trio.sleep(0.01)
                    await gw.client.get("/health")
                    health[0] = max(health[0], time.perf_counter() - due)
                    health[1] += 1

            collections_ = Collections(gc_why)
            gc.callbacks.append(collections_)
            t0 = time.perf_counter()
            trio.lowlevel.add_instrument(steps)
            async with trio.open_nursery() as n:
                n.start_soon(heartbeat)
                n.start_soon(prober)
                await trio.sleep(0.05)  # the prober's first answers: the loop's baseline
                r = await gw.client.request(
                    method, path, content=payload, headers={"content-type": "application/json"}
                )
                done.set()
            trio.lowlevel.remove_instrument(steps)
            gc.callbacks.remove(collections_)
            sampler.stop.set()
            watcher.join()
            worst = sorted(steps.worst.items(), key=lambda kv: -kv[1])[:4]
            return {
                "shape": name,
                "mb": mb,
                "status": r.status_code,
                "request_s": round(time.perf_counter() - t0, 2),
                "health_worst_ms": round(health[0] * 1000, 1),
                "health_probes": health[1],
                "heartbeat_max_gap_ms": round(gap[0] * 1000, 1),
                "longest_steps": [(n.rsplit(".", 1)[-1][:60], round(d, 3)) for n, d in worst],
                "longest_step_cpu_ms": round(steps.worst_cpu * 1000, 1),
                "stall_samples_5ms": sampler.hits.most_common(4),
                # The longest collection of each generation (0, 1, 2) and how many ran.
                "gc_worst_ms": [round(w * 1000, 1) for w in collections_.worst],
                "gc_worst_cpu_ms": [round(w * 1000, 1) for w in collections_.worst_cpu],
                "gc_count": collections_.count,
                **({"gc_worst_walked": collections_.worst_why} if gc_why else {}),
                "tracked_objects": len(gc.get_objects()),
            }
    finally:
        engine.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, nargs="+", default=[1.0, 8.0])
    ap.add_argument("--shape", nargs="+", default=list(SHAPES), choices=SHAPES)
    ap.add_argument(
        "--gc-tuned",
        action="store_true",
        help="the garbage collector as `smgrl serve` sets it (smgrl/runtime/gctune.py), not Python's defaults",
    )
    ap.add_argument(
        "--gc-why",
        action="store_true",
        help="name the largest containers the longest collection walked (slows each collection)",
    )
    args = ap.parse_args()
    if args.gc_tuned:
        from smgrl.runtime import gctune

        gctune.tune()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_model_dir(Path(tmp) / "tok")
        for name in args.shape:
            for mb in args.mb:
                print(json.dumps(trio.run(one, model_dir, name, mb, args.gc_tuned, args.gc_why)), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""An asynchronous RL loop through smgrl: rollouts stream while the trainer refits.

    python examples/async_rl_loop.py --gateway http://127.0.0.1:30000 \
        [--clients 32] [--refits 3] [--refit-every 2] [--tokens 16] [--selector engine=sglang]

Many rollout clients stream generations through the gateway's data plane (half ``/generate``,
half ``/v1/chat/completions``, ``stream: true``) for the whole run. Meanwhile a trainer refits the
fleet every ``--refit-every`` seconds through ``smgrl.rl``, the way that never cuts a rollout:

1. ``rl.set_state("paused", selector=...)`` (``POST /v1/rl/state``): the gateway stops dispatching; new
   rollouts wait in the gateway (nothing fails, they are just later); a short ``--grace`` lets
   the ones dispatched just before reach their engines;
2. ``update_weights_from_disk`` fanned out with the new ``weight_version``: each engine finishes
   the generations it has (SGLang's model-update lock) and then loads the weights;
3. ``rl.set_state("active", selector=...)``: the waiting rollouts go out, to
   the new weights.

At the end it checks, and exits 1 if any check fails:

* no rollout failed (every stream answered 200 and ended with ``data: [DONE]``);
* every sample names the version that produced it (``x-smg-weight-version``, equal to what the
  engine reported in the stream: ``meta_info.weight_version`` / ``system_fingerprint``);
* no sample came from an engine mid-refit: no sample's weights changed while it ran
  (``meta_info.weight_versions`` has one span at most), every sample that started after refit k
  finished carries version k or newer, and every sample that ended before refit k began carries
  an older one.

``--partial-rollout``: the trainer refits the way that DOES cut rollouts (SGLang's
``pause_generation`` in mode ``abort``, then ``update_weights_from_disk``, then
``continue_generation``, fanned out through the gateway, each sync once a rollout is mid-stream
so that it cuts one), and the rollout clients send
``/generate`` with ``input_ids`` (streamed). The gateway loops every aborted rollout back
(docs/data-plane.md, "Partial-rollout loopback"), and the run checks that no decoded token was
lost: every sample has exactly ``--tokens`` tokens (finish ``length``), its segments are
contiguous and add up, every token is named by a ``meta_info.weight_versions`` span of a
published version, and rollouts were in fact looped back.

``smgrl demo --rollouts`` starts fake engines and a gateway and runs this against them.

What it needs (checked at the start; exit 2 with what to do when something is missing):

* a gateway started with ``--enable-rl`` and at least one ready engine that ``--selector``
  (default ``engine=sglang``) matches;
* a checkpoint directory every selected engine can read: ``--model-path``, or by default the
  ``model_path`` the engines report (refused when the engines run on this host and it is not a
  directory here, as after a refit from a temporary directory that is gone);
* with ``--partial-rollout``, engines still decoding when a sync arrives: for fake engines, a
  per-token latency (``smgrl fake-engine --token-latency-ms 2``), else no sync aborts anything.

It runs as often as you like on the same fleet: each run publishes versions of its own
(``--version-prefix``, default ``loop-<UTC time>-``, then 001, 002, ...), never one an earlier run
or another document published. Versions that are not numbers compare as text (SMG's rule), so the
default prefix is the start time at a fixed width: a later run's versions are newer than an
earlier run's, and a rollout's version floor from before a refit stays within reach.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
import urllib.parse

import attrs
import httpx
import trio

from smgrl.rl import RL, RlError


@attrs.define
class Sample:
    client: int
    route: str
    started: float
    ended: float = 0.0
    status: int = 0
    done: bool = False
    header_version: str | None = None
    reported_version: str | None = None
    spans: int = 0
    worker: str | None = None
    error: str | None = None
    final: dict | None = None  # --partial-rollout: the last /generate event


class Decoding:
    """How many rollouts are mid-stream (a token arrived, the stream has not ended). With
    ``--partial-rollout`` the trainer syncs only while one is: a sync that lands between rollouts
    (the clients still starting on a busy machine) aborts nothing and proves nothing."""

    def __init__(self) -> None:
        self.count = 0
        self.cond = threading.Condition()

    def change(self, by: int) -> None:
        with self.cond:
            self.count += by
            self.cond.notify_all()

    def wait(self, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.count > 0, timeout)


@attrs.define
class Refit:
    index: int
    version: str
    began: float
    finished: float = 0.0


def _utc_stamp() -> str:
    """The time now at a fixed width (``20261201T221530123``): later stamps sort after earlier ones."""
    now = time.time()
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now * 1000) % 1000:03d}"


def trainer(
    rl: RL, args, refits: list[Refit], model_path: str, stop: threading.Event, decoding: Decoding
) -> None:
    """The trainer's side, blocking (``smgrl.rl`` is synchronous): one refit every few seconds."""
    for k in range(1, args.refits + 1):
        if stop.wait(args.refit_every):
            return
        if args.partial_rollout:
            decoding.wait(args.request_timeout)  # bounded: syncs anyway when nothing decodes
        refit = Refit(k, f"{args.version_prefix}{k:03d}", time.monotonic())
        if args.partial_rollout:
            # The sync that aborts what the engines run; the gateway keeps their tokens.
            rl.fanout("pause_generation", {"mode": "abort"}, selector=args.selector)
            try:
                body = {"model_path": model_path, "weight_version": refit.version, "flush_cache": False}
                result = rl.fanout("update_weights_from_disk", body, selector=args.selector)
                print(
                    f"  refit {k}: {result.succeeded}/{result.total} engines now at {refit.version}",
                    flush=True,
                )
            finally:
                rl.fanout("continue_generation", {}, selector=args.selector)
            refit.finished = time.monotonic()
            refits.append(refit)
            continue
        rl.set_state("paused", selector=args.selector)
        # Rollouts the gateway dispatched just before the write are still on the wire: let them
        # reach their engines, whose model-update lock then lets them finish on the old weights.
        time.sleep(args.grace)
        try:
            body = {"model_path": model_path, "weight_version": refit.version, "flush_cache": False}
            result = rl.fanout("update_weights_from_disk", body, selector=args.selector)
            print(
                f"  refit {k}: {result.succeeded}/{result.total} engines now at {refit.version}", flush=True
            )
        finally:
            rl.set_state("active", selector=args.selector)  # always: never leave the fleet held out
        refit.finished = time.monotonic()
        refits.append(refit)


async def rollout_client(
    i: int, args, stop_at: list[float], samples: list[Sample], decoding: Decoding
) -> None:
    route = "/generate" if i % 2 == 0 else "/v1/chat/completions"
    prompt = f"Rollout {i}: solve the task step by step."
    if args.partial_rollout:
        route = "/generate"
        body = {
            "input_ids": [1000 + i, 1001, 1002, 1003],
            "stream": True,
            "sampling_params": {"max_new_tokens": args.tokens, "ignore_eos": True},
        }
    elif route == "/generate":
        body = {
            "text": prompt,
            "stream": True,
            "sampling_params": {"max_new_tokens": args.tokens, "ignore_eos": True},
        }
    else:
        body = {"model": args.model, "messages": [{"role": "user", "content": prompt}], "stream": True,
                "max_tokens": args.tokens, "ignore_eos": True}  # fmt: skip
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(
        base_url=args.gateway, timeout=args.request_timeout, headers=headers
    ) as client:
        while time.monotonic() < stop_at[0]:
            sample = Sample(i, route, time.monotonic())
            counted = False  # this stream is in ``decoding`` (a token arrived, not ended)
            try:
                async with client.stream("POST", route, json=body) as r:
                    sample.status = r.status_code
                    sample.header_version = r.headers.get("x-smg-weight-version")
                    sample.worker = r.headers.get("x-smg-routed-worker-id")  # the serving worker URL
                    async for line in r.aiter_lines():
                        _event(sample, line)
                        if not counted and sample.final is not None and not sample.done:
                            counted = True
                            decoding.change(+1)
            except httpx.HTTPError as exc:
                sample.error = repr(exc)
            finally:
                if counted:
                    decoding.change(-1)
            sample.ended = time.monotonic()
            samples.append(sample)


def _event(sample: Sample, line: str) -> None:
    if not line.startswith("data: "):
        return
    data = line[6:]
    if data == "[DONE]":
        sample.done = True
        return
    event = json.loads(data)
    if "error" in event:
        sample.error = str(event["error"])
        return
    meta = event.get("meta_info")
    if isinstance(meta, dict):  # /generate
        sample.final = event
        sample.reported_version = meta.get("weight_version")
        sample.spans = max(sample.spans, len(meta.get("weight_versions") or []))
    elif event.get("system_fingerprint") is not None:  # OpenAI-shaped
        sample.reported_version = event["system_fingerprint"]


def check(samples: list[Sample], refits: list[Refit], initial: str | None) -> list[str]:
    problems = []
    order = {initial: 0, **{r.version: r.index for r in refits}}
    for s in samples:
        who = f"client {s.client} {s.route} at +{s.started:.2f}s"
        if s.status != 200 or not s.done or s.error:
            problems.append(f"{who}: failed (status {s.status}, done {s.done}, error {s.error})")
            continue
        if not s.header_version or s.header_version != s.reported_version:
            problems.append(
                f"{who}: names {s.header_version!r} but the engine reported {s.reported_version!r}"
            )
            continue
        if s.spans > 1:
            problems.append(f"{who}: its weights changed while it ran ({s.spans} versions)")
        k = order.get(s.header_version)
        if k is None:
            problems.append(f"{who}: version {s.header_version!r} was never published")
            continue
        for r in refits:
            if s.started >= r.finished and k < r.index:
                problems.append(
                    f"{who}: started after refit {r.index} finished but ran on {s.header_version}"
                )
            if s.ended <= r.began and k >= r.index:
                problems.append(f"{who}: ended before refit {r.index} began but ran on {s.header_version}")
    return problems


def check_partial(samples: list[Sample], refits: list[Refit], initial: str | None, tokens: int) -> list[str]:
    """--partial-rollout: no decoded token lost, counts add up, every token names its version."""
    problems = []
    published = {initial, *(r.version for r in refits)}
    looped = 0
    for s in samples:
        who = f"client {s.client} at +{s.started:.2f}s"
        if s.status != 200 or not s.done or s.error or s.final is None:
            problems.append(f"{who}: failed (status {s.status}, done {s.done}, error {s.error})")
            continue
        ids, meta = s.final["output_ids"], s.final["meta_info"]
        if (
            len(ids) != tokens
            or meta.get("completion_tokens") != tokens
            or meta["finish_reason"]["type"] != "length"
        ):
            problems.append(f"{who}: {len(ids)} tokens, completion_tokens {meta.get('completion_tokens')}, "
                            f"finish {meta['finish_reason']} (expected {tokens}, length)")  # fmt: skip
            continue
        segments = meta.get("segments") or [{"start": 0, "end": len(ids)}]
        looped += len(segments) > 1
        # Checked like the version spans below (a run of ranges that must tile the tokens): two facts, two messages.
        bounds = [(g["start"], g["end"]) for g in segments]
        if (
            bounds[0][0] != 0
            or bounds[-1][1] != tokens
            or any(a[1] != b[0] for a, b in itertools.pairwise(bounds))
        ):
            problems.append(f"{who}: segments {bounds} do not add up to {tokens} tokens")
        spans = meta.get("weight_versions") or [
            {"version": meta.get("weight_version"), "start": 0, "end": len(ids)}
        ]
        covered = [(x["start"], x["end"]) for x in spans]
        if (
            covered[0][0] != 0
            or covered[-1][1] != tokens
            or any(a[1] != b[0] for a, b in itertools.pairwise(covered))
        ):
            problems.append(f"{who}: version spans {covered} do not name every token")
        unknown = {x["version"] for x in spans} - published
        if unknown:
            problems.append(f"{who}: tokens from unpublished versions {sorted(map(str, unknown))}")
    if not looped:
        problems.append("no rollout was looped back: the syncs aborted nothing")
    print(f"  {looped} rollouts survived a sync by loopback", flush=True)
    return problems


def _local(url: str) -> bool:
    return (urllib.parse.urlsplit(url).hostname or "") in ("127.0.0.1", "::1", "localhost")


def _fake_token_latency(workers) -> float | None:
    """The smallest per-token latency of fake engines (their ``/_fake/knobs``), None for real ones."""
    latencies = []
    with httpx.Client(timeout=5) as http:
        for w in workers:
            try:
                # A gRPC engine's HTTP side is its control URL (``rl.control_url``).
                r = http.get(f"{w.labels.get('rl.control_url') or w.url}/_fake/knobs")
            except httpx.HTTPError:
                return None
            if r.status_code != 200:
                return None
            latencies.append(float(r.json().get("token_latency_ms") or 0))
    return min(latencies, default=None)


def preflight(rl: RL, args) -> tuple[list, str] | str:
    """The ready engines the selector matches and the checkpoint to load, or what is missing."""
    try:
        workers = rl.workers()
    except RlError as exc:
        return f"the gateway answered {exc}: start it with --enable-rl"
    workers = [w for w in workers if w.health == "ready"]
    if args.selector.startswith("engine=") and "," not in args.selector:  # the common case, checked here
        workers = [w for w in workers if w.engine == args.selector.removeprefix("engine=")]
    if not workers:
        return f"no ready engine matches {args.selector!r}: register engines (smgrl launch --worker-urls ...)"
    if args.partial_rollout:
        slow = _fake_token_latency(workers)
        if slow is not None and slow <= 0:
            return (
                "--partial-rollout needs engines still decoding when a sync arrives; these fake engines "
                "decode instantly: start them with --token-latency-ms 2 (or POST /_fake/knobs)"
            )
    if args.model_path:
        return workers, args.model_path
    model_path = workers[0].labels.get("model_path")
    if not model_path:
        return "the engines report no model_path: pass --model-path DIR (a checkpoint every engine reads)"
    if os.path.isabs(model_path) and all(_local(w.url) for w in workers) and not os.path.isdir(model_path):
        return (
            f"the engines' model_path {model_path} is not a directory on this host (an earlier refit "
            "from a temporary directory?): pass --model-path DIR"
        )
    return workers, model_path


async def run(args) -> int:
    rl = RL(args.gateway, api_key=args.api_key, timeout=120)
    found = preflight(rl, args)
    if isinstance(found, str):
        print(f"async_rl_loop: {found}", file=sys.stderr)
        return 2
    workers, model_path = found
    if args.version_prefix is None:
        args.version_prefix = f"loop-{_utc_stamp()}-"
    # OpenAI routes need `model`: the name the gateway registered (GET /v1/models), which stays
    # routable after refits even when the engine then reports its checkpoint path.
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(base_url=args.gateway, headers=headers, timeout=30) as client:
        args.model = (await client.get("/v1/models")).json()["data"][0]["id"]
    initial = {w.weight_version for w in workers}
    initial_version = initial.pop() if len(initial) == 1 else None
    print(f"{len(workers)} engines at {initial_version or 'default'}; {args.clients} rollout clients; "
          f"{args.refits} refits every {args.refit_every:g}s", flush=True)  # fmt: skip
    samples: list[Sample] = []
    refits: list[Refit] = []
    stop = threading.Event()
    decoding = Decoding()
    stop_at = [float("inf")]  # the clients roll out until --tail seconds after the last refit
    with trio.fail_after(args.refits * (args.refit_every + 60) + args.tail + args.request_timeout + 60):
        async with trio.open_nursery() as nursery:
            for i in range(args.clients):
                nursery.start_soon(rollout_client, i, args, stop_at, samples, decoding)
            try:
                await trio.to_thread.run_sync(trainer, rl, args, refits, model_path, stop, decoding)
            except RlError as exc:  # a refit the engines refused: say which and why, in one place
                trainer_error = f"refit {len(refits) + 1} failed: {exc}"
            else:
                trainer_error = None
            finally:
                stop.set()
                stop_at[0] = time.monotonic() + args.tail
    if trainer_error:
        print(f"async RL loop FAILED: {trainer_error}")
        return 1
    t0 = min((s.started for s in samples), default=0.0)
    if args.partial_rollout:
        problems = check_partial(samples, refits, initial_version or "default", args.tokens)
    else:
        problems = check(samples, refits, initial_version or "default")
    versions: dict[str, int] = {}
    for s in samples:
        versions[s.header_version or "?"] = versions.get(s.header_version or "?", 0) + 1
    print(f"{len(samples)} samples in {max((s.ended for s in samples), default=t0) - t0:.1f}s; by version: "
          + ", ".join(f"{v}={n}" for v, n in sorted(versions.items())), flush=True)  # fmt: skip
    if len(refits) != args.refits:
        problems.append(f"only {len(refits)} of {args.refits} refits ran")
    if problems:
        for p in problems[:20]:
            print("  FAIL " + p)
        print(f"async RL loop FAILED: {len(problems)} problems")
        return 1
    if args.partial_rollout:
        print("async RL loop passed (partial rollout): no decoded token lost across "
              f"{len(refits)} syncs, every token names its version")  # fmt: skip
        return 0
    print("async RL loop passed: no rollout failed, every sample names its version, none came from an "
          "engine mid-refit")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", default="http://127.0.0.1:30000")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--selector", default="engine=sglang")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--refits", type=int, default=3)
    ap.add_argument("--refit-every", type=float, default=2.0)
    ap.add_argument("--tail", type=float, default=1.0, help="seconds of rollouts after the last refit")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--model-path", default=None, help="checkpoint to load (default: the engines' own)")
    ap.add_argument(
        "--version-prefix",
        default=None,
        help="versions published: PREFIX001, PREFIX002, ... (default loop-<UTC time>-)",
    )
    ap.add_argument(
        "--grace", type=float, default=0.05, help="seconds between holding rollouts and the refit"
    )
    ap.add_argument("--request-timeout", type=float, default=120.0)
    ap.add_argument(
        "--partial-rollout",
        action="store_true",
        help="syncs abort in-flight generations (pause_generation mode abort); the gateway loops them back",
    )
    args = ap.parse_args(argv)
    return trio.run(run, args)


if __name__ == "__main__":
    sys.exit(main())

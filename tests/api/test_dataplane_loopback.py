"""Partial-rollout loopback, in process: a /generate that a sync through the gateway
aborts is continued from its tokens; the answer is checked token by token against the
autoregressive fake model, and deliberate cancellations are not looped back."""

from __future__ import annotations

import json

import attrs
import pytest
import trio
import trio.testing
from test_dataplane_hook import Hook

from smgrl.core.config import Config, DataPlaneConfig, RlConfig
from smgrl.fake import fake_fleet, make_checkpoint, model
from smgrl.testing import gateway_in_process

PROMPT = [101, 102, 103, 104, 105]
N = 40


def cfg(max_loopbacks: int = 8) -> Config:
    return Config(
        rl=RlConfig(enabled=True, control_timeout_secs=5),
        policy="round_robin",
        dataplane=DataPlaneConfig(max_loopbacks=max_loopbacks),
    )


def body(n: int = N) -> dict:
    return {
        "input_ids": PROMPT,
        "sampling_params": {"max_new_tokens": n, "ignore_eos": True},
        "return_logprob": True,
    }


def reference(digest: str, ids: list[int], n: int) -> list[int]:
    out, key = [], model.context_key(ids)
    for _ in range(n):
        token, _ = model.next_token(bytes.fromhex(digest), key)
        out.append(token)
        key = model.extend_key(key, token)
    return out


async def produced(engine, k: int, leg: int = 0) -> None:
    """Wait until a job of the engine has decoded at least ``k`` tokens; ``leg`` > 0: a
    continuation (its prompt is longer than the original)."""

    def ready(j) -> bool:
        return len(j.output_ids) >= k and (len(j.prompt_ids) > len(PROMPT)) == (leg > 0) and j.finish is None

    assert await engine.wait_until(lambda: any(ready(j) for j in engine.scheduler.jobs.values()), timeout=30)


async def rl(gw, wid: str, path: str, payload: dict) -> None:
    r = await gw.client.post(f"/v1/rl/workers/{wid}/engine/{path}", json=payload)
    assert r.status_code == 200, r.text


async def test_a_sync_that_aborts_a_rollout_is_looped_back_token_exact(tmp_path):
    async with (
        fake_fleet("sglang", n=1, token_latency_ms=3) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet.engines[0]
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        old = engine.weights_digest
        hook = gw.app.dataplane.hook = Hook()
        result = {}

        async def rollout():
            r = await gw.client.post("/generate", json=body(), headers={"x-request-id": "roll-1"})
            result["r"] = r

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            await produced(engine, 8)
            # The trainer's sync, through the gateway: pause (abort mode), load, continue.
            await rl(gw, wid, "pause_generation", {"mode": "abort"})
            ckpt = make_checkpoint(tmp_path / "v2", "fake/Qwen3-0.6B", seed=2)
            await rl(gw, wid, "update_weights_from_disk", {"model_path": str(ckpt), "weight_version": "v2"})
            await rl(gw, wid, "continue_generation", {})
        r = result["r"]
        assert r.status_code == 200, r.text
        out = r.json()
        meta = out["meta_info"]
        ids = out["output_ids"]
        assert len(ids) == N and meta["completion_tokens"] == N and meta["prompt_tokens"] == len(PROMPT)
        assert meta["finish_reason"]["type"] == "length"
        first, second = meta["segments"]
        k = first["end"]
        assert 8 <= k < N and first["finish_reason"] == "abort" and first["op_id"]
        assert (second["start"], second["end"], second["iteration"]) == (k, N, 1)
        # Before the abort: the uninterrupted generation on the old weights; after it: the new
        # weights continuing from the same context.
        assert ids[:k] == reference(old, PROMPT, N)[:k]
        assert ids[k:] == reference(engine.weights_digest, PROMPT + ids[:k], N - k)
        assert meta["weight_versions"] == [
            {"version": "default", "start": 0, "end": k},
            {"version": "v2", "start": k, "end": N},
        ]
        assert [lp[1] for lp in meta["output_token_logprobs"]] == ids
        assert r.headers["x-smg-mixed-version"] == "true"
        # The continuation's prompt was the original plus the kept tokens, the cap reduced.
        last = engine.calls_to("/generate")[-1].json_body()
        assert last["input_ids"] == PROMPT + ids[:k]
        assert last["sampling_params"]["max_new_tokens"] == N - k
        # One journal event, naming the pause that caused it.
        events = [rec.event for rec in gw.store.read() if rec.event.TYPE == "dataplane.request_looped_back"]
        assert len(events) == 1
        ev = events[0]
        assert (ev.request_id, ev.loopbacks, ev.tokens_kept, ev.generated_tokens, ev.outcome) == (
            "roll-1",
            1,
            k,
            N,
            "completed",
        )
        assert ev.op_ids == (first["op_id"],)
        metrics = gw.app.dataplane.metrics
        assert metrics.loopbacks._value.get() == 1 and metrics.tokens_kept._value.get() == k
        # The admission hook is asked again for the continuation: PSRL's x-response-token-count.
        asked = [(req.loopback, req.response_tokens) for _, req in hook.requests]
        assert asked == [(0, 0), (1, k)] and not hook.held
        # Per-instance tokens count each decoded token once (the stitched answer reports N).
        (row,) = (await gw.client.get("/workers/stats")).json()["workers"]
        assert row["tokens"] == N


async def test_deliberate_aborts_are_answered_as_the_engine_gave_them():
    async with (
        fake_fleet("sglang", n=1, token_latency_ms=3) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet.engines[0]
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        result = {}

        async def rollout():
            result["r"] = await gw.client.post("/generate", json=body(200))

        for how in ("abort_request", "direct"):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(rollout)
                await produced(engine, 3)
                if how == "abort_request":  # the trainer's own abort, through the gateway
                    await rl(gw, wid, "abort_request", {"abort_all": True})
                else:  # an abort straight to the engine
                    engine.scheduler.abort_all()
            out = result["r"].json()
            assert out["meta_info"]["finish_reason"]["type"] == "abort", how
            assert "segments" not in out["meta_info"] and len(out["output_ids"]) < 200
        assert not [rec for rec in gw.store.read() if rec.event.TYPE == "dataplane.request_looped_back"]


async def test_the_loopback_bound_then_a_clear_error():
    async with (
        fake_fleet("sglang", n=1, token_latency_ms=3) as fleet,
        gateway_in_process(cfg(max_loopbacks=1), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet.engines[0]
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        result = {}

        async def rollout():
            result["r"] = await gw.client.post("/generate", json=body(400))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            for leg in range(2):  # two syncs: the second abort exceeds --max-loopbacks 1
                await produced(engine, 3, leg)
                await rl(gw, wid, "update_weight_version", {"new_version": "x"})
        r = result["r"]
        assert r.status_code == 503 and r.json()["error"]["code"] == "loopback_limit_exceeded"
        (ev,) = [rec.event for rec in gw.store.read() if rec.event.TYPE == "dataplane.request_looped_back"]
        assert ev.outcome == "limit_exceeded" and ev.loopbacks == 1


async def test_text_prompts_answer_the_engines_abort():
    async with (
        fake_fleet("sglang", n=1, token_latency_ms=3) as fleet,
        gateway_in_process(attrs.evolve(cfg()), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet.engines[0]
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        result = {}

        async def rollout():
            text = {"text": "a b c", "sampling_params": {"max_new_tokens": 200, "ignore_eos": True}}
            result["r"] = await gw.client.post("/generate", json=text)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            await produced(engine, 3)
            await rl(gw, wid, "update_weight_version", {"new_version": "y"})
        assert result["r"].json()["meta_info"]["finish_reason"]["type"] == "abort"


def sse_events(text: str) -> list:
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: ") and block != "data: [DONE]":
            out.append(json.loads(block[6:]))
    return out


async def test_a_stream_continues_across_the_loopback_without_a_seam(tmp_path):
    async with (
        fake_fleet("sglang", n=1, token_latency_ms=3) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet.engines[0]
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        old = engine.weights_digest
        result = {}

        async def rollout():
            result["r"] = await gw.client.post("/generate", json={**body(), "stream": True})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            await produced(engine, 8)
            await rl(gw, wid, "pause_generation", {})  # SGLang's default mode: abort
            ckpt = make_checkpoint(tmp_path / "v2", "fake/Qwen3-0.6B", seed=2)
            await rl(gw, wid, "update_weights_from_disk", {"model_path": str(ckpt), "weight_version": "v2"})
            await rl(gw, wid, "continue_generation", {})
        r = result["r"]
        assert r.status_code == 200
        assert r.text.endswith("data: [DONE]\n\n") and r.text.count("[DONE]") == 1
        events = sse_events(r.text)
        seen: list[int] = []
        for event in events:  # cumulative ids only ever grow: no seam, no abort in sight
            assert event["output_ids"][: len(seen)] == seen
            seen = event["output_ids"]
            assert event["meta_info"]["finish_reason"] is None or event is events[-1]
        final = events[-1]
        meta = final["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and len(seen) == N
        k = meta["segments"][0]["end"]
        assert seen[:k] == reference(old, PROMPT, N)[:k]
        assert seen[k:] == reference(engine.weights_digest, PROMPT + seen[:k], N - k)
        assert meta["prompt_tokens"] == len(PROMPT) and meta["completion_tokens"] == N
        assert [s["version"] for s in meta["weight_versions"]] == ["default", "v2"]
        (ev,) = [rec.event for rec in gw.store.read() if rec.event.TYPE == "dataplane.request_looped_back"]
        assert ev.tokens_kept == k and ev.generated_tokens == N and ev.outcome == "completed"
        (row,) = (await gw.client.get("/workers/stats")).json()["workers"]
        assert row["tokens"] == N  # each decoded token counted once, across the seam


@pytest.mark.parametrize(
    ("kind", "incremental"),
    [("sglang", False), ("sglang", True), ("tokenspeed", False), ("tokenspeed", True)],
)
async def test_streams_are_stitched_in_each_engines_streaming_mode(kind, incremental):
    """SGLang streams cumulative events by default and only the new tokens with
    --incremental-streaming-output; TokenSpeed's /generate shim streams as the SGLang it fronts.
    Either way the client reads one generation across the loopback, in the engine's own mode."""
    async with (
        fake_fleet(kind, n=1, token_latency_ms=3, incremental_streaming_output=incremental) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet.engines[0]
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        result = {}

        async def rollout():
            result["r"] = await gw.client.post("/generate", json={**body(), "stream": True})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            await produced(engine, 8)
            await rl(gw, wid, "pause_generation", {"mode": "abort"})
            await rl(gw, wid, "update_weight_version", {"new_version": "v2", "abort_all_requests": False})
            await rl(gw, wid, "continue_generation", {})
        r = result["r"]
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n") and r.text.count("[DONE]") == 1
        events = sse_events(r.text)
        assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])  # no abort in sight
        if incremental:
            ids = [t for e in events for t in e["output_ids"]]
            lps = [lp for e in events for lp in e["meta_info"]["output_token_logprobs"]]
        else:
            seen: list[int] = []
            for event in events:  # cumulative ids only ever grow
                assert event["output_ids"][: len(seen)] == seen
                seen = event["output_ids"]
            ids, lps = seen, events[-1]["meta_info"]["output_token_logprobs"]
        meta = events[-1]["meta_info"]
        assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == N
        k = meta["segments"][0]["end"]
        assert len(ids) == N and [lp[1] for lp in lps] == ids
        assert ids == reference(engine.weights_digest, PROMPT, N)[:k] + reference(
            engine.weights_digest, PROMPT + ids[:k], N - k
        )
        assert meta["weight_versions"] == [
            {"version": "default", "start": 0, "end": k},
            {"version": "v2", "start": k, "end": N},
        ]
        last = engine.calls_to("/generate")[-1].json_body()
        assert last["input_ids"] == PROMPT + ids[:k] and last["sampling_params"]["max_new_tokens"] == N - k
        (ev,) = [rec.event for rec in gw.store.read() if rec.event.TYPE == "dataplane.request_looped_back"]
        assert ev.tokens_kept == k and ev.generated_tokens == N


async def test_a_continuation_waits_for_the_sync_that_aborted_it_to_finish(tmp_path):
    """A sync that aborts first and then loads for a while: the continuation waits in the gateway
    (``syncing``) until the load has finished, instead of racing it to an engine that still
    looks active (vLLM would refuse it; any engine would run it on weights the table does not
    name yet)."""
    async with (
        fake_fleet("sglang", n=1, token_latency_ms=3) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        engine = fleet.engines[0]
        engine.knobs.load_delay_ms = 300
        wid = gw.gateway.fleet.registry.id_for_url(fleet.urls[0])
        dp = gw.app.dataplane
        ckpt = make_checkpoint(tmp_path / "v2", "fake/Qwen3-0.6B", seed=2)
        result = {}

        async def rollout():
            result["r"] = await gw.client.post("/generate", json=body())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            await produced(engine, 8)
            load = {"model_path": str(ckpt), "weight_version": "v2", "abort_all_requests": True}
            nursery.start_soon(rl, gw, wid, "update_weights_from_disk", load)
            # Everything blocked for 50 ms: only the 300 ms load sleeps, the rest waits.
            await trio.testing.wait_all_tasks_blocked(cushion=0.05)
            assert dp.waiting_by_reason["syncing"] == 1
            assert len(engine.calls_to("/generate")) == 1  # nothing raced the load
        out = result["r"].json()
        assert out["meta_info"]["completion_tokens"] == N
        assert [s["version"] for s in out["meta_info"]["weight_versions"]] == ["default", "v2"]


async def test_a_failed_continuation_leg_ends_the_stream_and_is_recorded_failed():
    """The stream's 200 is already out when a continuation is refused: the stream ends without
    `[DONE]` (never a made-up end) and the loopback is journaled `failed`."""
    async with (
        fake_fleet("sglang", n=2, token_latency_ms=3) as fleet,
        gateway_in_process(cfg(), worker_urls=fleet.urls) as gw,
    ):
        result = {}

        async def rollout():
            result["r"] = await gw.client.post("/generate", json={**body(), "stream": True})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(rollout)
            busy = None
            with trio.fail_after(30):
                while busy is None:
                    busy = next(
                        (
                            e
                            for e in fleet.engines
                            if any(len(j.output_ids) >= 8 for j in e.scheduler.jobs.values())
                        ),
                        None,
                    )
                    await trio.sleep(0.01)
            other = next(e for e in fleet.engines if e is not busy)
            other.set_knobs(force_status=500)  # the continuation can only go there, and fails
            wid = gw.gateway.fleet.registry.id_for_url(busy.url)
            await rl(gw, wid, "pause_generation", {})
        r = result["r"]
        assert r.status_code == 200
        assert "data: [DONE]" not in r.text and sse_events(r.text)
        # Recorded as the handler unwinds, after the client's stream ended: a bounded wait.
        with trio.fail_after(10):
            while not (evs := [r.event for r in gw.store.read(types=["dataplane.request_looped_back"])]):
                await trio.sleep(0.01)
        (ev,) = evs
        assert ev.outcome == "failed"

"""Which of a client's sampling fields reach the engine: a session turn's (small and large, the
large one prepared in worker processes) and an OpenAI rollout's continuation after a loopback.
Through the real paths (in process: the session service and the data plane; fake engines on
loopback), read from what the engine received."""

from __future__ import annotations

import pytest
import trio
from test_loopback_tokenizer import N, synced
from test_loopback_tokenizer import cfg as loopback_cfg
from test_sessions_api import agent, cfg

from smgrl.fake import fake_fleet, model
from smgrl.sessions import offload
from smgrl.testing import gateway_in_process

# Every sampling field a client may set, each with a value that leaves the fake's answer as it is.
SAMPLING = {
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 20,
    "min_p": 0.05,
    "presence_penalty": 0.1,
    "frequency_penalty": 0.2,
    "repetition_penalty": 1.05,
    "stop": ["<never-said>"],
    "stop_token_ids": [999_999],
    "seed": 7,
    "skip_special_tokens": False,
}


@pytest.fixture
def tok(model_dirs):
    with model.tokenizer_scope(model_dirs["chatml"]) as chat:
        yield chat


@pytest.mark.parametrize("large", [False, True], ids=["in-process", "worker-process"])
async def test_a_session_turn_passes_the_sampling_fields_but_skip_special_tokens(
    tok, model_dirs, monkeypatch, large
):
    # skip_special_tokens stays at the gateway: a session reads the engine's ids, never its text,
    # and decodes them itself with the special tokens kept (the template's boundaries).
    if large:
        monkeypatch.setattr(offload, "PROCESS_BYTES", 0)  # every turn through the worker processes
    with trio.fail_after(120):
        async with (
            fake_fleet("sglang", n=1) as fleet,
            gateway_in_process(cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            sid = (await gw.client.post("/sessions")).json()["session_id"]
            await agent(gw.client, sid, 1, extra={**SAMPLING, "ignore_eos": False})
            (call,) = fleet.engines[0].calls_to("/generate")
            params = call.json_body()["sampling_params"]
    expected = {k: v for k, v in SAMPLING.items() if k not in ("seed", "skip_special_tokens")}
    assert params == {**expected, "sampling_seed": 7, "ignore_eos": False, "max_new_tokens": 200}


async def test_an_openai_continuation_keeps_the_sampling_fields_and_skip_special_tokens(tok, model_dirs):
    with trio.fail_after(30):
        async with (
            fake_fleet("sglang", n=1, token_latency_ms=3, weight_version="1") as fleet,
            gateway_in_process(loopback_cfg(model_dirs["chatml"]), worker_urls=fleet.urls) as gw,
        ):
            name = gw.app.dataplane.served_models()[0]
            body = {
                "model": name,
                "prompt": "once upon a time",
                "max_tokens": N,
                "ignore_eos": True,
                "user": "not a sampling field",
                **SAMPLING,
            }
            r = await synced(gw, fleet, "/v1/completions", body)
            assert r.status_code == 200, r.text
            first, cont = (c.json_body() for c in fleet.engines[0].calls_to("/v1/completions"))
    assert first == body
    assert set(cont) == {*SAMPLING, "ignore_eos", "model", "prompt", "stream", "max_tokens"}
    assert {k: cont[k] for k in SAMPLING} == SAMPLING and cont["ignore_eos"] is True

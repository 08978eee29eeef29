"""The fakes are autoregressive: the next token is a function of the weights and the
whole context, so a generation continued from ``prompt + first k outputs`` is the uninterrupted
generation's tail; that is what the partial-rollout tests check token by token."""

from __future__ import annotations

import httpx
import pytest

from smgrl.fake import fake_fleet, make_checkpoint, model

PROMPT = [11, 22, 33, 44]


async def gen(client, url, ids, n, seed=None):
    params = {"max_new_tokens": n, "ignore_eos": True}
    if seed is not None:
        params["sampling_seed"] = seed
    r = await client.post(
        f"{url}/generate", json={"input_ids": ids, "sampling_params": params, "return_logprob": True}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    return body["output_ids"], [lp for lp, _, _ in body["meta_info"]["output_token_logprobs"]]


@pytest.mark.parametrize("kind", ["sglang", "tokenspeed"])
async def test_a_continuation_from_the_context_is_the_uninterrupted_tail(kind, tmp_path):
    async with fake_fleet(kind, n=2) as fleet, httpx.AsyncClient() as client:
        a, b = fleet.urls
        full, full_lp = await gen(client, a, PROMPT, 24)
        for k in (1, 7, 23):
            tail, tail_lp = await gen(client, b, PROMPT + full[:k], 24 - k)  # another engine, same weights
            assert tail == full[k:] and tail_lp == full_lp[k:]
        ref = model.generate(bytes.fromhex(fleet.engines[0].weights_digest), PROMPT, 24)
        assert full[: len(ref)] == ref  # the reference stops at an EOS; ignore_eos went on
        seeded, _ = await gen(client, a, PROMPT, 24, seed=5)
        assert seeded != full
        assert (await gen(client, b, PROMPT + seeded[:9], 15, seed=5))[0] == seeded[9:]
        if kind != "sglang":
            return  # TokenSpeed refits only from a distributed group
        # New weights: a different continuation of the same context.
        ckpt = make_checkpoint(tmp_path / "v2", "fake/Qwen3-0.6B", seed=2)
        r = await client.post(f"{b}/update_weights_from_disk", json={"model_path": str(ckpt)})
        assert r.status_code == 200, r.text
        assert (await gen(client, b, PROMPT + full[:7], 17))[0] != full[7:]


def test_reference_generation_matches_the_rolling_key():
    digest = bytes(32)
    out = model.generate(digest, PROMPT, 50)
    key = model.context_key(PROMPT + out[:10])
    assert model.next_token(digest, key)[0] == out[10]
    assert model.generate(digest, PROMPT + out[:10], 40) == out[10:]

"""Fake engines with a real tokenizer (``--tokenizer-path``): real ids, log-probs, scripted replies."""

import json

import httpx
import pytest
from click.testing import CliRunner

from smgrl.fake import fake_fleet, model
from smgrl.fake.cli import fake_engine


@pytest.fixture
def tok(model_dirs):
    with model.tokenizer_scope(model_dirs["chatml"]) as chat:
        yield chat


def say(n: int, text: str) -> str:
    return f"[[fake-say:{n}:{json.dumps(text)}]]"


async def test_sglang_generate_with_input_ids_returns_real_ids_and_logprobs(tok):
    prompt = tok.tokenize_messages([{"role": "user", "content": "hello there"}])
    async with fake_fleet("sglang", n=1) as fleet, httpx.AsyncClient(base_url=fleet.urls[0]) as c:
        body = {"input_ids": prompt, "return_logprob": True, "sampling_params": {"max_new_tokens": 400}}
        r = (await c.post("/generate", json=body)).json()
    out = r["output_ids"]
    lps = r["meta_info"]["output_token_logprobs"]
    assert [t for _, t, _ in lps] == out and all(lp < 0 for lp, _, _ in lps)
    assert r["meta_info"]["prompt_tokens"] == len(prompt)
    assert max(out) < tok.tokenizer.get_vocab_size()
    if r["meta_info"]["finish_reason"]["type"] == "stop":
        assert out[-1] == tok.eos_id
    # generated words decode to clean text, and the engine's text skips the end-of-turn token
    assert r["text"] == tok.tokenizer.decode(out, skip_special_tokens=True)
    assert "\ufffd" not in r["text"]


async def test_scripted_reply_highest_directive_wins(tok):
    msgs = [
        {"role": "user", "content": "first " + say(1, "old")},
        {"role": "assistant", "content": "old"},
        {
            "role": "user",
            "content": "now " + say(2, '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'),
        },
    ]
    prompt = tok.tokenize_messages(msgs)
    async with fake_fleet("sglang", n=1) as fleet, httpx.AsyncClient(base_url=fleet.urls[0]) as c:
        r = (await c.post("/generate", json={"input_ids": prompt, "return_logprob": True})).json()
    assert r["output_ids"] == tok.encode('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>') + [
        tok.eos_id
    ]
    assert r["meta_info"]["finish_reason"]["type"] == "stop"


async def test_vllm_token_in_generate_and_chat_use_the_tokenizer(tok):
    msgs = [{"role": "user", "content": "hi " + say(1, "Hello back.")}]
    prompt = tok.tokenize_messages(msgs)
    async with fake_fleet("vllm", n=1) as fleet, httpx.AsyncClient(base_url=fleet.urls[0]) as c:
        body = {"token_ids": prompt, "sampling_params": {"max_tokens": 50, "logprobs": 0}}
        choice = (await c.post("/inference/v1/generate", json=body)).json()["choices"][0]
        assert choice["token_ids"] == tok.encode("Hello back.") + [tok.eos_id]
        assert len(choice["logprobs"]) == len(choice["token_ids"])
        assert choice["weight_versions"][0]["end"] == len(choice["token_ids"])
        chat = (
            await c.post(
                "/v1/chat/completions", json={"model": fleet.engines[0].served_model_name, "messages": msgs}
            )
        ).json()
    assert chat["choices"][0]["message"]["content"] == "Hello back."
    assert chat["usage"]["prompt_tokens"] == len(prompt)


def test_cli_rejects_a_bad_tokenizer_path(tmp_path):
    result = CliRunner().invoke(fake_engine, ["--tokenizer-path", str(tmp_path)])
    assert result.exit_code == 2
    assert "tokenizer.json" in result.output

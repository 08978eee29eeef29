"""The fake engines bound what a request may ask for, as the real engines do (smgrl/fake/limits.py),
and ``smgrl fake-engine`` on a busy port is one line and exit 1.

Found against a live gateway: ``n: 1000000000`` on a fake engine's /v1/completions built a
billion jobs (the engine process grew until it was killed), ``max_new_tokens: 10**12`` generated
for hours, a string ``n`` or ``max_tokens`` was a 500 with a traceback, and a busy port printed a
trio traceback."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest
import trio

from smgrl.fake import fake_fleet
from smgrl.fake.limits import MAX_N

BIG = 10**12

# (kind, path, body): each must be a 400 in the engine's envelope, answered at once.
REFUSED = [
    ("sglang", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": BIG}}),
    ("sglang", "/generate", {"input_ids": [1] * 50_000, "sampling_params": {"max_new_tokens": 1}}),
    ("sglang", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": "9"}}),
    ("sglang", "/generate", {"text": "hi", "sampling_params": ["not", "an", "object"]}),
    ("tokenspeed", "/generate", {"text": "hi", "sampling_params": {"max_new_tokens": BIG}}),
    ("sglang", "/v1/completions", {"prompt": "hi", "n": 10**9}),
    ("sglang", "/v1/completions", {"prompt": "hi", "n": "3"}),
    ("sglang", "/v1/completions", {"prompt": "hi", "n": 0}),
    ("sglang", "/v1/completions", {"prompt": "hi", "max_tokens": BIG}),
    ("sglang", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": MAX_N + 1}),
    ("vllm", "/v1/completions", {"prompt": "hi", "max_tokens": "many"}),
    ("vllm", "/v1/completions", {"prompt": "hi", "n": 10**9}),
    (
        "vllm",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": BIG},
    ),
    ("vllm", "/inference/v1/generate", {"token_ids": [1, 2], "sampling_params": {"max_tokens": BIG}}),
    ("vllm", "/inference/v1/generate", {"token_ids": [1, "x"], "sampling_params": {"max_tokens": 4}}),
]


@pytest.mark.parametrize(("kind", "path", "body"), REFUSED)
async def test_requests_past_the_bounds_are_refused_up_front(kind, path, body):
    async with fake_fleet(kind, 1) as fleet, httpx.AsyncClient(timeout=30) as client:
        with trio.fail_after(30):
            r = await client.post(fleet.urls[0] + path, json=body)
        assert r.status_code == 400, r.text
        assert "Internal Server Error" not in r.text


async def test_what_fits_is_served_and_the_message_names_the_context_length():
    async with fake_fleet("sglang", 1) as fleet, httpx.AsyncClient(timeout=30) as client:
        ok = await client.post(
            fleet.urls[0] + "/v1/completions", json={"prompt": "hi", "n": MAX_N, "max_tokens": 1}
        )
        assert ok.status_code == 200 and len(ok.json()["choices"]) == MAX_N
        r = await client.post(
            fleet.urls[0] + "/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": BIG}}
        )
        assert "maximum context length of 40960 tokens" in r.json()["error"]


def test_a_busy_port_is_one_line_and_exit_1():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "smgrl", "fake-engine", "--ports", f"0,{port}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"error: cannot listen on 127.0.0.1:{port}: Address already in use"]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("path", ["x" * 5000, "a\x00b"])
async def test_a_disk_load_from_an_impossible_path_is_a_400_not_a_500(path):
    # Found against a live gateway: a refit with a 100,000-character (or NUL) model_path made the
    # fake SGLang engine answer 500 with a traceback (OSError: File name too long) where the
    # real one answers its "Failed to get weights iterator" 400.
    async with fake_fleet("sglang", 1) as fleet, httpx.AsyncClient(timeout=30) as client:
        r = await client.post(fleet.urls[0] + "/update_weights_from_disk", json={"model_path": path})
        assert r.status_code == 400, r.text
        assert r.json()["success"] is False

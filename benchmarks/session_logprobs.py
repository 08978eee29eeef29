#!/usr/bin/env python3
"""What the log-probs of a session turn's chat answer cost (``smgrl.sessions.logprobs``).

    python benchmarks/session_logprobs.py [--tokens 256] [--repeat 200]

Every TITO chat answer carries ``choices[0].logprobs.content``: one batched decode of the
generated ids (each alone, for its token text) and one dict per token, then serialised with the
answer. Measured per turn, in process, with the test tokenizer (``smgrl.tito.testkit``): the
building alone, and the answer's JSON with and without them (median of ``--repeat`` runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
sys.path[:] = [str(_HERE.parent), *(p for p in sys.path if Path(p or ".").resolve() != _HERE)]

from smgrl.core.wire import json_bytes
from smgrl.sessions import answer
from smgrl.sessions import logprobs as chat_logprobs
from smgrl.tito import ChatTokenizer
from smgrl.tito.testkit import make_model_dir


def median_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        chat = ChatTokenizer.load(make_model_dir(Path(tmp) / "tok"))
    ids = chat.encode("The quick brown fox jumps over the lazy dog. " * (args.tokens // 8 + 1))[: args.tokens]
    lps = [-0.5 - (i % 7) / 10 for i in range(len(ids))]
    message = {"role": "assistant", "content": chat.decode(ids)}
    fields = {
        "rid": "chatcmpl-x",
        "model": "m",
        "message": message,
        "finish_reason": "stop",
        "prompt_tokens": 100,
        "completion_tokens": len(ids),
        "version": "1",
    }
    build = median_us(lambda: chat_logprobs.content(chat, ids, lps), args.repeat)
    built = chat_logprobs.content(chat, ids, lps)
    plain = median_us(lambda: json_bytes(answer.completion(**fields)), args.repeat)
    full = median_us(lambda: json_bytes(answer.completion(**fields, logprobs=built)), args.repeat)
    size0 = len(json_bytes(answer.completion(**fields)))
    size1 = len(json_bytes(answer.completion(**fields, logprobs=built)))
    print(f"{len(ids)} generated tokens per turn (median of {args.repeat})")
    print(f"  build logprobs.content: {build:8.1f} us")
    print(f"  answer JSON without:    {plain:8.1f} us  {size0} bytes")
    print(f"  answer JSON with:       {full:8.1f} us  {size1} bytes")
    print(f"  added per turn:         {build + full - plain:8.1f} us, {size1 - size0} bytes")


if __name__ == "__main__":
    main()

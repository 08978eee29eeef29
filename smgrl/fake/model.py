"""The fake model: a tokenizer and a next-token function keyed by the weights' digest.

Token ``i`` of a completion is a hash of (weights digest, prompt, i): deterministic, cheap
(one blake2b per token), different after every refit, identical across engines that loaded
the same checkpoint.
"""

from __future__ import annotations

import hashlib
import zlib
from array import array
from collections.abc import Sequence

EOS_TOKEN_ID = 151645  # Qwen3's <|im_end|>
EOS_TEXT = "<|im_end|>"
VOCAB_BASE = 1000
# An EOS roughly every 97 tokens: most completions stop by themselves, as real ones do.
_EOS_EVERY = 97
VOCAB = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "that",
    "for",
    "it",
    "as",
    "with",
    "was",
    "on",
    "be",
    "by",
    "this",
    "are",
    "from",
    "at",
    "or",
    "an",
    "which",
    "have",
    "not",
    "but",
    "had",
    "they",
    "all",
    "were",
    "can",
    "one",
    "their",
    "there",
    "been",
    "has",
    "more",
    "will",
    "would",
    "when",
    "if",
    "so",
    "what",
    "about",
    "into",
    "than",
    "its",
    "some",
    "could",
    "them",
    "only",
    "other",
    "new",
    "time",
    "these",
    "may",
    "then",
    "do",
    "first",
    "any",
    "like",
    "now",
    "such",
    "our",
    "over",
    "also",
    "after",
    "most",
    "made",
    "where",
    "well",
    "way",
    "even",
    "because",
    "through",
    "reward",
    "policy",
    "gradient",
    "token",
    "model",
    "weight",
    "update",
    "rollout",
    "sample",
    "value",
    "train",
    "step",
    "loss",
]


def tokenize(text: str) -> list[int]:
    """Word-level ids: one token per whitespace-separated word (stable across processes)."""
    return [VOCAB_BASE + len(VOCAB) + zlib.crc32(word.encode()) % 100_000 for word in text.split()]


def decode(ids: Sequence[int]) -> str:
    """Text of ``ids``, skipping special tokens (the engines' skip_special_tokens default)."""
    return "".join(token_text(i) for i in ids if i != EOS_TOKEN_ID)


def token_text(token_id: int) -> str:
    if token_id == EOS_TOKEN_ID:
        return EOS_TEXT
    index = token_id - VOCAB_BASE
    if 0 <= index < len(VOCAB):
        return " " + VOCAB[index]
    return f" <{token_id}>"


def prompt_key(ids: Sequence[int], seed: int | None = None) -> bytes:
    h = hashlib.blake2b(array("q", ids).tobytes(), digest_size=16)
    if seed is not None:
        h.update(b"seed" + str(seed).encode())
    return h.digest()


def next_token(digest: bytes, key: bytes, position: int) -> tuple[int, float]:
    """(token id, logprob) of output position ``position``."""
    raw = hashlib.blake2b(digest + key + position.to_bytes(4, "little"), digest_size=8).digest()
    value = int.from_bytes(raw, "little")
    logprob = -((value >> 20) % 5000) / 1000.0 - 0.0005
    if position > 0 and (value >> 40) % _EOS_EVERY == 0:
        return EOS_TOKEN_ID, logprob
    return VOCAB_BASE + value % len(VOCAB), logprob


def top_logprobs(digest: bytes, key: bytes, position: int, k: int) -> list[tuple[float, int]]:
    """A deterministic top-k list whose first entry is the sampled token."""
    chosen, logprob = next_token(digest, key, position)
    out = [(logprob, chosen)]
    for j in range(1, k):
        alt = VOCAB_BASE + (chosen - VOCAB_BASE + j * 7) % len(VOCAB)
        out.append((logprob - 0.25 * j, alt))
    return out


def prompt_logprob(token_id: int, position: int) -> float:
    return -((hash((token_id, position)) & 0xFFFF) % 3000) / 1000.0 - 0.0005


def prefix_hashes(ids: Sequence[int]) -> list[int]:
    """Rolling hashes of every prompt prefix, for the fake prefix (radix) cache."""
    out = []
    h = 0
    for token in ids:
        h = hash((h, token))
        out.append(h)
    return out

"""The fake model: a tokenizer and an autoregressive next-token function keyed by the weights.

The next token is a hash of (weights digest, the WHOLE context so far, sampling seed): the
context is the prompt plus every token generated, folded into a rolling key, so a generation
continued from ``prompt + first k outputs`` produces exactly the tokens the uninterrupted
generation would have produced after those k (on the same weights). That is what lets a test
check a partial-rollout loopback token by token. Deterministic, cheap (one blake2b per token),
different after every refit, identical across engines that loaded the same checkpoint.

With a real tokenizer (``use_tokenizer(model_dir)``, ``smgrl fake-engine --tokenizer-path``) the
fake tokenizes, generates and decodes with it: prompts are that tokenizer's ids, the end-of-turn
token is its ``eos_token``, generated ids are single-token words of its vocabulary (so they decode
to clean text), and a chat prompt is rendered with its chat template. A prompt may script the
reply: ``[[fake-say:N:"json string"]]`` anywhere in it makes the model generate exactly that text
(then the end-of-turn token); the directive with the highest N wins, so an agent adds a newer one
per turn. A context that already ends with the start of the scripted reply (a loopback continuing
a cut generation) continues it. Log-probs stay hashes of (digest, context).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import zlib
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


_TOKENIZER = None  # smgrl.tito.chat.ChatTokenizer when a real tokenizer is in use
_WORD_IDS: tuple[int, ...] = ()
_EOS_ID = EOS_TOKEN_ID
_SAY = re.compile(r"\[\[fake-say:(\d+):")


def use_tokenizer(path) -> None:
    """Tokenize, generate and decode with the tokenizer of a model directory (None: the fake one)."""
    global _TOKENIZER, _WORD_IDS, _EOS_ID
    if path is None:
        _TOKENIZER, _WORD_IDS, _EOS_ID = None, (), EOS_TOKEN_ID
        return
    from smgrl.tito import ChatTokenizer

    chat = ChatTokenizer.load(path)
    if chat.eos_id is None:
        raise ValueError(f"{path}: the tokenizer has no eos_token")
    words = []
    for word in VOCAB:
        ids = chat.encode(" " + word)
        if len(ids) == 1:
            words.append(ids[0])
    if not words:
        raise ValueError(f"{path}: no vocabulary word is a single token")
    _TOKENIZER, _WORD_IDS, _EOS_ID = chat, tuple(words), chat.eos_id


@contextlib.contextmanager
def tokenizer_scope(path):
    """``use_tokenizer`` for the duration of a block (in-process fakes in tests)."""
    global _TOKENIZER, _WORD_IDS, _EOS_ID
    saved = (_TOKENIZER, _WORD_IDS, _EOS_ID)
    use_tokenizer(path)
    try:
        yield _TOKENIZER
    finally:
        _TOKENIZER, _WORD_IDS, _EOS_ID = saved


def chat_tokenizer():
    return _TOKENIZER


def eos_id() -> int:
    return _EOS_ID


def plan(prompt_ids: Sequence[int]) -> list[int] | None:
    """The rest of the scripted reply of a context (``[[fake-say:N:"..."]]``), as ids ending with
    EOS; or None. The part of the reply the context already ends with is not repeated."""
    if _TOKENIZER is None:
        return None
    text = _TOKENIZER.decode(prompt_ids)
    best: tuple[int, str] | None = None
    for m in _SAY.finditer(text):
        try:
            said, _ = json.JSONDecoder().raw_decode(text, m.end())
        except ValueError:
            continue
        if isinstance(said, str) and (best is None or int(m.group(1)) >= best[0]):
            best = (int(m.group(1)), said)
    if best is None:
        return None
    reply = _TOKENIZER.encode(best[1]) + [_EOS_ID]
    done = 0
    for k in range(min(len(reply) - 1, len(prompt_ids)), 0, -1):
        if list(prompt_ids[-k:]) == reply[:k]:
            done = k
            break
    return reply[done:]


def tokenize(text: str) -> list[int]:
    """Word-level ids: one token per whitespace-separated word (stable across processes)."""
    if _TOKENIZER is not None:
        return _TOKENIZER.encode(text)
    return [VOCAB_BASE + len(VOCAB) + zlib.crc32(word.encode()) % 100_000 for word in text.split()]


def decode(ids: Sequence[int]) -> str:
    """Text of ``ids``, skipping special tokens (the engines' skip_special_tokens default)."""
    if _TOKENIZER is not None:
        return _TOKENIZER.tokenizer.decode(list(ids), skip_special_tokens=True)
    return "".join(token_text(i) for i in ids if i != EOS_TOKEN_ID)


def token_text(token_id: int) -> str:
    if _TOKENIZER is not None:
        return _TOKENIZER.decode([token_id])
    if token_id == EOS_TOKEN_ID:
        return EOS_TEXT
    index = token_id - VOCAB_BASE
    if 0 <= index < len(VOCAB):
        return " " + VOCAB[index]
    return f" <{token_id}>"


_KEY_MOD = (1 << 61) - 1  # a Mersenne prime: the rolling context key stays in 8 bytes
_KEY_MUL = 1_000_003


def extend_key(key: int, token: int) -> int:
    """The context key after appending ``token``."""
    return (key * _KEY_MUL + token + 1) % _KEY_MOD


def context_key(ids: Sequence[int]) -> int:
    """The rolling key of a whole context (``extend_key`` folded over ``ids``)."""
    key = 0
    for token in ids:
        key = (key * _KEY_MUL + token + 1) % _KEY_MOD
    return key


def _draw(digest: bytes, key: int, seed: int | None) -> int:
    salt = b"" if seed is None else b"seed" + str(seed).encode()
    raw = hashlib.blake2b(digest + key.to_bytes(8, "little") + salt, digest_size=8).digest()
    return int.from_bytes(raw, "little")


def next_token(
    digest: bytes, key: int, seed: int | None = None, planned: Sequence[int] | None = None, position: int = 0
) -> tuple[int, float]:
    """(token id, logprob) following the context whose rolling key is ``key``; with a scripted
    reply (``plan``), its token at output ``position``."""
    value = _draw(digest, key, seed)
    logprob = -((value >> 20) % 5000) / 1000.0 - 0.0005
    if planned is not None:
        return (planned[position] if position < len(planned) else _EOS_ID), logprob
    if (value >> 40) % _EOS_EVERY == 0:
        return _EOS_ID, logprob
    if _WORD_IDS:
        return _WORD_IDS[value % len(_WORD_IDS)], logprob
    return VOCAB_BASE + value % len(VOCAB), logprob


def generate(digest: bytes, ids: Sequence[int], n: int, seed: int | None = None) -> list[int]:
    """The ``n`` tokens (EOS included, none after it) an engine on ``digest`` generates after
    ``ids``: the reference a test compares a relayed answer with."""
    key = context_key(ids)
    out: list[int] = []
    for _ in range(n):
        token, _ = next_token(digest, key, seed)
        out.append(token)
        if token == _EOS_ID:
            break
        key = extend_key(key, token)
    return out


def top_logprobs(digest: bytes, key: int, seed: int | None, k: int) -> list[tuple[float, int]]:
    """A deterministic top-k list whose first entry is the sampled token."""
    chosen, logprob = next_token(digest, key, seed)
    out = [(logprob, chosen)]
    for j in range(1, k):
        if _WORD_IDS:
            out.append((logprob - 0.25 * j, _WORD_IDS[(j * 7) % len(_WORD_IDS)]))
            continue
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

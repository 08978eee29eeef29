"""The ``choices[0].logprobs`` of a session turn's chat answer, from the captured log-probs.

PSRL's TITO verifier reads them in every chat answer (it sends no ``logprobs`` field); SMG's
TITO suppresses them (``null``) though it asks the engine for them. smgrl always answers them:
the engine's sampled-token log-probs (already returned for the capture), one entry per
generated token, with the token's text as the model's tokenizer decodes it alone (one batched
decode per turn). ``top_logprobs`` is empty (the engines are asked for the sampled token only)
and ``bytes`` null (OpenAI allows it; the byte lists tripled the answer's serialisation time).
"""

from __future__ import annotations

from collections.abc import Sequence


def content(chat, output_ids: Sequence[int], logprobs: Sequence[float] | None) -> dict | None:
    """OpenAI's ``{"content": [{token, logprob, bytes, top_logprobs}], "refusal": null}``, or
    None when the engine reported no log-probs (a looped-back turn whose segments disagreed)."""
    if logprobs is None or len(logprobs) != len(output_ids):
        return None
    texts = chat.tokenizer.decode_batch([[i] for i in output_ids], skip_special_tokens=False)
    return {
        "content": [
            {"token": text, "logprob": float(lp), "bytes": None, "top_logprobs": []}
            for text, lp in zip(texts, logprobs, strict=True)
        ],
        "refusal": None,
    }

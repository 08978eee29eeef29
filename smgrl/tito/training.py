"""Training arrays from a session snapshot (docs/sessions.md, PSRL's ``build_training_data``), plus provenance.

``build_training_data(accumulated_token_ids, records, max_trim_tokens=0, prompt_ids_override=None)``
has PSRL's signature and results: ``prompt_ids``, ``response_ids``, ``response_mask`` (1 = a token
the model generated, 0 = environment: tool results, user turns, template glue), ``logprobs`` (0.0 for
environment tokens), ``routed_experts`` (None unless a record has them) and ``num_turns``.

``training_data(snapshot)`` applies it to every trajectory of a ``GET /sessions/{sid}`` snapshot and
adds, aligned with ``response_ids``: ``versions`` (the weight version that produced each model token,
None for environment tokens), ``token_turns`` (index of the turn) and ``token_engines`` (the engine
that produced it), plus ``trajectory_id`` and the last turn's ``finish_reason``.

Plain lists; numpy is imported only to decode routed experts.
"""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Mapping, Sequence

log = logging.getLogger("smgrl.tito")


def _get(record, key, default=None):
    if isinstance(record, Mapping):
        return record.get(key, default)
    return getattr(record, key, default)


def _walk(acc: Sequence[int], records: Sequence, max_trim_tokens: int):
    """Yield ``(token_id, mask, logprob, turn_index, output_index)`` for every response token."""
    cursor = 0
    n = len(records)
    for i, rec in enumerate(records):
        p = int(_get(rec, "prompt_token_count"))
        pairs = _get(rec, "output_logprobs") or []
        if cursor > 0 and p > cursor:
            for tok in acc[cursor:p]:
                yield tok, 0, 0.0, None, None
        if pairs:
            out_ids = [int(pair[1]) for pair in pairs]
            out_lps = [float(pair[0]) if pair[0] is not None else 0.0 for pair in pairs]
        elif p < len(acc):
            end = int(_get(records[i + 1], "prompt_token_count")) if i + 1 < n else len(acc)
            log.warning("TITO turn %d has no output log-probs; taking ids from the accumulated tokens", i)
            out_ids = list(acc[p:end])
            out_lps = [0.0] * len(out_ids)
        else:
            out_ids, out_lps = [], []
        if i < n - 1:
            matched = 0
            while matched < len(out_ids) and p + matched < len(acc) and out_ids[matched] == acc[p + matched]:
                matched += 1
            trim = len(out_ids) - matched
            if trim > max_trim_tokens:
                raise ValueError(
                    f"TITO trailing trim overflow at turn {i}: {trim} unmatched output tokens "
                    f"exceed max_trim_tokens={max_trim_tokens}"
                )
            out_ids, out_lps = out_ids[:matched], out_lps[:matched]
        for j, (tok, lp) in enumerate(zip(out_ids, out_lps, strict=True)):
            yield tok, 1, lp, i, j
        cursor = p + len(out_ids)


def _routed_experts(records, total_rows: int):
    blobs = [_get(r, "routed_experts") for r in records]
    blobs = [b for b in blobs if b]
    if not blobs:
        return None
    import numpy as np  # only a caller with routed experts needs numpy

    arrays = [
        (np.load(io.BytesIO(base64.b64decode(b["data"]))), int(b.get("prompt_start", 0))) for b in blobs
    ]
    first = arrays[0][0]
    out = np.zeros((max(total_rows, 0), first.shape[1], first.shape[2]), dtype=first.dtype)
    for arr, start in arrays:
        stop = min(start + arr.shape[0], out.shape[0])
        if stop > start:
            out[start:stop] = arr[: stop - start]
    return out


def _build(accumulated_token_ids, records, max_trim_tokens, prompt_ids_override):
    acc = list(accumulated_token_ids)
    if not records:
        empty = {
            "prompt_ids": [],
            "response_ids": [],
            "response_mask": [],
            "logprobs": [],
            "routed_experts": None,
            "num_turns": 0,
        }
        return empty, []
    ids, mask, lps, where = [], [], [], []
    for tok, m, lp, turn, j in _walk(acc, records, max_trim_tokens):
        ids.append(tok)
        mask.append(m)
        lps.append(lp)
        where.append((turn, j))
    prompt = (
        list(prompt_ids_override)
        if prompt_ids_override is not None
        else acc[: int(_get(records[0], "prompt_token_count"))]
    )
    result = {
        "prompt_ids": prompt,
        "response_ids": ids,
        "response_mask": mask,
        "logprobs": lps,
        "routed_experts": _routed_experts(records, len(prompt) + len(ids) - 1),
        "num_turns": len(records),
    }
    return result, where


def build_training_data(accumulated_token_ids, records, max_trim_tokens=0, prompt_ids_override=None) -> dict:
    return _build(accumulated_token_ids, records, max_trim_tokens, prompt_ids_override)[0]


def token_version(record, j: int):
    """Version of output token ``j`` of a turn: its segment's span when the turn was looped back
    across a weight sync, else the turn's version."""
    for span in _get(record, "weight_versions") or ():
        if span["start"] <= j < span["end"]:
            return span["version"]
    return _get(record, "weight_version")


def token_engine(record, j: int):
    """Engine (URL) that generated output token ``j`` of a turn: its segment's when the turn was
    looped back (the continuation may run elsewhere), else the turn's."""
    for seg in _get(record, "segments") or ():
        if seg["start"] <= j < seg["end"]:
            return seg["url"]
    return _get(record, "engine")


def training_data(snapshot: Mapping, *, max_trim_tokens: int | None = None) -> list[dict]:
    """One training result per trajectory of a session snapshot, with per-token provenance."""
    trajectories = snapshot.get("trajectories")
    if not isinstance(trajectories, list):
        raise TypeError("snapshot.trajectories must be a list")
    trim = snapshot.get("max_trim_tokens", 0) if max_trim_tokens is None else max_trim_tokens
    out = []
    for t in trajectories:
        records = t.get("records") or []
        result, where = _build(t.get("accumulated_token_ids") or [], records, trim, None)
        versions, turns, engines = [], [], []
        for turn, j in where:
            if turn is None:
                versions.append(None)
                turns.append(None)
                engines.append(None)
            else:
                rec = records[turn]
                versions.append(token_version(rec, j))
                turns.append(turn)
                engines.append(token_engine(rec, j))
        result.update(
            trajectory_id=t.get("trajectory_id"),
            finish_reason=_get(records[-1], "finish_reason") if records else None,
            versions=versions,
            token_turns=turns,
            token_engines=engines,
        )
        out.append(result)
    return out

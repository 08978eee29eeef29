"""Bulk work on the event loop in slices, a checkpoint between them: long runs of token ids
turned into JSON or compared, and large JSON answers (a session's snapshot), each byte for byte
what the one-call version gives. One call over millions of ids holds the loop for up to a
second; a slice of ``SLICE`` ids is well under a millisecond of CPU.

Long runs of ids are ``array('i')`` (``smgrl.tito.ids``: the garbage collector does not walk
them); each function here takes them or lists alike.
"""

from __future__ import annotations

import array
import json
from collections.abc import Sequence
from typing import Any

import trio

from smgrl.core.wire import json_bytes

__all__ = ["SLICE", "encode_ids", "encode_json", "ids_array", "same_prefix"]

SLICE = 8_192


def ids_array(data: bytes) -> array.array:
    """The ids of an ``array('i')``'s bytes (a worker's answer), as that array: one memory copy,
    no int object made (a list of them would cost the loop a second, and every full garbage
    collection a walk of each)."""
    arr = array.array("i")
    arr.frombytes(data)
    return arr


def _part(ids: Sequence[int], i: int, j: int) -> list[int]:
    part = ids[i:j]
    return part.tolist() if type(part) is array.array else list(part)


async def encode_ids(ids: Sequence[int]) -> bytes:
    """``json.dumps(list(ids)).encode()`` byte for byte, encoded in slices between checkpoints."""
    parts = []
    for i in range(0, len(ids), SLICE):
        parts.append(json.dumps(_part(ids, i, i + SLICE))[1:-1])
        await trio.lowlevel.checkpoint()
    return ("[" + ", ".join(parts) + "]").encode()


async def same_prefix(a: Sequence[int], b: Sequence[int], n: int) -> bool:
    """``list(a[:n]) == list(b[:n])``, compared in slices between checkpoints (a list and an
    array of the same ids are the same here)."""
    if min(len(a), n) != min(len(b), n):
        return False
    mixed = type(a) is not type(b)
    for i in range(0, min(len(a), n), SLICE):
        j = min(i + SLICE, n)
        if (_part(a, i, j) != _part(b, i, j)) if mixed else (a[i:j] != b[i:j]):
            return False
        await trio.lowlevel.checkpoint()
    return True


# How much text (as ``_small`` counts it) one json call on the loop may encode.
JSON_BUDGET = 1 << 18


async def encode_json(value: Any) -> bytes:
    """``json_bytes(value)`` byte for byte, encoded in pieces of at most about ``JSON_BUDGET``
    with a checkpoint after each large one (a snapshot of millions of ids: one call held the loop
    0.7 s): lists and ``array('i')`` of ids in slices, dicts member by member, small values in
    one call."""
    out: list[bytes] = []
    await _encode(value, out)
    return b"".join(out)


_SCALARS = frozenset((int, float, bool, type(None)))


def _small(value: Any) -> bool:
    """Whether one json call on ``value`` is cheap: at most about ``JSON_BUDGET`` characters,
    numbers counted 16 each, and no list or dict of more than ``SLICE`` items (told without
    walking it: a walk that stacked a million ids would cost what it is meant to avoid). An
    array is never small: ``json_bytes`` does not take it."""
    n = 0
    stack = [value]
    while stack:
        v = stack.pop()
        kind = type(v)
        if kind is array.array:
            return False
        if kind is str:
            n += len(v)
        elif kind in (dict, list, tuple):
            if len(v) > SLICE:
                return False
            n += 16
            if kind is dict:
                n += sum(len(k) if type(k) is str else 16 for k in v)
                stack.extend(v.values())
            else:
                stack.extend(v)
        else:
            n += 16
        if n > JSON_BUDGET:
            return False
    return True


async def _encode(value: Any, out: list[bytes]) -> None:
    kind = type(value)
    if kind is array.array:
        # Ids: a list's JSON, written a slice at a time.
        out.append(b"[")
        for i in range(0, len(value), SLICE):
            text = json_bytes(value[i : i + SLICE].tolist())[1:-1]
            out.append(text if i == 0 else b"," + text)
            await trio.lowlevel.checkpoint()
        out.append(b"]")
        return
    if kind not in (dict, list, tuple) or _small(value):
        out.append(json_bytes(value))
        await trio.lowlevel.checkpoint()
        return
    if kind is dict:
        sep = b"{"
        for k, v in value.items():
            out.append(sep + (json_bytes(k) if type(k) is str else json_bytes({k: 0})[1:-3]) + b":")
            sep = b","
            await _encode(v, out)
        out.append(b"}" if sep == b"," else b"{}")
        return
    out.append(b"[")
    first = True
    for i in range(0, len(value), SLICE):
        first = await _items(value[i : i + SLICE], out, first)
    out.append(b"]")


async def _items(part: Sequence[Any], out: list[bytes], first: bool) -> bool:
    """A run of a list's items (after the first one written unless ``first``): one call when
    small, else halved until it is (a single large item is encoded as a value of its own)."""
    # Token ids and log-probs are numbers only (told by one pass in C): one call for the run.
    if set(map(type, part)) <= _SCALARS or _small(list(part)):
        text = json_bytes(list(part))[1:-1]
        if text:
            out.append(text if first else b"," + text)
            first = False
        await trio.lowlevel.checkpoint()
        return first
    if len(part) == 1:
        if not first:
            out.append(b",")
        await _encode(part[0], out)
        return False
    mid = len(part) // 2
    first = await _items(part[:mid], out, first)
    return await _items(part[mid:], out, first)

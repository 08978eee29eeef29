"""The ids smgrl makes, all from UUIDv7 (pure but for the clock and ``os.urandom``): worker ids,
operation ids, process and group ids (``new_hex_id``) and short tags (``new_tag``). The one
exception is a session id, a bearer of its session: random throughout (smgrl/sessions/state.py). SMG's worker ids are UUIDv7; operation ids follow suit so that both sort by when
they were made. (Request ids are the HTTP layer's: ``x-request-id``, SMG's format.) A call to an
engine that needs an id of its own for every request (``new_call_id``) takes a per-process
prefix and a counter: one is made per rollout, where a UUID's ``os.urandom`` was a syscall each."""

from __future__ import annotations

import itertools
import os
import time
import uuid


def uuid7(now_ms: int | None = None) -> str:
    """A UUIDv7 string (48-bit millisecond timestamp, version 7, variant 10, 74 random bits)."""
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= ((rand >> 62) & 0xFFF) << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    return str(uuid.UUID(int=value))


def new_worker_id() -> str:
    """A worker id (a registration, or one rank of a dp-aware engine)."""
    return uuid7()


def new_operation_id() -> str:
    """An operation id (one control call or fan-out, as the journal records it)."""
    return uuid7()


def new_hex_id() -> str:
    """A UUIDv7 as 32 hex digits (process, group and gateway ids)."""
    return uuid.UUID(uuid7()).hex


def new_tag(length: int) -> str:
    """A short id: the random end of a UUIDv7 (its start is the clock, alike for ids made in the
    same millisecond), ``length`` hex digits (at most 18: the 74 random bits' whole hex digits)."""
    if not 1 <= length <= 18:
        raise ValueError("a tag is 1 to 18 hex digits")
    return new_hex_id()[-length:]


# ``new_call_id``'s state: a random prefix per process and a counter. A forked child (PSRL forks
# after importing the gateway) draws its own prefix, so parent and child never repeat an id.
_CALL_PREFIX = os.urandom(8).hex()
_calls = itertools.count(1)


def _fresh_calls() -> None:
    global _CALL_PREFIX, _calls
    _CALL_PREFIX, _calls = os.urandom(8).hex(), itertools.count(1)


os.register_at_fork(after_in_child=_fresh_calls)


def new_call_id() -> str:
    """An id unique to one engine call of this process (an engine's request id, which its Abort
    names): 16 random hex digits per process, then a counter. Not secret: it names a request to
    an engine and in the answer."""
    return f"{_CALL_PREFIX}{next(_calls):08x}"


MAX_WORKER_ID = 128
_WORKER_ID_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def worker_id_problem(text: object) -> str | None:
    """None for a worker id a registration may choose (PSRL names its replicas ``"0"``,
    ``"1"``...): 1-128 characters of letters, digits and ``. _ : -`` (safe in a URL path, a
    journal stream name and a log line); else what is wrong with it."""
    if not isinstance(text, str):
        return "must be a string"
    if not 0 < len(text) <= MAX_WORKER_ID:
        return f"must be 1-{MAX_WORKER_ID} characters"
    bad = next((ch for ch in text if ch not in _WORKER_ID_CHARS), None)
    if bad is not None:
        return f"may hold letters, digits and . _ : - only (found {bad!r})"
    return None

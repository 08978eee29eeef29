"""Token ids as the gateway holds them: a list while short, an ``array('i')`` once long.

Each full (generation 2) collection of the cyclic garbage collector visits every item of every
list alive (a list is gc-tracked, and every id above 256 is an int object of its own): a session
turn of 1.6 million ids held as a list adds about 10-17 ms of CPU to every full collection, and the
young collection that first meets the new list walks it too (about 20-30 ms), all of it on the
event loop, whichever request happened to trigger it (docs/benchmarks.md, "Stalls by hostile
shape"). An ``array('i')`` holds its ids as C ints,
4 bytes each, not objects: the collector visits it as one object (its only referent is its
type), however long it is. So:

- a sequence longer than ``PACK_AT`` is held as an array: a miss's prompt (``compact``, in the
  worker thread that tokenized it), a hit's prompt built on an array (``joined``), a captured
  turn's ids (``joined``, ``held``: a session's tree never holds a long list either, however many
  turns it keeps), and a large turn's ids throughout (they come from the worker processes as an
  array's bytes);
- a short one stays a list, exactly as before (the common small turn pays a type check).

A list never equals an array (``[1] == array('i', [1])`` is False): ids are compared through
``same_prefix``, never with ``==`` across the two forms. An id that does not fit 32 bits (an
engine answering nonsense) keeps its sequence a list: the ids stay exact either way.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence

__all__ = ["PACK_AT", "compact", "held", "is_packed", "joined", "packed", "same_prefix"]

PACK_AT = 8192

Ids = list[int] | array


def is_packed(ids: object) -> bool:
    return type(ids) is array


def packed(ids: Sequence[int]) -> Ids:
    """A copy of ``ids`` as an ``array('i')`` (a list when an id does not fit 32 bits).
    ``fromlist``: half the time of ``array('i', a_list)`` (about 30 ns per id)."""
    try:
        if type(ids) is list:
            out = array("i")
            out.fromlist(ids)  # unchanged when it raises
            return out
        return array("i", ids)
    except OverflowError:
        return list(ids)


def compact(ids: Sequence[int]) -> Sequence[int]:
    """``ids`` itself when short or already an array, else a packed copy (``packed``): what a
    plan holds, built where the ids were made (a worker thread for a long turn), so a long list
    is never kept."""
    if type(ids) is array or len(ids) <= PACK_AT:
        return ids
    return packed(ids)


def held(ids: Sequence[int]) -> Ids:
    """A copy of ``ids`` to store: an array stays one, a list longer than ``PACK_AT`` becomes
    one, a short one stays a list."""
    if type(ids) is array:
        return ids[:]
    if len(ids) > PACK_AT:
        return packed(ids)
    return list(ids)


def joined(a: Sequence[int], b: Sequence[int]) -> Ids:
    """``a`` followed by ``b``, a new sequence: a list when neither is an array and both are no
    longer than ``PACK_AT`` together, else an array (when every id fits)."""
    if type(a) is not array and type(b) is not array and len(a) + len(b) <= PACK_AT:
        return (a if type(a) is list else list(a)) + (b if type(b) is list else list(b))
    out = packed(a)
    if type(out) is array:
        try:
            if type(b) is list:
                out.fromlist(b)
            else:
                out.extend(b)
            return out
        except (OverflowError, TypeError):
            pass
    return list(a) + list(b)


def same_prefix(a: Sequence[int], b: Sequence[int], n: int) -> bool:
    """``a[:n] == b[:n]`` whichever form each is in."""
    x, y = a[:n], b[:n]
    if type(x) is type(y):
        return x == y
    return list(x) == list(y)

"""A batch of the journal writer's queue and the receipt of one event in it.

A batch is what one transaction commits: appenders add to the open batch and wait on its
``done``; the writer sets ``recorded`` (or ``error``) and wakes them all at once.
"""

from __future__ import annotations

import attrs
import trio

from .base import Append, Expect
from .codec import Recorded
from .errors import JournalConflict, JournalWriteError

# The writer's lifecycle (journal/writer.py): new -> running (run()) -> closing -> closed.
_NEW, _RUNNING, _CLOSING, _CLOSED = "new", "running", "closing", "closed"


@attrs.define(eq=False, slots=True)
class _Batch:
    """Events committed together; one trio.Event wakes all their waiters at once."""

    items: list[Append] = attrs.Factory(list)
    created: float = attrs.Factory(trio.current_time)  # when its first event arrived
    sealed: bool = False  # an append_many group: nothing else joins it
    expect: Expect | None = None  # an append_if group: committed only if this holds
    done: trio.Event = attrs.Factory(trio.Event)
    recorded: list[Recorded] | None = None
    error: BaseException | None = None


@attrs.frozen(slots=True, eq=False)
class Pending:
    """The receipt of an enqueued event: ``await pending.wait()`` for its Recorded once committed."""

    _batch: _Batch
    _index: int

    @property
    def done(self) -> bool:
        """True once the batch holding this event committed or failed."""
        return self._batch.done.is_set()

    async def wait(self) -> Recorded:
        """The Recorded event once its batch committed; JournalWriteError if the batch failed.

        Cancelling this wait does not withdraw the event: it is still written (see ``append``).
        """
        await self._batch.done.wait()
        return _result(self._batch, self._index)

    def result(self) -> Recorded:
        """``wait()``'s answer once ``done`` (without a schedule point); RuntimeError before."""
        if not self._batch.done.is_set():
            raise RuntimeError("the event's batch is not committed yet")
        return _result(self._batch, self._index)


def _result(batch: _Batch, index: int) -> Recorded:
    if isinstance(batch.error, JournalConflict):
        # Not a failure of the journal: the caller's decision is stale. Fresh instance per waiter.
        err = batch.error
        raise JournalConflict(str(err), head=err.head, seq=err.seq) from None
    if batch.error is not None:
        # A fresh exception per waiter: one shared instance would have its traceback rewritten by
        # every task that raises it.
        cls = type(batch.error) if isinstance(batch.error, JournalWriteError) else JournalWriteError
        raise cls(f"journal write failed: {batch.error}") from batch.error
    assert batch.recorded is not None
    return batch.recorded[index]

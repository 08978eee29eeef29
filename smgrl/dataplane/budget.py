"""The data plane's memory budget: bytes of rollout bodies held at once (pure, no I/O).

A rollout request holds its whole body (read before routing, forwarded byte for byte) and, when
it is not streamed, the engine's whole answer (stamped before it is sent). Per-request limits
alone do not bound the sum: 4,096 admitted requests at their limits would need terabytes. So
every held byte is taken from one budget (``--dataplane-memory-budget``) before it is kept: a
declared body is refused (503 ``memory_budget_exceeded``, retryable) before a byte of it is
read, a chunked body or a buffered answer as soon as it would go over. Streamed answers are
relayed chunk by chunk and hold nothing. ``docs/data-plane.md`` and ``docs/benchmarks.md`` give
the worst case in RSS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from smgrl.core.errors import MemoryBudgetExceeded
from smgrl.core.numbers import parse_uint

if TYPE_CHECKING:
    from smgrl.upstream import Response


class ByteBudget:
    __slots__ = ("limit", "used")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def hold(self) -> Hold:
        return Hold(self)


class Hold:
    """One request's share of the budget: ``take`` as bytes are kept, ``release`` once at the end."""

    __slots__ = ("budget", "held")

    def __init__(self, budget: ByteBudget) -> None:
        self.budget = budget
        self.held = 0

    def take(self, n: int) -> None:
        budget = self.budget
        if budget.used + n > budget.limit:
            raise MemoryBudgetExceeded(
                f"the gateway holds {budget.used} bytes of rollout bodies and answers; {n} more would "
                f"exceed --dataplane-memory-budget ({budget.limit}): retry"
            )
        budget.used += n
        self.held += n

    def back_to(self, mark: int) -> None:
        """Give back what was taken since ``held`` was ``mark`` (an answer a retry discards)."""
        self.budget.used -= self.held - mark
        self.held = mark

    def release(self) -> None:
        self.budget.used -= self.held
        self.held = 0


def reserve_answer(hold: Hold | None, response: Response, limit: int) -> Callable[[int], None] | None:
    """Take a buffered answer's bytes from the memory budget: a declared length (up to
    ``limit``) at once, before a byte is read (concurrent readers taking piece by piece could
    each get part of the budget and all fail), else each piece as it arrives (the
    ``on_data`` this returns, for ``read_bounded``)."""
    if hold is None:
        return None
    length = response.header(b"content-length")
    size = parse_uint(length)
    if size is not None and size <= limit:
        hold.take(size)
        return None
    return hold.take

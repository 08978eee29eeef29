"""A bound on the server-sent event streams open at once (``GET /v1/rl/journal/stream`` and
``GET /v1/rl/refits/{id}/events``), shared by both routes.

Every open stream costs work on the commit path or on every refit change: the journal tail pushes
each committed batch to every subscriber, and every refit change wakes every refit stream, which
renders its record again. Found against a live gateway: 1,000 idle journal streams (read role, or
no key at all on a gateway without keys) took a control call's p90 from 13 ms to 1.9 s. Past
``--max-event-streams`` a new stream is refused at once with 429 ``too_many_streams``.

Counted while the stream's generator runs (incremented on its first step, decremented in its
``finally``): a response whose body is never iterated (the client left before the first byte)
holds nothing, so no slot can leak. Requests admitted together may overshoot the bound by the
streams still starting; it is a bound on cost, not an exact count.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from smgrl.core.errors import TooManyStreams


class EventStreams:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0

    def admit(self) -> None:
        """Raise :class:`TooManyStreams` when ``limit`` streams are open."""
        if self.open >= self.limit:
            raise TooManyStreams(
                f"{self.open} event streams are open (--max-event-streams {self.limit}); retry later"
            )

    async def counted(self, stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        self.open += 1
        try:
            async for chunk in stream:
                yield chunk
        finally:
            self.open -= 1

"""A concurrency bound of their own for large control-plane request bodies (ASGI middleware).

Control-plane routes keep SMG's ``--max-payload-size`` (512 MiB by default: a tensor refit's body
can be that large), and Quart reads such a body whole. Unbounded, a few dozen of them at once
would need tens of GiB. So a request to the control plane (everything the data-plane front
passes on) that declares a body over ``LARGE`` bytes, or does not declare its length, waits for
one of ``--max-concurrent-large-bodies`` slots before its body is read, and holds it until it is
answered: the worst case is that many bodies at the limit. Small bodies (discovery, pause,
version writes) never wait.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import trio

from smgrl.core.numbers import parse_uint

Scope = dict[str, Any]
LARGE = 1 << 20  # 1 MiB: every control call but tensor refits and big registrations is smaller


def body_timeout(cfg) -> int:
    """Seconds a control request may take to send its body (Quart's ``BODY_TIMEOUT``; also the
    raw engine-route front's, smgrl/http/fronts/rl_front.py): a large body may legitimately arrive
    slowly, the request timeout bounds it."""
    return max(60, int(cfg.request_timeout_secs))


class ControlBodyBound:
    def __init__(self, inner: Callable[..., Awaitable[None]], slots: int) -> None:
        self.inner = inner
        self.slots = trio.Semaphore(slots)

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http" or not _large(scope):
            await self.inner(scope, receive, send)
            return
        # Held until the answer is sent: the body stays in memory while the handler runs.
        async with self.slots:
            await self.inner(scope, receive, send)


def _large(scope: Scope) -> bool:
    length = None
    chunked = False
    for key, value in scope["headers"]:
        if key == b"content-length":
            length = value
        elif key == b"transfer-encoding":
            chunked = True
    if length is not None:
        size = parse_uint(length)
        return size is None or size > LARGE
    return chunked

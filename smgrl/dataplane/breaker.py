"""Per-engine circuit breakers (SMG's ``--cb-*``). Pure: time comes in as an argument.

An engine that keeps failing rollout requests (connection errors, 5xx answers) is taken out of
routing for a while instead of eating retries:

- **closed**: requests flow; failures inside the last ``window_secs`` are counted, and
  ``failure_threshold`` of them open the breaker;
- **open**: no request is routed to the engine for ``timeout_secs``;
- **half-open**: requests flow again as trials; ``success_threshold`` successes in a row close
  it, one failure opens it again.

Only the data plane records outcomes: control calls (``/v1/rl``) never touch a breaker, so a
paused or refitting engine never trips one, and an open breaker never blocks a refit.
"""

from __future__ import annotations

import collections
from collections.abc import Container, Iterable

import attrs

from smgrl.core.config import BreakerConfig

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@attrs.define
class Breaker:
    config: BreakerConfig
    state: str = CLOSED
    failures: collections.deque = attrs.field(factory=collections.deque)
    opened_at: float = 0.0
    successes: int = 0

    def allows(self, now: float) -> bool:
        if self.state == OPEN:
            if now - self.opened_at < self.config.timeout_secs:
                return False
            self.state, self.successes = HALF_OPEN, 0
        return True

    def reopens_at(self) -> float:
        return self.opened_at + self.config.timeout_secs

    def record(self, success: bool, now: float) -> None:
        cfg = self.config
        if self.state == HALF_OPEN:
            if not success:
                self._open(now)
                return
            self.successes += 1
            if self.successes >= cfg.success_threshold:
                self.state = CLOSED
                self.failures.clear()
            return
        if self.state == OPEN:
            return  # an answer from before it opened
        if success:
            return
        failures = self.failures
        failures.append(now)
        while failures and now - failures[0] > cfg.window_secs:
            failures.popleft()
        if len(failures) >= cfg.failure_threshold:
            self._open(now)

    def _open(self, now: float) -> None:
        self.state, self.opened_at, self.successes = OPEN, now, 0
        self.failures.clear()


class Breakers:
    """One breaker per engine address, created on first use; disabled = never open."""

    def __init__(self, config: BreakerConfig, *, enabled: bool = True) -> None:
        self.config = config
        self.enabled = enabled
        self.by_engine: dict[str, Breaker] = {}
        self.open_count = 0  # how many are not closed: the hot path skips the filter at 0

    def _get(self, base_url: str) -> Breaker:
        breaker = self.by_engine.get(base_url)
        if breaker is None:
            breaker = self.by_engine[base_url] = Breaker(self.config)
        return breaker

    def allows(self, base_url: str, now: float) -> bool:
        if not self.enabled or not self.open_count:
            return True
        breaker = self.by_engine.get(base_url)
        return breaker is None or breaker.allows(now)

    def next_reopen(self, among: Iterable[str]) -> float | None:
        """When the first open breaker among these engines goes half-open. Only the engines a
        request could use count: an open breaker of an engine held out (paused, removed) is
        never consulted, so its reopen time stays in the past and waiting on it would spin."""
        by_engine = self.by_engine
        times = [
            b.reopens_at() for b in (by_engine.get(u) for u in among) if b is not None and b.state == OPEN
        ]
        return min(times) if times else None

    def prune(self, keep: Container[str]) -> None:
        """Forget the breakers of engines no longer in the routing table."""
        for base_url in [u for u in self.by_engine if u not in keep]:
            if self.by_engine.pop(base_url).state != CLOSED:
                self.open_count -= 1

    def record(self, base_url: str, success: bool, now: float) -> None:
        if not self.enabled:
            return
        breaker = self.by_engine.get(base_url)
        if breaker is None:
            if success:
                return  # nothing to remember about a healthy engine
            breaker = self._get(base_url)
        before = breaker.state
        breaker.record(success, now)
        if before == CLOSED and breaker.state != CLOSED:
            self.open_count += 1
        elif before != CLOSED and breaker.state == CLOSED:
            self.open_count -= 1

    def state(self, base_url: str) -> str:
        breaker = self.by_engine.get(base_url)
        return CLOSED if breaker is None else breaker.state

"""One session's in-memory state: its capture tree, routing memory and the hang/continue machine.

State machine (PSRL SessionRouter's hang and continue controls, docs/sessions.md): ``running`` -hang, idle-> ``hung``; ``running``
-hang, busy-> ``running`` + ``marked_for_hang`` -last turn ends-> ``hung``; ``hung``/marked
-continue-> ``running`` (optionally arming a one-shot instance pin); any -delete-> ``closing``
(new turns 409, waiters released, in-flight turns drain, then it is removed). A hang never
aborts work in flight.
"""

from __future__ import annotations

import uuid

import attrs
import trio

from smgrl.core.ids import new_tag
from smgrl.tito import CaptureTree

# Default headers a session stores at creation (lower-cased), PSRL's allow-list.
DEFAULT_HEADERS = (
    "x-prompt-id",
    "x-request-id",
    "x-is-validate",
    "x-is-sticky",
    "x-version-tag",
    "x-base-worker-id",
    "x-target-dp-rank",
    "x-smg-prompt-too-long-limit",
)


def new_owner_id() -> str:
    """The id of this gateway process's session store (a restart gets a new one)."""
    return new_tag(12)


def new_session_id(owner: str) -> str:
    # Random throughout (uuid4), not a UUIDv7: a session id is the bearer of its session when no
    # data-plane keys are configured, so it must not be guessable from the time it was made.
    return f"{owner}-{uuid.uuid4().hex}"


def owner_of(session_id: str) -> str | None:
    """The owner part of a well-formed session id, else None."""
    owner, sep, rest = session_id.partition("-")
    if sep and len(owner) == 12 and len(rest) == 32 and all(c in "0123456789abcdef" for c in owner + rest):
        return owner
    return None


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@attrs.define(eq=False)
class Session:
    id: str
    tree: CaptureTree
    api: str = "sessions"
    headers: dict[str, str] = attrs.field(factory=dict)
    sticky: bool = False
    floor: str | None = None  # the version floor (x-version-tag), pinned by the first turn
    instance: tuple[str, int] | None = None  # (worker group, dp rank) of the last turn
    worker_id: str | None = None
    pin_once: tuple[str, int] | None = None
    inflight: int = 0
    closing: bool = False
    hang_state: str = "running"
    marked_for_hang: bool = False
    turns: int = 0
    total_tokens: int = 0
    created: float = 0.0
    last_active: float = 0.0  # when a turn last began or ended, or it was created or continued
    drained: trio.Event = attrs.field(factory=trio.Event)
    continue_event: trio.Event = attrs.field(factory=trio.Event)

    def __attrs_post_init__(self) -> None:
        self.drained.set()
        self.continue_event.set()

    @property
    def status(self) -> str:
        return "generate" if self.inflight else "env"

    # -- turns ---------------------------------------------------------------------------------

    def begin_turn(self) -> tuple[str, int] | None:
        """Count a turn in; return the one-shot pin it consumes (if any)."""
        self.inflight += 1
        if self.drained.is_set():
            self.drained = trio.Event()
        pin, self.pin_once = self.pin_once, None
        return pin

    def end_turn(self) -> bool:
        """Count a turn out; True when a deferred hang took effect now."""
        self.inflight = max(0, self.inflight - 1)
        if self.inflight:
            return False
        self.drained.set()
        if self.marked_for_hang and not self.closing:
            self.marked_for_hang = False
            self._hang()
            return True
        return False

    # -- hang / continue / close ---------------------------------------------------------------

    def _hang(self) -> None:
        self.hang_state = "hung"
        if self.continue_event.is_set():
            self.continue_event = trio.Event()

    def hang(self) -> str:
        """``hung`` (idle: now) or ``deferred`` (a turn is in flight: when it ends)."""
        if self.inflight == 0:
            self._hang()
            return "hung"
        self.marked_for_hang = True
        return "deferred"

    def resume(self, pin: tuple[str, int] | None) -> None:
        self.marked_for_hang = False
        self.hang_state = "running"
        if pin is not None:
            self.instance = pin
            self.pin_once = pin
        self.continue_event.set()

    def close(self) -> None:
        self.closing = True
        self.hang_state = "running"
        self.marked_for_hang = False
        self.continue_event.set()  # waiters wake, see closing, answer 409

    def idle_for(self, now: float) -> float | None:
        """Seconds since it was last used, or None while something holds it: a turn in flight,
        a hang (PSRL hangs sessions across a weight sync, for as long as the sync takes), a
        deferred hang, or a delete draining it. Only an idle session may expire."""
        if self.inflight or self.closing or self.hang_state == "hung" or self.marked_for_hang:
            return None
        return now - self.last_active

    def control_view(self) -> dict:
        return {
            "session_id": self.id,
            "base_worker_id": self.instance[0] if self.instance else None,
            "target_dp_rank": self.instance[1] if self.instance else None,
            "status": self.status,
            "hang_state": self.hang_state,
            "inflight": self.inflight,
            "total_tokens": self.total_tokens,
            "marked_for_hang": self.marked_for_hang,
            "closing": self.closing,
        }

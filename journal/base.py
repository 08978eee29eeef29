"""Values shared by every store, and the interface a store implements (``EventStore``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol

import attrs

from ._chain import Prepared, VerifyReport, prepare
from .codec import Event, Recorded, UnknownEvent
from .errors import JournalConflict

__all__ = ["MAX_SEQ", "Append", "EventStore", "Expect", "Lease", "RawRow", "VerifyReport", "clamp_seq"]

# The largest sequence number a journal can hold (SQLite and PostgreSQL integers are 64-bit). A
# larger position a client or a CLI user gives (`?after=`, `?upto=`, `--after`, `--before`) is past
# every event: it is clamped here before any store read, never an OverflowError from the driver.
MAX_SEQ = 2**63 - 1


def clamp_seq(seq: int) -> int:
    """A sequence number (or bound) as a store can take it: at most ``MAX_SEQ``."""
    return min(seq, MAX_SEQ)


# (seq, ts, stream, type, schema, payload) as stored: what read_raw() yields.
RawRow = tuple[int, float, str, str, int, str]


def _check_stream(_inst: object, _attr: object, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError("stream must be a non-empty string")


_NO_SECRETS: Mapping[str, str | None] = MappingProxyType({})


def _secrets(value: Mapping[str, str | None] | None) -> Mapping[str, str | None]:
    if not value:
        return _NO_SECRETS  # the common case, on the append hot path: no copy
    out = dict(value)
    for worker_id, api_key in out.items():
        if not isinstance(worker_id, str) or not worker_id:
            raise ValueError("secrets: worker ids must be non-empty strings")
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            # '' is how the stores record a deleted key (a tombstone): never a key.
            raise ValueError("secrets: an api key must be a non-empty string (or None to delete it)")
    return out


def _masked(secrets: Mapping[str, str | None]) -> str:
    # Never let a key reach a log line through repr().
    return repr({worker_id: "***" if key is not None else None for worker_id, key in secrets.items()})


@attrs.frozen(slots=True)
class Append:
    """One event to append to ``stream``, plus secret writes committed in the same transaction.

    ``secrets`` maps worker_id -> api key (None deletes the key). The event is encoded when the
    Append is built, so a value that cannot be journaled raises here, in the caller's task, instead
    of failing a whole batch in the writer thread.
    """

    stream: str = attrs.field(validator=_check_stream)
    event: Event | UnknownEvent
    secrets: Mapping[str, str | None] = attrs.field(default=None, converter=_secrets, repr=_masked)
    _prepared: Prepared = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_prepared", prepare(self.event, self.stream))


def _names(value: Iterable[str | type[Event]] | str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (value,)
    return tuple(v if isinstance(v, str) else v.TYPE for v in value)


def _streams(value: Iterable[str] | str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


@attrs.frozen(slots=True)
class Expect:
    """The position a decision was made on, for a conditional append (optimistic concurrency).

    ``after``: the seq the deciding projection had read up to. ``types`` / ``streams``: the events
    the decision depends on (None: any). The append goes through only if no event matching BOTH
    filters was appended after ``after``; otherwise the store raises ``JournalConflict`` and writes
    nothing. ``Expect(after=head)`` with no filter: the whole journal's head must still be ``head``.
    Checked inside the write transaction, so two processes deciding on the same position cannot
    both append.
    """

    after: int = attrs.field(validator=attrs.validators.ge(0))
    types: tuple[str, ...] | None = attrs.field(default=None, converter=_names)
    streams: tuple[str, ...] | None = attrs.field(default=None, converter=_streams)


def check_expect(expect: Expect, head: int, last_match: int | None) -> None:
    """Refuse a conditional append (JournalConflict) unless ``expect`` still holds, given the
    journal's ``head`` and the newest event matching its filters (``last_match``, None: none).
    Shared by every store: each finds ``last_match`` its own way."""
    if expect.after > head:
        problem = f"the expected position {expect.after} is beyond the journal's head {head}"
    elif last_match is not None and last_match > expect.after:
        problem = (
            f"conflict: event {last_match} matching the condition was appended after seq {expect.after}"
            f" (head {head}); catch up and decide again"
        )
    else:
        return
    raise JournalConflict(problem, head=head, seq=last_match or head)


@attrs.frozen(slots=True)
class Lease:
    """A named lease as a store reports it. ``expires``: unix seconds on the store's clock
    (PostgreSQL: the server's). ``epoch`` grows by one each time the lease changes holder: a
    fencing token a duty can record with what it does."""

    name: str
    holder: str
    expires: float
    epoch: int


class EventStore(Protocol):
    """What JournalWriter, replay and the CLI need from a store (SqliteStore, MemoryStore, PgStore).

    Every method is synchronous. JournalWriter commits on the event loop with ``wait=0`` when the
    store says commits are cheap, and in its worker thread otherwise (or when the lock is taken).
    """

    def checkpoint(self) -> None: ...  # fold the write-ahead log (SQLite); a no-op elsewhere

    def append_batch(
        self, items: Sequence[Append], *, wait: float | None = None, expect: Expect | None = None
    ) -> list[Recorded]:
        """One transaction; ``wait`` = 0: raise JournalBusyError instead of waiting for a lock.
        ``expect``: append only if the condition holds, else raise JournalConflict (see Expect)."""
        ...

    def change_token(self) -> object:
        """A cheap value that differs once anything was committed since it was taken (no blocking
        I/O: SQLite's ``PRAGMA data_version``, PostgreSQL's LISTEN counter). See journal/watch.py."""
        ...

    def take_lease(self, name: str, holder: str, ttl: float) -> Lease | None: ...

    def renew_lease(self, name: str, holder: str, ttl: float) -> Lease: ...

    def release_lease(self, name: str, holder: str) -> bool: ...

    def lease(self, name: str) -> Lease | None: ...

    def read(
        self,
        after_seq: int = 0,
        *,
        limit: int | None = None,
        types: Iterable[str | type[Event]] | None = None,
        stream: str | None = None,
        until_seq: int | None = None,
        since_ts: float | None = None,
        until_ts: float | None = None,
    ) -> Iterator[Recorded]: ...

    def read_raw(
        self, after_seq: int = 0, types: Iterable[str | type[Event]] | None = None
    ) -> Iterator[RawRow]: ...

    def last_seq(self) -> int: ...

    def count(self) -> int: ...

    def secrets(self) -> dict[str, str]: ...

    def get_secret(self, worker_id: str) -> str | None: ...

    def save_snapshot(self, kind: str, upto_seq: int, state_json: str) -> list[int]: ...

    def latest_snapshot(self, kind: str, max_seq: int | None = None) -> tuple[int, str] | None: ...

    def verify(
        self,
        *,
        upto: int | None = None,
        after: int = 0,
        anchor: str | None = None,
        on_row: Callable[..., Any] | None = None,
    ) -> VerifyReport: ...

    def snapshot_seqs(self, kind: str) -> list[int]: ...

    def compact_bodies(self, before_seq: int) -> int: ...

    def close(self) -> None: ...


def type_names(types: Iterable[str | type[Event]] | None) -> list[str] | None:
    """Normalize a ``types`` filter (names or event classes) to names."""
    if types is None:
        return None
    if isinstance(types, str):
        return [types]
    return [t if isinstance(t, str) else t.TYPE for t in types]

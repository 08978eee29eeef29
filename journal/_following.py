"""The several-writers half of JournalWriter: following what other processes append.

Several gateway processes append to one journal (docs/journal.md, "Several writers"); each
writer feeds its projections every event in seq order, the others' included: read in the same
thread hop as a commit (the gap before it), or by the tail task (``follow``) when the store
reports a change. A store that cannot be read for a while (a lost connection, a PostgreSQL
restart) never stops the gateway: nothing is applied out of order, the tail retries, and an
append whose preceding events could not be read waits until memory reached it (``_defer``).
Only memory failing to take what was read (ProjectionError) is a fail-stop.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from .codec import Recorded
from .errors import JournalError, JournalUnreachable

logger = logging.getLogger("smgrl.journal")

_TAIL_RETRY = (0.05, 1.0)  # the tail's first and longest pause between failed reads (seconds)


class Following:
    """Mixed into JournalWriter (which holds the state these methods use)."""

    # JournalWriter's state these methods use (set in its __init__), declared for the type checker.
    _store: Any
    position: int | None
    on_commit: Any
    on_secrets: Any
    _deferred: list[Any]
    _failed: Exception | None
    _inline: bool
    _limiter: Any
    _fail_stop: Any
    _wakeup: Any

    def _foreign_secrets(self, after: int, until: int) -> dict[str, str | None]:
        """The keys other processes' events in (after, until] set or deleted (their Appends
        never passed through this writer)."""
        changes = getattr(self._store, "secret_changes", None)
        return changes(after, until) if changes is not None else {}

    def _in_order(self, records: list[Recorded]) -> list[Recorded] | None:
        """Several writers: ``records`` trimmed to what follows ``position``, without a hole;
        None when the hole before them cannot be read now (nothing applied, position kept)."""
        position = self.position
        if position is None:
            return records
        records = [r for r in records if r.seq > position]
        if records and records[0].seq != position + 1:
            # A hole: a catch_up() applied a newer range while this batch's gap was read in the
            # thread (the two take turns on the store, not on the projections). Rare; filled with
            # a synchronous read, on the event loop, rather than applying out of order.
            try:
                hole = list(self._store.read(after_seq=position, until_seq=records[0].seq - 1))
                secrets = self._foreign_secrets(position, records[0].seq - 1)
            except JournalError as exc:
                logger.warning(
                    "journal read of events %d-%d failed: %s", position + 1, records[0].seq - 1, exc
                )
                return None
            if secrets and self.on_secrets is not None:
                self.on_secrets(secrets)
            records = hole + records
        if records:
            self.position = records[-1].seq
        return records

    def _defer(self, batch: Any) -> None:
        """A committed batch memory cannot take yet (what precedes it could not be read): its
        appenders wait until the projections reach it (a later commit's gap read or the tail's
        ``catch_up``, which retries), so that an append still returns only once memory holds it
        (read-your-writes)."""
        self._deferred.append(batch)

    def _release_deferred(self) -> None:
        position = self.position
        if not self._deferred or position is None:
            return
        keep = []
        for batch in self._deferred:
            if batch.recorded is not None and batch.recorded[-1].seq <= position:
                batch.done.set()
            else:
                keep.append(batch)
        self._deferred = keep

    async def catch_up(self, *, cached: bool = False) -> int:
        """Several writers: feed ``on_commit`` what other processes appended after ``position``
        (in seq order, after anything this writer already fed); return how many events.

        Read on the event loop for a local store (``commits_are_cheap``: SQLite WAL, memory), in
        the writer's thread otherwise (PostgreSQL). A failure to apply is the writer's fail-stop.
        ``cached=True`` (the tail, ``follow``): take the events from the store's cache of what its
        notifications announced (``store.recent``, PostgreSQL) when it covers ``position``: no
        query, no thread hop. Not for a caller that must see a given commit (after a conflict):
        the cache may not have it yet.
        """
        if self.position is None:
            raise RuntimeError("catch_up() needs writer.position (several writers)")
        if self._failed is not None:
            raise self._failed
        after = self.position

        def read() -> tuple[list[Recorded], dict[str, str | None]]:
            try:
                records = list(self._store.read(after_seq=after))
                return records, (self._foreign_secrets(after, records[-1].seq) if records else {})
            except JournalUnreachable:
                raise
            except JournalError as exc:  # a lost connection: nothing applied, a later call retries
                raise JournalUnreachable(f"catching up with the journal failed: {exc}") from exc

        recent = getattr(self._store, "recent", None) if cached else None
        got = recent(after) if recent is not None else None
        if got is not None:
            records, secrets = got
        elif self._inline:
            records, secrets = read()
        else:
            # abandon_on_cancel=False: the thread holds the store's lock until the read ends.
            records, secrets = await trio.to_thread.run_sync(
                read, limiter=self._limiter, abandon_on_cancel=False
            )
        if records:
            try:
                if secrets and self.on_secrets is not None and self.position < records[-1].seq:
                    # Idempotent: a key may arrive twice. Skipped when a commit applied this whole
                    # range meanwhile (its keys, read later, may be newer than these).
                    self.on_secrets(secrets)
                applied = self._in_order(records)
                if applied is None:
                    raise JournalUnreachable("catching up with the journal failed: a hole could not be read")
                records = applied
                if records and self.on_commit is not None:
                    self.on_commit(records)
                self._release_deferred()
            except JournalUnreachable:
                raise
            except Exception as exc:
                failed = self._fail_stop(records, exc)
                self._wakeup.unpark_all()  # run() raises it (the gateway stops)
                raise failed from exc
        return len(records)

    async def follow(
        self, watcher: Any, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Several writers: the tail task. Calls ``catch_up()`` whenever ``watcher`` (a
        journal.watch.ChangeWatcher on this store) reports a commit; runs until cancelled.

        A store that cannot be read (a lost connection, a PostgreSQL restart) never ends it:
        the read is retried after a pause growing from 50 ms to 1 s, as a failed append is
        retried by the next one. Only a ProjectionError (memory could not take what was read)
        ends the tail, and the gateway with it."""
        token = self._store.change_token()
        await self._catch_up_retrying(cached=False)  # what was appended before the token was taken
        task_status.started()
        while True:
            try:
                token = await watcher.wait(token)
            except JournalError as exc:  # the change token itself could not be read: just look
                logger.warning("journal tail: change check failed: %s", exc)
                await trio.sleep(_TAIL_RETRY[0])
            await self._catch_up_retrying(cached=True)

    async def _catch_up_retrying(self, *, cached: bool) -> None:
        pause, longest = _TAIL_RETRY
        while True:
            try:
                await self.catch_up(cached=cached)
                return
            except JournalUnreachable as exc:
                logger.warning("journal tail: %s; retrying in %.2f s", exc, pause)
            await trio.sleep(pause)
            pause, cached = min(longest, pause * 2), False

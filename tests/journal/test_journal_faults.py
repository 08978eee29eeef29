"""A store that loses its connection at chosen points never takes the writer or its tail down.

Two writers share one real SQLite file (as two gateway processes share a journal). Each store is
wrapped so that chosen calls of each read and write path raise the store's connection error
(``JournalError``, what PgStore raises for ``Connection refused``), deterministically by call
number: the commit itself (before it is written, and after it was written, as when the server
dies between COMMIT and its answer), the gap read after a commit, the key-change read, the
tail's read, the change token. Whatever fails, every appended event that was acknowledged is in
the journal, and both processes' projections receive every event of the journal exactly once, in
seq order; the tail task keeps running.
"""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import trio
from journal_helpers import outcome

from journal import ChangeWatcher, JournalError, JournalWriteError, JournalWriter, SqliteStore

# Which calls fail, per path (call numbers of that method on that store, counted from 1).
PLANS = {
    "tail-read": {"read": {1, 2, 3, 5, 8, 13, 21, 34}},
    "key-changes-read": {"secret_changes": {1, 2, 4, 7, 11, 16}},
    "commit-not-written": {"append_batch": {2, 3, 6, 10, 15}},
    "commit-written-then-lost": {"append_batch+": {2, 5, 9, 14}},
    "change-token": {"change_token": {3, 4, 50, 51, 52}},
    "everything-at-once": {
        "read": {2, 3, 9, 10, 30},
        "secret_changes": {1, 5},
        "append_batch": {4, 12},
        "append_batch+": {7, 20},
        "change_token": {5, 60},
    },
}


class FlakyStore:
    """Delegates to ``inner``; the calls its plan names raise ``JournalError`` instead
    (``append_batch+``: the batch is written first, then the error is raised)."""

    def __init__(self, inner: SqliteStore, plan: dict[str, set[int]]) -> None:
        self._inner = inner
        self._plan = plan
        self._calls: collections.Counter[str] = collections.Counter()
        self.raised: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str):
        value = getattr(self._inner, name)
        if not callable(value) or name not in ("read", "secret_changes", "append_batch", "change_token"):
            return value

        def call(*args, **kwargs):
            self._calls[name] += 1
            n = self._calls[name]
            if n in self._plan.get(name, ()):
                self.raised[name] += 1
                raise JournalError(f"journal database error: connection refused ({name} call {n})")
            result = value(*args, **kwargs)
            if name == "append_batch" and n in self._plan.get("append_batch+", ()):
                self.raised["append_batch+"] += 1
                raise JournalError(f"journal database error: server closed the connection ({name} call {n})")
            return result

        return call


@pytest.mark.parametrize("inline", [True, False], ids=["inline-commits", "threaded-commits"])
@pytest.mark.parametrize("plan", list(PLANS), ids=list(PLANS))
async def test_a_store_losing_its_connection_never_stops_the_writers_or_loses_an_acked_event(
    tmp_path: Path, plan: str, inline: bool
) -> None:
    path = tmp_path / "journal.db"
    SqliteStore.open(path).close()
    inner = [SqliteStore.open(path), SqliteStore.open(path)]
    stores = [FlakyStore(inner[0], PLANS[plan]), FlakyStore(inner[1], PLANS[plan])]
    writers = [JournalWriter(store, inline=inline) for store in stores]
    seen: list[list[int]] = [[], []]
    acked: list[int] = []
    per_writer = 40

    for i, writer in enumerate(writers):
        writer.position = 0
        writer.on_commit = lambda records, i=i: seen[i].extend(r.seq for r in records)
        writer.on_secrets = lambda changes: None
    try:
        async with trio.open_nursery() as nursery:
            for writer, store in zip(writers, stores, strict=True):
                await nursery.start(writer.run)
                await nursery.start(writer.follow, ChangeWatcher(store))

            async def appender(i: int) -> None:
                for n in range(per_writer):
                    for _attempt in range(10):  # a client retries a 503
                        try:
                            rec = await writers[i].append(f"p{i}", outcome(op_id=f"p{i}-{n}"))
                        except JournalWriteError:
                            await trio.sleep(0.001)
                            continue
                        acked.append(rec.seq)
                        # Read-your-writes holds through the faults: applied before append returns.
                        assert seen[i] and seen[i][-1] >= rec.seq
                        break
                    else:
                        raise AssertionError("an append kept failing")

            with trio.fail_after(30):
                async with trio.open_nursery() as inner_nursery:
                    inner_nursery.start_soon(appender, 0)
                    inner_nursery.start_soon(appender, 1)
                head = inner[0].last_seq()
                # The tail delivers the other process's last events (retrying its failed reads).
                while len(seen[0]) < head or len(seen[1]) < head:
                    await trio.sleep(0.005)
            assert not any(w.failed for w in writers)
            nursery.cancel_scope.cancel()
        report = inner[0].verify()
        stored = [r.seq for r in inner[0].read()]
    finally:
        for store in inner:
            store.close()
    assert sum(s.raised.total() for s in stores) > 0  # the plan did inject its faults
    assert report.ok
    assert seen[0] == seen[1] == stored == list(range(1, len(stored) + 1))
    assert set(acked) <= set(stored) and len(acked) == 2 * per_writer

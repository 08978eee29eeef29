"""Journal read routes: ``GET /v1/rl/operations/{id}`` and
``GET /v1/rl/journal?after=&upto=&since=&until=&type=&limit=`` (history queries: type names and
globs, a seq range, a time window; the same index reads as ``smgrl journal events``).

Readable with roles ``admin`` and ``user`` (D3). Recent operations are answered from memory (the
operations projection); older ones are rebuilt from the journal file. Reads of the file go through
a separate read-only connection in a worker thread, so they never wait on, or block, the writer.
Events carry no secrets by construction, so a page of events is safe to serve as is.
"""

from __future__ import annotations

import itertools
import json
import time

import trio
from quart import Response, request

from journal import SqliteStore
from journal.base import MAX_SEQ, clamp_seq
from smgrl.core.errors import InvalidQuery, OperationNotFound
from smgrl.core.numbers import parse_int
from smgrl.events import encode
from smgrl.history.filters import catalogue, expand_types
from smgrl.history.reading import read_events
from smgrl.history.values import BadValue, parse_time
from smgrl.http.bodies import envelopes as env
from smgrl.state import Operations

PAGE_DEFAULT = 100
PAGE_MAX = 1000


class JournalRoutes:
    def __init__(self, gateway) -> None:
        self.gateway = gateway
        self._reader = None
        # One reader thread at a time: the read-only connection is not shared across threads.
        self._limiter = trio.CapacityLimiter(1)

    def _store(self):
        store = self.gateway.store
        if isinstance(store, SqliteStore):
            if self._reader is None:
                self._reader = SqliteStore.open(store.path, readonly=True)
            return self._reader
        return store

    async def _read(self, fn):
        return await trio.to_thread.run_sync(fn, limiter=self._limiter)

    async def operation(self, op_id: str) -> Response:
        record = self.gateway.fleet.operations.get(op_id)
        if record is None:
            store = self._store()

            def rebuild():
                ops = Operations()
                for rec in store.read(0, stream=f"op:{op_id}"):
                    ops.apply(rec.seq, rec.event)
                return ops.get(op_id)

            record = await self._read(rebuild)
        if record is None:
            raise OperationNotFound(op_id)
        return env.json_response(200, record.to_json())

    async def page(self) -> Response:
        after = _int_arg("after", 0, 0)
        limit = min(_int_arg("limit", PAGE_DEFAULT, 1), PAGE_MAX)
        upto = _int_arg("upto", MAX_SEQ, 0)
        since, until = _time_arg("since"), _time_arg("until")
        patterns = [t.strip() for t in request.args.get("type", "").split(",") if t.strip()]
        store = self._store()

        def fetch():
            # The history paths of `smgrl journal events`: one (type, seq) index range per type
            # (globs expanded over the catalogue), merged by seq; a time window is a seq range.
            types = expand_types(patterns, catalogue()) if patterns else None
            found = read_events(
                store, types, after=after, until_seq=upto, since_ts=since, until_ts=until, limit=limit
            )
            rows = [record_json(rec) for rec in itertools.islice(found, limit)]
            return rows, store.last_seq()

        rows, last = await self._read(fetch)
        full = len(rows) == limit
        next_after = rows[-1]["seq"] if rows else after
        # `more`: a full page may have a next one; a shorter page read everything that matched.
        more = full and next_after < min(last, upto)
        return env.json_response(
            200, {"events": rows, "next_after": next_after, "last_seq": last, "more": more}
        )

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None


def record_json(rec) -> dict:
    """One journal record as the journal routes show it (page and stream)."""
    type_, schema, payload = encode(rec.event)
    return {
        "seq": rec.seq,
        "ts": rec.ts,
        "stream": rec.stream,
        "type": type_,
        "schema": schema,
        "payload": json.loads(payload),
    }


def _time_arg(name: str) -> float | None:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return None
    try:
        return parse_time(raw, time.time())
    except BadValue as exc:
        raise InvalidQuery(f"`{name}`: {exc}") from None


def _int_arg(name: str, default: int, minimum: int) -> int:
    raw = request.args.get(name)
    if raw is None or raw == "":
        return default
    value = parse_int(raw)
    if value is None:
        raise InvalidQuery(f"`{name}` must be an integer, got `{raw}`") from None
    if value < minimum:
        raise InvalidQuery(f"`{name}` must be at least {minimum}")
    # A larger `after` is past every event (it was a 500, found by tests/e2e/test_schemathesis.py),
    # a larger `limit` is capped anyway.
    return clamp_seq(value)

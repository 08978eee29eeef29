"""``GET /v1/rl/journal/stream`` (server-sent events of journal records, from the commit path)
and ``GET /fleet`` (the live fleet page that reads it).

The stream: one ``event: journal`` per record (``id:`` = its seq, ``data:`` = the record as
``GET /v1/rl/journal`` shows it). ``?after=SEQ`` first replays the records after SEQ from the file
(at most ``BACKFILL_MAX``), then goes live without a gap or a repeat; ``?tail=N`` does the
same for the last N records. A reader that falls
``smgrl.runtime.tail.BUFFER`` records behind gets ``event: lagged`` and the stream ends (reconnect with
``?after=``). A comment line every ``KEEPALIVE_SECS`` keeps proxies from closing an idle stream.
Read role, as the other journal routes; the page sends the key in a header, never in a URL.
"""

from __future__ import annotations

import json

import trio
from quart import Response, request

from journal.base import clamp_seq
from smgrl.core.auth import READ
from smgrl.core.errors import InvalidQuery, TooManyStreams
from smgrl.core.numbers import parse_uint
from smgrl.http.bodies import envelopes as env
from smgrl.http.openapi.apidoc import HTML, STRING, Param, Resp, Route, allow_table
from smgrl.http.openapi.schemas import rl_error_resp
from smgrl.http.routes.event_streams import EventStreams
from smgrl.http.routes.fleet_page import PAGE
from smgrl.http.routes.guard import Guard
from smgrl.http.routes.journal_routes import JournalRoutes, record_json

KEEPALIVE_SECS = 15.0
BACKFILL_MAX = 10_000
BACKFILL_PAGE = 100  # records read from the file at once for a backfill
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def sse(event: str, data: dict, event_id: int | None = None) -> bytes:
    head = f"event: {event}\n" + (f"id: {event_id}\n" if event_id is not None else "")
    return (head + "data: " + json.dumps(data, separators=(",", ":")) + "\n\n").encode()


class JournalStream:
    def __init__(self, gateway, streams: EventStreams) -> None:
        self.gateway = gateway
        self.streams = streams
        self.guard = Guard(gateway)
        self.reader = JournalRoutes(gateway)

    def register(self, app) -> None:
        app.add_url_rule("/v1/rl/journal/stream", "journal_stream", self.stream, methods=METHODS)
        app.add_url_rule("/fleet", "fleet_page", self.page, methods=METHODS)

    async def page(self) -> Response:
        if request.method not in ("GET", "HEAD"):
            return env.method_not_allowed(request.method, "/fleet", ALLOW["fleet_page"])
        # No key needed for the page itself: it holds no data; it asks for a key and reads the
        # API with it. Nothing is loaded from elsewhere (no CDN): one self-contained document.
        return Response(
            PAGE,
            status=200,
            content_type="text/html; charset=utf-8",
            headers={
                "cache-control": "no-store",
                "content-security-policy": "default-src 'self'; script-src 'unsafe-inline'; "
                "style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'",
                "referrer-policy": "no-referrer",
            },
        )

    async def stream(self) -> Response:
        raw = (request.scope.get("raw_path") or request.path.encode()).decode("latin-1")
        if request.method != "GET":
            return env.method_not_allowed(request.method, raw, ALLOW["journal_stream"])
        return await self.guard.answer(READ, raw, self._subscribe)

    async def _subscribe(self, check) -> Response:
        after_arg = request.args.get("after")
        after = None
        if after_arg is not None:
            after = parse_uint(after_arg)
            if after is None:
                raise InvalidQuery("`after` must be a non-negative integer", param="after")
            after = clamp_seq(after)  # as /v1/rl/journal: past every event, not a 500
        tail_arg = request.args.get("tail")
        if tail_arg is not None and after is None:
            tail = parse_uint(tail_arg)
            if tail is None:
                raise InvalidQuery("`tail` must be a non-negative integer", param="tail")
            # The last N records, then live (the fleet page's start: recent refits first).
            after = max(0, self.gateway.fleet.last_seq - min(tail, BACKFILL_MAX))
        self.streams.admit()  # TooManyStreams (429) past --max-event-streams
        return Response(
            self.streams.counted(self._events(after)),
            status=200,
            content_type="text/event-stream",
            headers={"cache-control": "no-store", "x-accel-buffering": "no"},
        )

    async def _events(self, after: int | None):
        tail = self.gateway.tail
        # Subscribed here, when the body starts, never in the handler: a response whose body is
        # never iterated (the client left first) would leave a subscriber nobody unsubscribes.
        # And BEFORE reading the backfill: every record is then either in the backfill or in the
        # subscription (duplicates are skipped by seq).
        sub = tail.subscribe()
        try:
            last = self.gateway.fleet.last_seq if after is None else after
            yield sse("hello", {"last_seq": self.gateway.fleet.last_seq})
            if after is not None:
                store = self.reader._store()
                upto = self.gateway.fleet.last_seq
                left = BACKFILL_MAX
                while left > 0:
                    # Page by page: a reader that does not read holds one page in memory, never
                    # the whole backfill (found against a live gateway: 40 readers of
                    # `?after=0` that read nothing held 120 MB of a 1,300-record journal).
                    n, cursor = min(BACKFILL_PAGE, left), last
                    rows = await self.reader._read(
                        lambda c=cursor, n=n: [record_json(r) for r in store.read(c, limit=n, until_seq=upto)]
                    )
                    for row in rows:
                        yield sse("journal", row, row["seq"])
                        last = row["seq"]
                    left -= len(rows)
                    if len(rows) < n:
                        break
            while True:
                batch = []
                with trio.move_on_after(KEEPALIVE_SECS):
                    batch = await sub.next_batch()
                if sub.lagged:
                    yield sse("lagged", {"last_seq": last})
                    return
                if not batch:
                    yield b": keepalive\n\n"
                    continue
                for rec in batch:
                    if rec.seq > last:
                        yield sse("journal", record_json(rec), rec.seq)
                        last = rec.seq
        finally:
            tail.unsubscribe(sub)


# -- /openapi.json: these routes, their models and their errors (smgrl/http/openapi/apidoc.py) ---------------

# One Route per operation: entries alike in shape stay apart (each is its own route's contract).
OPENAPI_ROUTES = (
    Route(
        "GET",
        "/v1/rl/journal/stream",
        "getJournalStream",
        "rl",
        "Server-sent events of journal records as they commit (`?after=SEQ` or `?tail=N` replays first)",
        {
            "200": Resp("text/event-stream: `event: journal`, `id: <seq>`", {"text/event-stream": STRING}),
            "400": rl_error_resp(
                "`after` or `tail` is not a non-negative integer (invalid_query).", InvalidQuery
            ),
            "429": rl_error_resp(
                "--max-event-streams event streams are open (too_many_streams); retry later.", TooManyStreams
            ),
        },
        role="read",
        params=(
            Param(
                "after",
                "query",
                "replay the records after this seq, then follow",
                {"type": "integer", "minimum": 0},
            ),
            Param(
                "tail",
                "query",
                "without `after`: replay the last N records (at most 10,000), then follow",
                {"type": "integer", "minimum": 0},
            ),
        ),
        head=False,
        rl_only=True,
        name="journal_stream",
    ),
    Route(
        "GET",
        "/fleet",
        "getFleetPage",
        "meta",
        "The live fleet page (HTML; it asks for a key and reads the API with it)",
        {"200": Resp("The page.", HTML)},
        security="open",
        rl_only=True,
        name="fleet_page",
    ),
)
# The methods each endpoint serves (the rest answer 405 with this ``allow``): the table's.
ALLOW = allow_table(OPENAPI_ROUTES, by_name=True)

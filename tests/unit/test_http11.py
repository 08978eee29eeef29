"""The pure HTTP/1.1 client core (smgrl/upstream/http11.py): tables of bytes in, events out."""

from __future__ import annotations

import pytest

from smgrl.upstream.errors import ProtocolError, ReadError
from smgrl.upstream.http11 import (
    MAX_HEADERS,
    NEED_DATA,
    Data,
    EndOfMessage,
    Head,
    ResponseParser,
    request_wants_close,
    serialize_request,
    simple_response,
)

# -- helpers -------------------------------------------------------------------------------------


def _drain(parser: ResponseParser, events: list) -> bool:
    """Collect events until NEED_DATA (False) or EndOfMessage (True). Bounded by the input."""
    while True:
        event = parser.next_event()
        if event is NEED_DATA:
            return False
        events.append(event)
        if isinstance(event, EndOfMessage):
            return True


def parse(raw: bytes, *, method: str = "GET", piece: int | None = None, eof: bool = False):
    """Feed ``raw`` in pieces of ``piece`` bytes (all at once if None); return (events, parser).

    Consecutive Data events are merged so that every way of splitting the input must give the
    same list.
    """
    parser = ResponseParser(method)
    step = piece or max(len(raw), 1)
    events: list = []
    done = False
    for start in range(0, len(raw), step):
        parser.feed(raw[start : start + step])
        done = _drain(parser, events)
        if done:
            parser.feed(raw[start + step :])  # bytes that arrived after the end (see reusable)
            break
    if not done and eof:
        parser.feed_eof()
        _drain(parser, events)
    merged: list = []
    for event in events:
        if isinstance(event, Data) and merged and isinstance(merged[-1], Data):
            merged[-1] = Data(merged[-1].data + event.data)
        else:
            merged.append(event)
    return merged, parser


def head(status: int, reason: bytes = b"OK", headers=(), version: bytes = b"1.1") -> Head:
    return Head(status, reason, version, list(headers))


END = EndOfMessage([])
SPLITS = [None, 1, 2, 3, 5, 8, 13]

# -- responses that parse ------------------------------------------------------------------------

# (id, raw response, request method, needs EOF to end, expected events, reusable afterwards)
GOOD = [
    (
        "content-length",
        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello",
        "GET",
        False,
        [head(200, headers=[(b"content-length", b"5")]), Data(b"hello"), END],
        True,
    ),
    (
        "no reason phrase",
        b"HTTP/1.1 204\r\n\r\n",
        "GET",
        False,
        [head(204, b""), END],
        True,
    ),
    (
        "empty reason phrase after the space",
        b"HTTP/1.1 200 \r\ncontent-length: 0\r\n\r\n",
        "GET",
        False,
        [head(200, b"", [(b"content-length", b"0")]), END],
        True,
    ),
    (
        "reason phrase with spaces and obs-text",
        b"HTTP/1.1 404 Not \xe9 Found\r\ncontent-length: 0\r\n\r\n",
        "GET",
        False,
        [head(404, b"Not \xe9 Found", [(b"content-length", b"0")]), END],
        True,
    ),
    (
        "names lower-cased, values trimmed, empty value, order and repeats kept",
        (
            b"HTTP/1.1 200 OK\r\nContent-Type:   text/plain \t\r\nX-Empty:\r\nSet-Cookie: a=1\r\n"
            b"set-cookie: b=2\r\nCONTENT-LENGTH: 2\r\n\r\nok"
        ),
        "GET",
        False,
        [
            head(
                200,
                headers=[
                    (b"content-type", b"text/plain"),
                    (b"x-empty", b""),
                    (b"set-cookie", b"a=1"),
                    (b"set-cookie", b"b=2"),
                    (b"content-length", b"2"),
                ],
            ),
            Data(b"ok"),
            END,
        ],
        True,
    ),
    (
        "obs-fold continuation lines become one space",
        b"HTTP/1.1 200 OK\r\nx-folded: a\r\n  b\r\n\tc\r\ncontent-length: 0\r\n\r\n",
        "GET",
        False,
        [head(200, headers=[(b"x-folded", b"a b c"), (b"content-length", b"0")]), END],
        True,
    ),
    (
        "bare LF line endings",
        b"HTTP/1.1 200 OK\nx: 1\ncontent-length: 3\n\nabc",
        "GET",
        False,
        [head(200, headers=[(b"x", b"1"), (b"content-length", b"3")]), Data(b"abc"), END],
        True,
    ),
    (
        "stray empty lines before the status line",
        b"\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nx",
        "GET",
        False,
        [head(200, headers=[(b"content-length", b"1")]), Data(b"x"), END],
        True,
    ),
    (
        "HTTP/1.0 with keep-alive is reusable",
        b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\ncontent-length: 2\r\n\r\nhi",
        "GET",
        False,
        [
            head(200, headers=[(b"connection", b"Keep-Alive"), (b"content-length", b"2")], version=b"1.0"),
            Data(b"hi"),
            END,
        ],
        True,
    ),
    (
        "HTTP/1.0 without keep-alive is not",
        b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nhi",
        "GET",
        False,
        [head(200, headers=[(b"content-length", b"2")], version=b"1.0"), Data(b"hi"), END],
        False,
    ),
    (
        "HTTP/1.0 without length is read until close",
        b"HTTP/1.0 200 OK\r\n\r\nuntil the end",
        "GET",
        True,
        [head(200, version=b"1.0"), Data(b"until the end"), END],
        False,
    ),
    (
        "HTTP/1.1 without length is read until close",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nstreamed",
        "GET",
        True,
        [head(200, headers=[(b"content-type", b"text/plain")]), Data(b"streamed"), END],
        False,
    ),
    (
        "connection: close among other tokens, any case",
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, CLOSE\r\ncontent-length: 0\r\n\r\n",
        "GET",
        False,
        [head(200, headers=[(b"connection", b"keep-alive, CLOSE"), (b"content-length", b"0")]), END],
        False,
    ),
    (
        "a later HTTP/1.x minor is read as 1.1",
        b"HTTP/1.2 200 OK\r\ncontent-length: 0\r\n\r\n",
        "GET",
        False,
        [head(200, headers=[(b"content-length", b"0")], version=b"1.2"), END],
        True,
    ),
    (
        "HEAD response has no body whatever content-length says",
        b"HTTP/1.1 200 OK\r\ncontent-length: 1000\r\n\r\n",
        "HEAD",
        False,
        [head(200, headers=[(b"content-length", b"1000")]), END],
        True,
    ),
    (
        "HEAD response with transfer-encoding: chunked has no body either",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
        "HEAD",
        False,
        [head(200, headers=[(b"transfer-encoding", b"chunked")]), END],
        True,
    ),
    (
        "304 has no body",
        b"HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\n\r\n",
        "GET",
        False,
        [head(304, b"Not Modified", [(b"content-length", b"10")]), END],
        True,
    ),
    (
        "100 Continue and 103 Early Hints come before the final response",
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n"
            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
        ),
        "POST",
        False,
        [
            head(100, b"Continue"),
            head(103, b"Early Hints", [(b"link", b"</a>; rel=preload")]),
            head(200, headers=[(b"content-length", b"2")]),
            Data(b"ok"),
            END,
        ],
        True,
    ),
    (
        "chunked",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        "GET",
        False,
        [head(200, headers=[(b"transfer-encoding", b"chunked")]), Data(b"hello world"), END],
        True,
    ),
    (
        "chunked with extensions, upper-case hex and BWS",
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: Chunked\r\n\r\n"
            b'5;name=value\r\nhello\r\nA ; a=b;c;d="q;x"\r\n0123456789\r\n0;last\r\n\r\n'
        ),
        "GET",
        False,
        [head(200, headers=[(b"transfer-encoding", b"Chunked")]), Data(b"hello0123456789"), END],
        True,
    ),
    (
        "chunked with trailers (folded one included)",
        (
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
            b"X-Checksum: 123\r\nx-more: a\r\n b\r\n\r\n"
        ),
        "GET",
        False,
        [
            head(200, headers=[(b"transfer-encoding", b"chunked")]),
            Data(b"abc"),
            EndOfMessage([(b"x-checksum", b"123"), (b"x-more", b"a b")]),
        ],
        True,
    ),
    (
        "chunked with bare LF everywhere",
        b"HTTP/1.1 200 OK\ntransfer-encoding: chunked\n\n3\nabc\n0\nx: 1\n\n",
        "GET",
        False,
        [head(200, headers=[(b"transfer-encoding", b"chunked")]), Data(b"abc"), EndOfMessage([(b"x", b"1")])],
        True,
    ),
    (
        "transfer-encoding list with empty elements is still just chunked",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: , chunked\r\n\r\n0\r\n\r\n",
        "GET",
        False,
        [head(200, headers=[(b"transfer-encoding", b", chunked")]), END],
        True,
    ),
    (
        "chunked wins over content-length, and the connection is not reused",
        b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        "GET",
        False,
        [
            head(200, headers=[(b"content-length", b"100"), (b"transfer-encoding", b"chunked")]),
            Data(b"ok"),
            END,
        ],
        False,
    ),
    (
        "transfer-encoding in HTTP/1.0 is read but the connection is not reused",
        b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        "GET",
        False,
        [
            head(
                200,
                headers=[(b"connection", b"keep-alive"), (b"transfer-encoding", b"chunked")],
                version=b"1.0",
            ),
            Data(b"ok"),
            END,
        ],
        False,
    ),
    (
        "duplicate content-length fields that agree",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok",
        "GET",
        False,
        [head(200, headers=[(b"content-length", b"2"), (b"content-length", b"2")]), Data(b"ok"), END],
        True,
    ),
    (
        "content-length list that agrees",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2 , 2\r\n\r\nok",
        "GET",
        False,
        [head(200, headers=[(b"content-length", b"2 , 2")]), Data(b"ok"), END],
        True,
    ),
    (
        "bytes after the end of the response forbid reuse",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokGARBAGE",
        "GET",
        False,
        [head(200, headers=[(b"content-length", b"2")]), Data(b"ok"), END],
        False,
    ),
    (
        "redirects are just responses",
        b"HTTP/1.1 307 Temporary Redirect\r\nlocation: /elsewhere\r\ncontent-length: 0\r\n\r\n",
        "POST",
        False,
        [head(307, b"Temporary Redirect", [(b"location", b"/elsewhere"), (b"content-length", b"0")]), END],
        True,
    ),
]


@pytest.mark.parametrize("piece", SPLITS)
@pytest.mark.parametrize(
    ("raw", "method", "eof", "expected", "reusable"), [g[1:] for g in GOOD], ids=[g[0] for g in GOOD]
)
def test_good_responses_parse_the_same_however_split(raw, method, eof, expected, reusable, piece):
    events, parser = parse(raw, method=method, piece=piece, eof=eof)
    assert events == expected
    assert parser.complete
    assert parser.reusable is reusable


def test_exactly_max_headers_is_fine():
    fields = b"".join(b"x-%d: v\r\n" % i for i in range(MAX_HEADERS))
    events, _ = parse(b"HTTP/1.1 200 OK\r\n" + fields + b"\r\n", eof=True)
    assert len(events[0].headers) == MAX_HEADERS


def test_body_fed_separately_is_not_copied():
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\n")
    assert isinstance(parser.next_event(), Head)
    assert parser.next_event() is NEED_DATA
    body = b"0123456789"
    parser.feed(body)
    assert parser.next_event().data is body
    assert parser.next_event() == END


def test_data_is_handed_out_as_it_arrives():
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n13\r\nfirst")
    assert isinstance(parser.next_event(), Head)
    assert parser.next_event() == Data(b"first")
    assert parser.next_event() is NEED_DATA
    parser.feed(b" half, second \r\n0\r\n\r\n")
    assert parser.next_event() == Data(b" half, second ")
    assert parser.next_event() == END


def test_interim_response_alone_in_a_recv_then_the_final_one():
    # Regression (found by the h11 differential test): a 100 Continue arriving in its own recv,
    # polled once more (NEED_DATA), then the final response in one recv. The head scan resumed
    # at the old buffer's offset inside the new bytes, skipped the final head's end and read two
    # heads as one ("malformed header line b''").
    parser = ResponseParser("POST")
    parser.feed(b"HTTP/1.1 100 Continue\r\nx-pad: " + b"p" * 40 + b"\r\n\r\n")
    assert parser.next_event() == head(100, b"Continue", [(b"x-pad", b"p" * 40)])
    assert parser.next_event() is NEED_DATA
    parser.feed(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n\r\n")
    assert parser.next_event() == head(200, headers=[(b"content-length", b"2")])
    assert parser.next_event() == Data(b"ok")
    assert parser.next_event() == END


def test_need_data_repr():
    assert repr(NEED_DATA) == "NEED_DATA"


def test_next_event_after_the_end_is_a_bug():
    _, parser = parse(b"HTTP/1.1 204 No Content\r\n\r\n")
    with pytest.raises(RuntimeError):
        parser.next_event()


# -- responses that are malformed: ProtocolError -------------------------------------------------

OK_HEAD = b"HTTP/1.1 200 OK\r\n"
CHUNKED = OK_HEAD + b"transfer-encoding: chunked\r\n\r\n"

BAD = [
    ("HTTP/2 status line", b"HTTP/2 200 OK\r\n\r\n"),
    ("HTTP/2.0 status line", b"HTTP/2.0 200 OK\r\n\r\n"),
    ("lower-case protocol", b"http/1.1 200 OK\r\n\r\n"),
    ("two-digit status", b"HTTP/1.1 20 OK\r\n\r\n"),
    ("four-digit status", b"HTTP/1.1 2000 OK\r\n\r\n"),
    ("no space after status", b"HTTP/1.1 200OK\r\n\r\n"),
    ("double space before status", b"HTTP/1.1  200 OK\r\n\r\n"),
    ("status below 100", b"HTTP/1.1 099 Odd\r\n\r\n"),
    ("not HTTP at all", b"ICY 200 OK\r\n\r\n"),
    ("101 Switching Protocols", b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n"),
    ("header line without colon", OK_HEAD + b"no colon here\r\n\r\n"),
    ("space before the colon", OK_HEAD + b"content-length : 5\r\n\r\nhello"),
    ("empty header name", OK_HEAD + b": value\r\n\r\n"),
    ("separator in header name", OK_HEAD + b"x(y): 1\r\n\r\n"),
    ("bare CR in a value", OK_HEAD + b"x: a\rb\r\n\r\n"),
    ("NUL in a value", OK_HEAD + b"x: a\x00b\r\n\r\n"),
    ("continuation before any header", OK_HEAD + b" folded\r\n\r\n"),
    ("negative content-length", OK_HEAD + b"content-length: -1\r\n\r\n"),
    ("signed content-length", OK_HEAD + b"content-length: +5\r\n\r\nhello"),
    ("hex content-length", OK_HEAD + b"content-length: 0x5\r\n\r\nhello"),
    ("empty content-length", OK_HEAD + b"content-length: \r\n\r\n"),
    ("fractional content-length", OK_HEAD + b"content-length: 5.0\r\n\r\nhello"),
    ("content-length with inner space", OK_HEAD + b"content-length: 1 2\r\n\r\n"),
    ("huge content-length", OK_HEAD + b"content-length: 1234567890123456789\r\n\r\n"),
    ("content-length list that disagrees", OK_HEAD + b"content-length: 5, 6\r\n\r\nhello"),
    ("content-length fields that disagree", OK_HEAD + b"content-length: 5\r\ncontent-length: 6\r\n\r\n"),
    ("unsupported transfer coding", OK_HEAD + b"transfer-encoding: gzip\r\n\r\n"),
    ("chunked not the only coding", OK_HEAD + b"transfer-encoding: gzip, chunked\r\n\r\n"),
    ("chunked twice", OK_HEAD + b"transfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n"),
    ("empty transfer-encoding", OK_HEAD + b"transfer-encoding: \r\n\r\n"),
    ("non-hex chunk size", CHUNKED + b"zz\r\n"),
    ("0x chunk size", CHUNKED + b"0x5\r\nhello\r\n"),
    ("negative chunk size", CHUNKED + b"-5\r\n"),
    ("empty chunk size", CHUNKED + b"\r\n"),
    ("chunk size over 16 hex digits", CHUNKED + b"1" * 17 + b"\r\n"),
    ("chunk size line too long", CHUNKED + b"5;" + b"x" * 9000 + b"\r\nhello\r\n0\r\n\r\n"),
    ("chunk size line too long, unterminated", CHUNKED + b"5;" + b"x" * 9000),
    ("bare CR in chunk extension", CHUNKED + b"5;a\rb\r\nhello\r\n0\r\n\r\n"),
    ("chunk data not followed by CRLF", CHUNKED + b"5\r\nhelloXX0\r\n\r\n"),
    ("malformed trailer", CHUNKED + b"0\r\nbad trailer\r\n\r\n"),
    (
        "too many header fields",
        OK_HEAD + b"".join(b"x-%d: v\r\n" % i for i in range(MAX_HEADERS + 1)) + b"\r\n",
    ),
    ("head over 64 KiB, unterminated", OK_HEAD + b"x: " + b"v" * 70_000),
    ("head over 64 KiB, terminated", OK_HEAD + b"x: " + b"v" * 70_000 + b"\r\n\r\n"),
    ("trailers over 64 KiB", CHUNKED + b"0\r\nx: " + b"v" * 70_000),
    ("too many trailer fields", CHUNKED + b"0\r\n" + b"x: v\r\n" * (MAX_HEADERS + 1) + b"\r\n"),
    # Framing fields are checked where they decide nothing too (found by the h11 differential).
    ("invalid content-length on a 304", b"HTTP/1.1 304 Not Modified\r\ncontent-length: 1, 2\r\n\r\n"),
    ("invalid content-length on a 204", b"HTTP/1.1 204 No Content\r\ncontent-length: -1\r\n\r\n"),
    ("invalid content-length beside chunked", CHUNKED[:-2] + b"content-length: x\r\n\r\n0\r\n\r\n"),
    (
        "unsupported transfer-encoding on a 1xx",
        b"HTTP/1.1 100 Continue\r\ntransfer-encoding: gzip\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
    ),
    ("more than 16 interim responses", b"HTTP/1.1 100 Continue\r\n\r\n" * 17 + b"HTTP/1.1 200 OK\r\n\r\n"),
]


@pytest.mark.parametrize("piece", [None, 7])
@pytest.mark.parametrize("raw", [b[1] for b in BAD], ids=[b[0] for b in BAD])
def test_malformed_responses_raise_protocol_error(raw, piece):
    with pytest.raises(ProtocolError):
        parse(raw, piece=piece)


def test_framing_fields_of_a_head_response_are_checked():
    with pytest.raises(ProtocolError):
        parse(b"HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\n", method="HEAD")


def test_parser_stays_broken_after_an_error():
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n")
    with pytest.raises(ProtocolError):
        parser.next_event()
    with pytest.raises(ProtocolError):
        parser.next_event()


# -- the connection closes early: ReadError, not ProtocolError -----------------------------------

EARLY_EOF = [
    ("before any byte", b""),
    ("inside the status line", b"HTTP/1.1 20"),
    ("inside the headers", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n"),
    ("after an interim response", b"HTTP/1.1 100 Continue\r\n\r\n"),
    ("inside a content-length body", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel"),
    ("before a chunk size", CHUNKED),
    ("inside a chunk size line", CHUNKED + b"5;ext"),
    ("inside chunk data", CHUNKED + b"5\r\nhel"),
    ("between chunk data and its CRLF", CHUNKED + b"5\r\nhello\r"),
    ("before the final empty line", CHUNKED + b"0\r\n"),
    ("inside trailers", CHUNKED + b"0\r\nx: 1\r\n"),
]


@pytest.mark.parametrize("raw", [e[1] for e in EARLY_EOF], ids=[e[0] for e in EARLY_EOF])
def test_early_eof_is_a_read_error(raw):
    with pytest.raises(ReadError) as info:
        parse(raw, eof=True)
    assert not isinstance(info.value, ProtocolError)
    assert "closed" in str(info.value)


def test_feed_after_eof_is_a_bug():
    parser = ResponseParser()
    parser.feed_eof()
    with pytest.raises(RuntimeError):
        parser.feed(b"x")


# -- requests ------------------------------------------------------------------------------------

HOST = b"127.0.0.1:31000"

REQUESTS = [
    (
        "GET, no body, no content-length",
        ("GET", "/health", HOST, (), None),
        b"GET /health HTTP/1.1\r\nhost: 127.0.0.1:31000\r\n\r\n",
    ),
    (
        "bodyless POST has no content-length",
        ("POST", "/flush_cache", HOST, [(b"accept", b"*/*")], None),
        b"POST /flush_cache HTTP/1.1\r\nhost: 127.0.0.1:31000\r\naccept: */*\r\n\r\n",
    ),
    (
        "POST with a body: content-length last, body in the same buffer",
        ("POST", "/update?x=1&y=%20", HOST, [(b"content-type", b"application/json")], b'{"a": 1}'),
        (
            b"POST /update?x=1&y=%20 HTTP/1.1\r\nhost: 127.0.0.1:31000\r\ncontent-type: application/json\r\n"
            b'content-length: 8\r\n\r\n{"a": 1}'
        ),
    ),
    (
        "an empty body still says content-length: 0",
        ("PUT", "/x", HOST, (), b""),
        b"PUT /x HTTP/1.1\r\nhost: 127.0.0.1:31000\r\ncontent-length: 0\r\n\r\n",
    ),
    (
        "header names and order exactly as given",
        (
            "GET",
            "/",
            b"[::1]:8000",
            [(b"X-Mixed-Case", b"v"), (b"authorization", b"Bearer t"), (b"a", b"")],
            None,
        ),
        b"GET / HTTP/1.1\r\nhost: [::1]:8000\r\nX-Mixed-Case: v\r\nauthorization: Bearer t\r\na: \r\n\r\n",
    ),
]


@pytest.mark.parametrize(("args", "expected"), [r[1:] for r in REQUESTS], ids=[r[0] for r in REQUESTS])
def test_serialize_request(args, expected):
    assert serialize_request(*args) == expected


BAD_REQUESTS = [
    ("method with a space", ("GE T", "/", HOST, (), None)),
    ("empty method", ("", "/", HOST, (), None)),
    ("target with a space", ("GET", "/a b", HOST, (), None)),
    ("target with CRLF", ("GET", "/a\r\nx: y", HOST, (), None)),
    ("empty target", ("GET", "", HOST, (), None)),
    ("non-ASCII target", ("GET", "/\u00e9", HOST, (), None)),
    ("header name with a space", ("GET", "/", HOST, [(b"bad name", b"v")], None)),
    ("header name with a colon", ("GET", "/", HOST, [(b"x:y", b"v")], None)),
    ("empty header name", ("GET", "/", HOST, [(b"", b"v")], None)),
    ("CR in a value", ("GET", "/", HOST, [(b"x", b"a\rb")], None)),
    ("LF in a value", ("GET", "/", HOST, [(b"x", b"a\nb")], None)),
    ("NUL in a value", ("GET", "/", HOST, [(b"x", b"a\x00b")], None)),
    ("caller-given host", ("GET", "/", HOST, [(b"Host", b"evil")], None)),
    ("caller-given content-length", ("POST", "/", HOST, [(b"content-length", b"1")], b"x")),
    ("caller-given transfer-encoding", ("POST", "/", HOST, [(b"transfer-encoding", b"chunked")], b"x")),
]


@pytest.mark.parametrize("args", [r[1] for r in BAD_REQUESTS], ids=[r[0] for r in BAD_REQUESTS])
def test_serialize_rejects_what_could_split_or_reframe_the_request(args):
    with pytest.raises(ValueError):
        serialize_request(*args)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([], False),
        ([(b"accept", b"*/*")], False),
        ([(b"connection", b"keep-alive")], False),
        ([(b"connection", b"close")], True),
        ([(b"Connection", b"Keep-Alive, Close")], True),
    ],
)
def test_request_wants_close(headers, expected):
    assert request_wants_close(headers) is expected


# -- simple_response: the whole-response shortcut of the batched fan-out ----------------------


def _variants() -> list[bytes]:
    """Every corpus response, and each with its last byte cut, a byte more, and small edits."""
    base = [g[1] for g in GOOD] + [b[1] for b in BAD] + [e[1] for e in EARLY_EOF]
    base += [
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok",
        b"HTTP/1.1 500 \r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length:  3 \t\r\nx-a:\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n x-fold\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ncontent-length: +2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nbad name: 1\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nx: a\rb\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\nx: a\x00b\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 200 OK\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 204 No Content\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok",
        b"HTTP/1.1 2000 OK\r\ncontent-length: 2\r\n\r\nok",
    ]
    out = []
    for raw in base:
        out += [raw, raw[:-1], raw + b"x", raw.replace(b"\r\n", b"\n", 1), raw.lower(), raw.upper()]
    return out


@pytest.mark.parametrize("raw", _variants())
def test_a_simple_response_reads_as_the_parser_reads_it(raw):
    got = simple_response(raw)
    if got is None:
        return  # the parser's own tests cover what it does with these bytes
    status, headers, body = got
    events, parser = parse(raw)
    assert [type(e) for e in events] == [Head, Data, EndOfMessage] or (
        not body and [type(e) for e in events] == [Head, EndOfMessage]
    )
    assert (events[0].status, events[0].headers) == (status, headers)
    assert (events[1].data if body else b"") == body
    assert parser.reusable


def test_a_plain_answer_is_simple_and_others_are_not():
    assert simple_response(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: a/b\r\n\r\nok") == (
        200,
        [(b"content-length", b"2"), (b"content-type", b"a/b")],
        b"ok",
    )
    for raw in (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
        b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nok",  # not all here yet
        b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\nok",  # a byte too many
    ):
        assert simple_response(raw) is None


def test_a_kept_head_reads_as_a_fresh_one(monkeypatch):
    """Every variant read with its head already kept gives what a first reading gives: the
    body's length is still checked against the kept content-length, and a refused head is
    never kept."""
    from smgrl.upstream import http11

    variants = _variants()
    monkeypatch.setattr(http11, "_SIMPLE_HEADS", {})
    fresh = []
    for raw in variants:
        http11._SIMPLE_HEADS.clear()
        fresh.append(simple_response(raw))
    for raw in variants:  # warm: each head kept by the readings before it
        simple_response(raw)
    assert [simple_response(raw) for raw in variants] == fresh
    assert any(fresh) and http11._SIMPLE_HEADS  # heads were kept, and read again from there


def test_the_same_head_is_checked_once(monkeypatch):
    from smgrl.upstream import http11

    monkeypatch.setattr(http11, "_SIMPLE_HEADS", {})
    checked = []
    real = http11._simple_head
    monkeypatch.setattr(http11, "_simple_head", lambda block: checked.append(block) or real(block))
    raw = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok"
    for _ in range(5):
        assert simple_response(raw) == (
            200,
            [(b"content-type", b"text/plain"), (b"content-length", b"2")],
            b"ok",
        )
    assert len(checked) == 1
    for i in range(http11._KEPT_HEADS + 10):  # bounded: distinct heads (a date a second) replace old ones
        simple_response(b"HTTP/1.1 200 OK\r\nx-n: %d\r\ncontent-length: 2\r\n\r\nok" % i)
    assert len(http11._SIMPLE_HEADS) <= http11._KEPT_HEADS

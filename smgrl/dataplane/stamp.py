"""Which weights produced an answer, and the headers that say so. Pure.

- ``x-smg-weight-version``: the version the ENGINE reported in the answer
  (``meta_info.weight_version`` of a ``/generate``, a stream's first event included: its head
  waits for that event; SGLang's ``metadata.weight_version`` on OpenAI answers) first, then the
  journal's table version for the engine, then ``"default"`` (SGLang's placeholder for "never
  refitted"). OpenAI streams carry no version in their events: they are stamped from the table.
- ``x-smg-mixed-version: true`` on a buffered ``/generate`` whose weights changed mid-request:
  a ``meta_info.weight_versions`` with more than one span, items of a batch reporting different
  versions, or a reported version that differs from the table's (the engine drifted).
- OpenAI-shaped answers carry the same version in ``system_fingerprint`` (buffered: the JSON
  body; streamed: every ``data:`` event), so ``/generate`` and ``/v1/chat/completions`` never
  disagree about a version.
- ``x-version-tag`` (PSRL): the serving engine's version, ``-1`` when it has none, so a
  multi-turn session can pin the floor for its next turn.

Bodies are only rewritten where the version must appear in them (OpenAI ``system_fingerprint``)
or by the single-prompt rule (a one-element list answering a single-prompt ``/generate`` becomes
the object). Error answers (non-2xx) are never touched.
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

import attrs

from smgrl.core import MalformedVersion, Version, validate_version
from smgrl.core.version import MAX_VERSION_BYTES
from smgrl.core.wire import json_bytes

DEFAULT_VERSION = "default"
UNVERSIONED_TAG = "-1"  # PSRL's x-version-tag for "no version"


def _valid(value: Any) -> str | None:
    """A reported version usable in a header, or None. SGLang's ``default`` placeholder means
    "no version" and does not override the table (an API version write, say)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return None
    text = str(value)
    # Cached: every answer of a fleet reports one of a few versions, and the check walks the
    # version's bytes one by one (a dozen calls per answer otherwise). Only short texts are
    # kept (an engine's odd value must not pin memory); a longer one is refused anyway.
    return _valid_cached(text) if len(text) <= 2 * MAX_VERSION_BYTES else _valid_text(text)


def _valid_text(text: str) -> str | None:
    try:
        version = validate_version(text)
    except MalformedVersion:
        return None
    return None if version == DEFAULT_VERSION else version


_valid_cached = functools.lru_cache(maxsize=256)(_valid_text)


def _same(a: str, b: str) -> bool:
    return Version.parse(a) == Version.parse(b)


@attrs.frozen
class Stamp:
    version: str
    mixed: bool
    body: bytes
    # Generated tokens the answer reports (``meta_info.completion_tokens``, summed over a batch;
    # ``usage.completion_tokens`` on OpenAI answers), None when it reports none: read while
    # stamping, from the parse or the scan already done, for GET /workers/stats.
    tokens: int | None = None

    def headers(self) -> list[tuple[bytes, bytes]]:
        out = [
            (b"x-smg-weight-version", self.version.encode()),
            (b"x-version-tag", version_tag(self.version)),
        ]
        if self.mixed:
            out.append((b"x-smg-mixed-version", b"true"))
        return out


def version_tag(version: str | None) -> bytes:
    if version is None or version == DEFAULT_VERSION:
        return UNVERSIONED_TAG.encode()
    return version.encode()


def stream_version(table_version: str | None) -> str:
    return table_version or DEFAULT_VERSION


# Answers at least this big are stamped without a full parse (below it ``json.loads``, in C,
# is cheaper than the scan).
FAST_STAMP_MIN = 16 * 1024
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string literal
_COLON_OBJECT = re.compile(rb"\s*:\s*\{")
_COLON = re.compile(rb"\s*:\s*")
_PLAIN_STRING = re.compile(rb'"([^"\\]*)"')
_INT = re.compile(rb"-?\d+(?=\s*[,}])")
_WS = b" \t\r\n"


def _depth(region: bytes) -> int:
    """How many objects/arrays ``region`` (a prefix of a JSON document, from a structural
    position) leaves open: brackets inside string literals do not count."""
    bare = _STRING.sub(b"", region)
    return bare.count(b"{") + bare.count(b"[") - bare.count(b"}") - bare.count(b"]")


def _key_at(body: bytes, at: int) -> bool:
    """Whether the ``"`` at ``at`` opens an object key: after ``{`` or ``,`` (whitespace aside).
    Inside a JSON string every ``"`` is escaped, so a match there is never string content."""
    i = at - 1
    while i >= 0 and body[i] in _WS:
        i -= 1
    return i >= 0 and body[i] in b"{,"


def _reported_single(body: bytes) -> list[str] | None:
    """The versions ``meta_info.weight_version`` reports in a single-object answer (empty:
    none), found without parsing the whole body; None when only a full parse can tell.

    A rollout answer is mostly tokens and logprobs (hundreds of KB with ``return_logprob``,
    where ``json.loads`` costs milliseconds of event-loop time per answer); the stamp needs one
    field. The keys are found by search and their nesting checked with string literals removed,
    so a key elsewhere (deeper, later, in another object) never counts: anything unusual (a
    second ``meta_info``, a ``weight_versions`` history, a value that is not a plain string or an
    integer) falls back to the full parse."""
    if body[:1] != b"{" or b'"weight_versions"' in body:
        return None
    meta = body.find(b'"meta_info"')
    if meta < 0 or body.find(b'"meta_info"', meta + 1) >= 0 or not _key_at(body, meta):
        return None
    opened = _COLON_OBJECT.match(body, meta + len(b'"meta_info"'))
    if opened is None or _depth(body[:meta]) != 1:
        return None
    inner = opened.end() - 1  # meta_info's "{"
    key = body.find(b'"weight_version"', inner)
    if key < 0:
        return []  # meta_info (the only one, an object) has no weight_version
    if body.find(b'"weight_version"', key + 1) >= 0 or not _key_at(body, key):
        return None
    if _depth(body[inner:key]) != 1:
        return None  # nested deeper in meta_info, or after it
    colon = _COLON.match(body, key + len(b'"weight_version"'))
    if colon is None:
        return None
    literal = _PLAIN_STRING.match(body, colon.end())
    if literal is not None:
        raw: Any = literal.group(1).decode("utf-8", "replace")
    else:
        number = _INT.match(body, colon.end())
        if number is None:
            return None  # null, a float, an escaped string...: the full parse decides
        raw = int(number.group())
    version = _valid(raw)
    return [version] if version is not None else []


# Engines write ``completion_tokens`` among meta_info's first fields (SGLang: before the
# log-probs): looked for in this window first, so a large answer is not searched to its end.
_TOKENS_WINDOW = 4096


def _tokens_single(body: bytes) -> int | None | bool:
    """``meta_info.completion_tokens`` of a single-object answer found by search, None when it
    has none, False when only a full parse can tell (called after ``_reported_single`` agreed
    the body has one top-level ``meta_info`` object).

    Unlike the version, a second ``completion_tokens`` key is not searched for: a search to the
    end of a 400 KB answer costs ~200 us, more than the rest of the stamp, and a duplicate key
    at meta_info's own level (which ``json.loads`` would read as its last value) is not valid
    output of any engine; a nested one is told apart by its depth as for the version."""
    meta = body.find(b'"meta_info"')
    inner = _COLON_OBJECT.match(body, meta + len(b'"meta_info"')).end() - 1  # type: ignore[union-attr]
    key = body.find(b'"completion_tokens"', inner, inner + _TOKENS_WINDOW)
    if key < 0:
        key = body.find(b'"completion_tokens"', inner)
    if key < 0:
        return None
    if not _key_at(body, key):
        return False
    if _depth(body[inner:key]) != 1:
        return False  # nested deeper in meta_info, or after it
    colon = _COLON.match(body, key + len(b'"completion_tokens"'))
    number = _INT.match(body, colon.end()) if colon is not None else None
    return _count(int(number.group())) if number is not None else False


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


class RenderedJson(bytes):
    """An answer body the gateway rendered itself (a gRPC engine's answer), with the object it
    was encoded from (``obj``, equal to ``json.loads`` of the bytes): stamping reads the object
    instead of parsing the bytes again. The stamp takes it (``take``): from then on only the
    bytes are held while the answer goes out (the memory budget counts bytes; the object of an
    answer with log-probs is several times their size). Read-only (a rewrite copies it)."""

    obj: Any

    @classmethod
    def of(cls, obj: Any) -> RenderedJson:
        body = cls(json_bytes(obj))
        body.obj = obj
        return body

    def take(self) -> Any:
        """The object, once (None after: a later reader parses the bytes)."""
        obj, self.obj = self.obj, None
        return obj


def stamp_generate(
    body: bytes, table_version: str | None, single: bool, fast_min: int = FAST_STAMP_MIN
) -> Stamp:
    """Stamp a buffered 2xx ``/generate`` answer (single object or batch list). Answers of at
    least ``fast_min`` bytes go through ``_reported_single`` first (the same result as the full
    parse on every valid JSON document: tests/unit/test_routing_stamp.py checks it by property).
    A body the gateway rendered (``RenderedJson``) is read from its object, unparsed."""
    if type(body) is RenderedJson and body.obj is not None:
        return _stamp_obj(body.take(), body, table_version, single)
    reported = _reported_single(body) if len(body) >= fast_min else None
    tokens = _tokens_single(body) if reported is not None else False
    if reported is not None and tokens is not False:
        version = reported[-1] if reported else stream_version(table_version)
        drifted = table_version is not None and any(not _same(v, table_version) for v in reported)
        return Stamp(version, drifted, body, tokens)
    return _stamp_parsed(body, table_version, single)


def _stamp_parsed(body: bytes, table_version: str | None, single: bool) -> Stamp:
    try:
        obj = json.loads(body)
    except ValueError:
        return Stamp(stream_version(table_version), False, body)
    return _stamp_obj(obj, body, table_version, single)


def _stamp_obj(obj: Any, body: bytes, table_version: str | None, single: bool) -> Stamp:
    if single and isinstance(obj, list) and len(obj) == 1 and isinstance(obj[0], dict):
        obj = obj[0]
        body = json_bytes(obj)
    items = obj if isinstance(obj, list) else [obj]
    reported: list[str] = []
    spans = False
    tokens: int | None = None
    for item in items:
        meta = item.get("meta_info") if isinstance(item, dict) else None
        if not isinstance(meta, dict):
            continue
        n = _count(meta.get("completion_tokens"))
        if n is not None:
            tokens = (tokens or 0) + n
        version = _valid(meta.get("weight_version"))
        if version is not None:
            reported.append(version)
        history = meta.get("weight_versions")
        if isinstance(history, list) and len(history) > 1:
            spans = True
    version = reported[-1] if reported else stream_version(table_version)
    drifted = table_version is not None and any(not _same(v, table_version) for v in reported)
    disagree = any(not _same(v, reported[0]) for v in reported[1:])
    return Stamp(version, spans or drifted or disagree, body, tokens)


def stamp_openai(body: bytes, table_version: str | None) -> Stamp:
    """Stamp a buffered 2xx OpenAI answer: the version in the header and ``system_fingerprint``."""
    if type(body) is RenderedJson and body.obj is not None:
        obj = body.take()
        if isinstance(obj, dict):
            obj = dict(obj)  # its own top level: the fingerprint below is set in it
    else:
        try:
            obj = json.loads(body)
        except ValueError:
            return Stamp(stream_version(table_version), False, body)
    if not isinstance(obj, dict):
        return Stamp(stream_version(table_version), False, body)
    metadata = obj.get("metadata")
    reported = _valid(metadata.get("weight_version")) if isinstance(metadata, dict) else None
    version = reported or stream_version(table_version)
    usage = obj.get("usage")
    tokens = _count(usage.get("completion_tokens")) if isinstance(usage, dict) else None
    if obj.get("system_fingerprint") != version:
        obj["system_fingerprint"] = version
        body = json_bytes(obj)
    return Stamp(version, False, body, tokens)


# An SSE event ends at a blank line; lines end in CRLF, LF or CR (WHATWG HTML, 9.2.5). Longest
# alternatives first. (A lone CR ending a chunk, whose LF comes in the next one, is read as a CR
# line end: the LF then makes an empty line, which an SSE client ignores.)
EVENT_BOUNDARY = re.compile(rb"(\r\n\r\n|\r\r\n|\r\n\n|\n\r\n|\n\n|\r\r)")


def first_event_version(chunk: bytes) -> str | None:
    """The ``meta_info.weight_version`` of the first complete ``data:`` event of a ``/generate``
    stream's first chunk, or None (the stream's head then names the table's version)."""
    if not chunk.startswith(b"data: {"):
        return None
    found = EVENT_BOUNDARY.search(chunk)
    if found is None:
        return None
    end = found.start()
    try:
        event = json.loads(chunk[6:end])
    except ValueError:
        return None
    meta = event.get("meta_info") if isinstance(event, dict) else None
    return _valid(meta.get("weight_version")) if isinstance(meta, dict) else None


_TOKENS_KEY = b'"completion_tokens"'
_TOKENS_VALUE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)(?=\s*[,}])')


class TokenTail:
    """The generated tokens a stream reports, without parsing it: the last chunk that names
    ``completion_tokens`` is kept (a ``bytes.find`` per chunk), and its last value read once
    when the stream ends. SGLang's ``/generate`` events carry the running ``meta_info.
    completion_tokens``; an OpenAI stream's ``usage`` event (``stream_options.include_usage``)
    its total. A chunk that ends inside the key or the number can hide the last value: the
    count is then the one before it (an undercount by a few tokens, never a crash)."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last = b""

    def see(self, chunk: bytes) -> None:
        if _TOKENS_KEY in chunk:
            self._last = chunk

    @property
    def tokens(self) -> int | None:
        found = None
        for found in _TOKENS_VALUE.finditer(self._last):
            pass
        return int(found.group(1)) if found is not None else None


class FingerprintEvents:
    """Rewrites ``system_fingerprint`` in every JSON ``data:`` event of an OpenAI SSE stream.

    ``feed`` returns the complete events received so far (rewritten); a partial event waits for
    its end (it is useless to a client half-received anyway); ``flush`` returns what is left.
    """

    __slots__ = ("_buf", "_version")

    def __init__(self, version: str) -> None:
        self._version = version
        self._buf = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._buf + chunk if self._buf else chunk
        if b"\r" in data:
            # CR or CRLF line ends (legal SSE): split on any blank line, keeping each event's
            # own separator bytes.
            pieces = EVENT_BOUNDARY.split(data)
            self._buf = pieces.pop()
            return b"".join(self._rewrite(pieces[i]) + pieces[i + 1] for i in range(0, len(pieces), 2))
        end = data.rfind(b"\n\n")
        if end < 0:
            self._buf = data
            return b""
        complete, self._buf = data[: end + 2], data[end + 2 :]
        events = complete.split(b"\n\n")
        events.pop()  # the empty piece after the last separator
        return b"".join(self._rewrite(e) + b"\n\n" for e in events)

    def flush(self) -> bytes:
        rest, self._buf = self._buf, b""
        return rest

    def _rewrite(self, event: bytes) -> bytes:
        if not event.startswith(b"data: {"):
            return event
        try:
            obj = json.loads(event[6:])
        except ValueError:
            return event
        if not isinstance(obj, dict) or "error" in obj:
            return event
        obj["system_fingerprint"] = self._version
        return b"data: " + json_bytes(obj)

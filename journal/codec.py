"""Journal events: the machinery (registry, canonical JSON codec), and the one event the store's format knows.

The catalogue of smgrl's events lives in ``smgrl.events``: the store keeps events without knowing
their types, except ``control.started``, whose raw request body the hash chain covers as bytes
(``journal/_chain.py``) and compaction drops (``journal/store.py``): that rule is part of the file
format, so the class stays with the format.

An event is a frozen attrs class registered under a dotted type name and a schema number::

    @event_type("worker.removed", schema=1)
    @attrs.frozen(slots=True, kw_only=True)
    class WorkerRemoved(Event):
        worker_id: str
        reason: str

``encode(ev)`` gives ``(type, schema, payload)`` where payload is the canonical JSON of
``attrs.asdict(ev, recurse=True)`` (compact separators, sorted keys, UTF-8 kept as is). The hash
chain covers these exact bytes, so the encoding must never change for a given value.

``decode(type, schema, payload)`` never raises. It returns an :class:`UnknownEvent` for a type this
code does not know, for a schema *newer* than the class (written by a newer smgrl), or for a payload
that does not fit the class. Projections skip UnknownEvents; the journal keeps them intact.

Schema evolution rules (the contract between old and new code reading the same file):

* Adding a field: give it a default (old payloads lack it) **and** bump the schema, so older
  code sees an UnknownEvent instead of silently dropping the field.
* Renaming, removing or retyping a field: bump the schema, and first give decode an upcaster
  for the older schema (today decode hands an older schema straight to the class, which is right
  for additive changes only; no upcaster exists yet).
* Until the first release, schema 1 of every type is still open to change.
* Lists are stored as JSON arrays and held as tuples (converters), so events stay immutable.
* No secrets in any event, ever: API keys travel in ``Append.secrets`` to the ``secrets`` table.
"""

import base64
import hashlib
import json
import json.encoder
from collections.abc import Callable
from typing import Any, ClassVar, Literal, TypeVar

import attrs

__all__ = [
    "BODY_LIMIT",
    "ControlStarted",
    "Event",
    "Recorded",
    "UnknownEvent",
    "decode",
    "decode_parsed",
    "encode",
    "event_class",
    "event_type",
    "event_types",
    "tuple_field",
]


class Event:
    """Base class of every registered journal event (frozen attrs classes, see :func:`event_type`)."""

    __slots__ = ()
    TYPE: ClassVar[str]
    SCHEMA: ClassVar[int]
    # Field names in attrs order, cached at registration: encode() reads them instead of calling
    # attrs.asdict(), which is several times slower and sits on the append hot path.
    _FIELDS: ClassVar[tuple[str, ...]]


@attrs.frozen(slots=True)
class UnknownEvent:
    """An event this code cannot decode: unknown type, newer schema, or a payload that does not fit.

    ``payload`` is the parsed JSON (usually a dict), or the raw text when it is not valid JSON.
    Re-encoding an UnknownEvent with a parsed payload gives back the same canonical JSON, so such
    events survive copies between journals.
    """

    type: str
    schema: int
    payload: Any


@attrs.frozen(slots=True)
class Recorded:
    """An event as stored: its global position, commit time (unix seconds), stream and chain hash."""

    seq: int
    ts: float
    stream: str
    event: Event | UnknownEvent
    hash: str


# The registry is filled by @event_type at import time and never changes afterwards.
_REGISTRY: dict[str, type[Event]] = {}

E = TypeVar("E", bound=type[Event])


def event_type(name: str, *, schema: int) -> Callable[[E], E]:
    """Class decorator: register an attrs event class under ``name`` with schema version ``schema``.

    Apply it *outside* ``@attrs.frozen`` (slots=True makes attrs build a new class; the registry
    must hold that one).
    """
    if not name or name != name.strip():
        raise ValueError(f"invalid event type name {name!r}")
    if schema < 1:
        raise ValueError("schema numbers start at 1")

    def register(cls: E) -> E:
        if not attrs.has(cls) or not issubclass(cls, Event):
            raise TypeError(f"{cls.__name__} must be an attrs class deriving from journal.codec.Event")
        existing = _REGISTRY.get(name)
        if existing is not None and existing.__qualname__ != cls.__qualname__:
            raise ValueError(f"event type {name!r} is already registered by {existing.__qualname__}")
        cls.TYPE = name
        cls.SCHEMA = schema
        cls._FIELDS = tuple(f.name for f in attrs.fields(cls))
        _REGISTRY[name] = cls
        return cls

    return register


def event_class(name: str) -> type[Event] | None:
    """The class registered for a type name, or None."""
    return _REGISTRY.get(name)


def event_types() -> list[str]:
    """Every registered type name, sorted (what ``smgrl journal events --type`` globs cover)."""
    return sorted(_REGISTRY)


def _make_dumps() -> Callable[[Any], str]:
    """The canonical JSON encoder: ``json.dumps(obj, separators=(",", ":"), sort_keys=True,
    ensure_ascii=False, allow_nan=False)``, built once.

    ``json.dumps`` with non-default options builds a JSONEncoder per call, and even a reused
    JSONEncoder builds its C scanner per call: together a third of the cost of encoding an event,
    on the append hot path. So hold the C encoder itself (what ``JSONEncoder.iterencode`` builds)
    when CPython has one; the result is identical (a property test compares it with json.dumps).
    allow_nan=False: NaN/Infinity are not JSON; SQLite's json functions and other readers reject
    them, so refuse them at append time (in the caller) rather than store an unreadable row.
    """
    slow = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False, allow_nan=False).encode
    c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
    if c_make_encoder is None:  # pragma: no cover - not CPython
        return slow

    def default(obj: Any) -> Any:
        raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

    # (markers, default, encoder, indent, key_separator, item_separator, sort_keys, skipkeys, allow_nan)
    fast = c_make_encoder(None, default, json.encoder.encode_basestring, None, ":", ",", True, False, False)

    def dumps(obj: Any) -> str:
        return "".join(fast(obj, 0))

    return dumps


_dumps = _make_dumps()


def encode(ev: Event | UnknownEvent) -> tuple[str, int, str]:
    """``(type, schema, canonical JSON payload)`` of an event.

    Identical to ``json.dumps(attrs.asdict(ev, recurse=True), separators=(",", ":"),
    sort_keys=True, ensure_ascii=False)`` (tests assert it), but built from the cached field names:
    json.dumps already renders tuples as arrays and recurses into dicts.
    """
    if isinstance(ev, UnknownEvent):
        if isinstance(ev.payload, str):
            raise TypeError(f"cannot re-encode an undecodable payload of event type {ev.type!r}")
        return ev.type, ev.schema, _dumps(ev.payload)
    cls = type(ev)
    if _REGISTRY.get(getattr(cls, "TYPE", None)) is not cls:  # type: ignore[arg-type]
        raise TypeError(f"{cls.__name__} is not a registered journal event")
    try:
        payload = _dumps({name: getattr(ev, name) for name in cls._FIELDS})
    except TypeError:
        # A field holds something json does not know (e.g. a nested attrs value): asdict() it.
        payload = _dumps(attrs.asdict(ev, recurse=True))  # type: ignore[arg-type]  # every Event is an attrs class (event_type checks)
    return cls.TYPE, cls.SCHEMA, payload


def decode(type: str, schema: int, payload_json: str) -> Event | UnknownEvent:
    """The event for a stored row; an UnknownEvent instead of any error (see the module docstring)."""
    if not isinstance(payload_json, str):
        # A payload stored as a BLOB (edited outside the journal): shown as text, never decoded.
        text = (
            bytes(payload_json).decode("utf-8", "replace")
            if isinstance(payload_json, (bytes, bytearray, memoryview))
            else repr(payload_json)
        )
        return UnknownEvent(type, schema, text)
    try:
        payload = json.loads(payload_json)
    except (ValueError, TypeError, RecursionError):
        # Not JSON, or nested deeper than any event (100,000 levels): not an event of this catalogue.
        return UnknownEvent(type, schema, payload_json)
    return decode_parsed(type, schema, payload)


def decode_parsed(type: str, schema: int, payload: Any) -> Event | UnknownEvent:
    """``decode`` for a payload already parsed (startup parses each row once, for the hash check
    and the fold together). ``payload`` is used as is: pass a fresh object."""
    cls = _REGISTRY.get(type)
    if cls is None or schema > cls.SCHEMA or not isinstance(payload, dict):
        return UnknownEvent(type, schema, payload)
    try:
        # The fast path: keyword construction, no validators. Missing optional fields take their
        # defaults; an unexpected or missing required key raises TypeError -> UnknownEvent.
        event = cls(**payload)
    except (TypeError, ValueError):
        return UnknownEvent(type, schema, payload)
    if isinstance(event, ControlStarted) and not _body_readable(event):
        return UnknownEvent(type, schema, payload)  # a kept body in no known encoding (edited)
    return event


def tuple_field(**kwargs: Any) -> Any:
    return attrs.field(converter=tuple, factory=tuple, **kwargs)


# ---------------------------------------------------------------------------------------------
# The one event the store's format knows (see the module docstring).
# ---------------------------------------------------------------------------------------------

BODY_LIMIT = 64 * 1024  # request bodies up to this size are kept in control.started


@event_type("control.started", schema=2)
@attrs.frozen(slots=True, kw_only=True)
class ControlStarted(Event):
    """A control call or fan-out was accepted, before any engine was contacted.

    ``targets`` holds ``{"worker_id", "url", "control_url"}`` dicts. The request body is kept when
    it is at most 64 KiB: ``body_encoding`` "utf8" (text) or "base64" (bytes that are not UTF-8);
    "none" when there was no body to keep. ``body_sha256`` always covers the full raw body, and
    the journal checks the kept body against it. Old bodies may be compacted away (``body``
    becomes null, ``body_encoding`` stays): see ``journal.store``. Build the four body fields with
    :meth:`body_fields` so they are always consistent.
    """

    op_id: str
    kind: Literal["call", "fanout"]
    method: str
    path: str
    body_size: int
    body_sha256: str
    query: str | None = None
    selector: str | None = None
    targets: tuple[dict[str, str | None], ...] = tuple_field()
    body: str | None = None
    body_encoding: Literal["utf8", "base64", "none"] = "none"
    content_type: str | None = None
    principal: str | None = None
    request_id: str | None = None
    # What a 2xx answer would confirm ({"version", "control", "phase"}; see smgrl.core.observe),
    # computed from the body when the call was made, so replay never needs a compacted body.
    intent: dict[str, str | None] | None = None
    # Several gateway processes on one journal (schema 2): the process that runs the operation
    # (smgrl/cluster/sharing.py); when it dies, the lease holder records the operation interrupted.
    gateway: str | None = None

    @staticmethod
    def body_fields(raw: bytes, *, limit: int = BODY_LIMIT) -> dict[str, Any]:
        """``body_size``, ``body_sha256``, ``body`` and ``body_encoding`` for a raw request body."""
        if not raw:
            return dict(_NO_BODY)  # most control calls have no body: its digest is a constant
        fields: dict[str, Any] = {
            "body_size": len(raw),
            "body_sha256": hashlib.sha256(raw).hexdigest(),
            "body": None,
            "body_encoding": "none",
        }
        if raw and len(raw) <= limit:
            try:
                fields["body"], fields["body_encoding"] = raw.decode("utf-8"), "utf8"
            except UnicodeDecodeError:
                fields["body"], fields["body_encoding"] = base64.b64encode(raw).decode("ascii"), "base64"
        return fields

    def body_bytes(self) -> bytes | None:
        """The kept request body as bytes; None when not kept (too large, empty or compacted)."""
        return _body_bytes(self.body, self.body_encoding)


_NO_BODY: dict[str, Any] = {
    "body_size": 0,
    "body_sha256": hashlib.sha256(b"").hexdigest(),
    "body": None,
    "body_encoding": "none",
}


def _body_readable(event: ControlStarted) -> bool:
    """A kept body is a string in a known encoding (its bytes are read by whoever needs them)."""
    return event.body is None or (type(event.body) is str and event.body_encoding in ("utf8", "base64"))


def _body_bytes(body: Any, encoding: Any) -> bytes | None:
    """Raw bytes of a control.started body (also used by verify on undecoded payloads)."""
    if body is None:
        return None
    if not isinstance(body, str):
        raise TypeError("body must be a string")
    if encoding == "utf8":
        return body.encode("utf-8")
    if encoding == "base64":
        return base64.b64decode(body.encode("ascii"), validate=True)
    raise ValueError(f"a body is present but body_encoding is {encoding!r}")

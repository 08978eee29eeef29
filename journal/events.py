"""Journal events: the machinery (registry, canonical JSON codec) and the catalogue.

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
    "AuditControlPlane",
    "AuditControlPlaneCounts",
    "ControlFinished",
    "ControlInterrupted",
    "ControlOutcome",
    "ControlStarted",
    "Event",
    "GatewayPeer",
    "GatewayStarted",
    "GatewayStopped",
    "Recorded",
    "SnapshotTaken",
    "UnknownEvent",
    "WorkerDiscovered",
    "WorkerHealthChanged",
    "WorkerLabelsChanged",
    "WorkerProbeFailed",
    "WorkerRegistered",
    "WorkerRemoved",
    "decode",
    "encode",
    "event_class",
    "event_type",
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
            raise TypeError(f"{cls.__name__} must be an attrs class deriving from journal.events.Event")
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
        payload = _dumps(attrs.asdict(ev, recurse=True))
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
    if cls is ControlStarted and not _body_readable(event):
        return UnknownEvent(type, schema, payload)  # a kept body in no known encoding (edited)
    return event


def _tuple_field(**kwargs: Any) -> Any:
    return attrs.field(converter=tuple, factory=tuple, **kwargs)


# ---------------------------------------------------------------------------------------------
# The catalogue. All fields are JSON-friendly; labels are dict[str, str]; no secrets, ever.
# ---------------------------------------------------------------------------------------------

Source = Literal["cli", "api"]


# Event classes share a shape (type, schema, fields), not logic: each is a contract of its own (journal.md).
@event_type("worker.registered", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class WorkerRegistered(Event):
    """A worker was registered (by the CLI at launch or through the API). Its key is in ``secrets``."""

    worker_id: str
    url: str
    base_url: str
    source: Source
    worker_type: str = "regular"
    connection_mode: str = "http"
    labels: dict[str, str] = attrs.field(factory=dict)  # as given by the caller
    model_id: str | None = None
    runtime: str | None = None  # the caller's hint; discovery records what the engine says
    has_api_key: bool = False
    bootstrap_port: int | None = None
    dp_aware: bool = False


@event_type("worker.discovered", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class WorkerDiscovered(Event):
    """Discovery probed the engine. ``dp_rank_ids`` lists ranks 0..N-1 (rank 0 = worker_id) when a
    DP-aware worker was expanded, and is empty otherwise."""

    worker_id: str
    runtime: str
    labels: dict[str, str] = attrs.field(factory=dict)  # as discovered
    model_id: str | None = None
    dp_rank_ids: tuple[str, ...] = _tuple_field()


@event_type("worker.probe_failed", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class WorkerProbeFailed(Event):
    worker_id: str
    attempt: int
    error: str
    next_retry_s: float


@event_type("worker.labels_changed", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class WorkerLabelsChanged(Event):
    worker_id: str
    labels: dict[str, str]
    mode: Literal["merge", "replace"]


@event_type("worker.health_changed", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class WorkerHealthChanged(Event):
    worker_id: str
    health: str
    reason: str


@event_type("worker.removed", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class WorkerRemoved(Event):
    worker_id: str
    reason: str


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
    targets: tuple[dict[str, str | None], ...] = _tuple_field()
    body: str | None = None
    body_encoding: Literal["utf8", "base64", "none"] = "none"
    content_type: str | None = None
    principal: str | None = None
    request_id: str | None = None
    # What a 2xx answer would confirm ({"version", "control", "phase"}; see smgrl.core.observe),
    # computed from the body when the call was made, so replay never needs a compacted body.
    intent: dict[str, str | None] | None = None
    # Several gateway processes on one journal (schema 2): the process that runs the operation
    # (smgrl/sharing.py); when it dies, the lease holder records the operation interrupted.
    gateway: str | None = None

    @staticmethod
    def body_fields(raw: bytes, *, limit: int = BODY_LIMIT) -> dict[str, Any]:
        """``body_size``, ``body_sha256``, ``body`` and ``body_encoding`` for a raw request body."""
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


@event_type("control.outcome", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class ControlOutcome(Event):
    """One engine's answer (or failure) within a control call or fan-out."""

    op_id: str
    worker_id: str
    url: str
    latency_ms: int
    control_url: str | None = None
    status: int | None = None
    error: str | None = None
    message: str | None = None
    excerpt: str = ""  # bounded excerpt of the engine's answer
    body_truncated: bool = False
    # Where a failed exchange stopped (None when the engine answered): "connect" (never reached
    # the engine), "send" (the request may not have been read), "head" (no answer before the
    # deadline), "body" (the answer was cut off: the engine did act). Engine state is decided
    # from it (smgrl/state/engines.py), never from the message text.
    stage: Literal["connect", "send", "head", "body"] | None = None


@event_type("control.finished", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class ControlFinished(Event):
    op_id: str
    result: Literal["ok", "partial", "no_match", "failed", "cancelled", "error"]
    http_status: int
    total: int
    succeeded: int
    failed: int
    latency_ms: int


@event_type("control.interrupted", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class ControlInterrupted(Event):
    """A control operation that never got its control.finished (shutdown, or found at restart)."""

    op_id: str
    reason: Literal["gateway_restart", "shutdown"]
    recorded_targets: tuple[str, ...] = _tuple_field()
    missing_targets: tuple[str, ...] = _tuple_field()


@event_type("audit.control_plane", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class AuditControlPlane(Event):
    principal: str
    auth_method: str
    method: str
    path: str
    outcome: Literal["success", "denied"]
    status: int
    role: str | None = None
    resource: str | None = None
    request_id: str | None = None
    reason: str | None = None


@event_type("audit.control_plane_counts", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class AuditControlPlaneCounts(Event):
    """Control-plane reads and denials over ``[since, until)`` (unix seconds), counted per
    principal, route family, outcome and reason: ``counts`` holds ``{"principal", "family",
    "outcome", "reason", "count"}`` dicts. Allowed writes stay individual ``audit.control_plane``
    events."""

    since: float
    until: float
    counts: tuple[dict[str, Any], ...] = _tuple_field()


@event_type("gateway.started", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class GatewayStarted(Event):
    """``config`` must already be scrubbed of secrets by the caller."""

    version: str
    pid: int
    config: dict[str, Any] = attrs.field(factory=dict)


@event_type("gateway.stopped", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class GatewayStopped(Event):
    clean: bool
    reason: str


@event_type("gateway.peer", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class GatewayPeer(Event):
    """Several gateway processes on one journal: where this process takes requests forwarded to
    it (docs/scale-out.md, "Forwarding"), on stream ``peer:<owner>``. ``gateway`` is its identity
    (``host:pid:tag``, as in ``control.started``), ``owner`` the owner part of its session ids,
    ``url`` its private loopback listener (reached from the same ``host``), ``advertise_url`` the
    URL other hosts reach it at (``--advertise-url``), if any. No secret: the forwarded request
    carries the caller's own credentials."""

    gateway: str
    owner: str
    host: str
    url: str
    advertise_url: str | None = None


@event_type("snapshot.taken", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class SnapshotTaken(Event):
    """Marker only: the snapshot's state lives in the ``snapshots`` table."""

    kind: str
    upto_seq: int


# -- explicit version/state writes (the data plane's table; rl-control-plane.md Appendix A.1) ---

EngineControl = Literal["active", "paused", "asleep"]


@event_type("engine.version_set", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class EngineVersionSet(Event):
    """An explicit weight-version write (``POST /v1/rl/workers/{id}/version`` or
    ``POST /v1/rl/version?selector=``): no engine is called, the table records the version
    (``version_source: api``) and confirms it (clears ``mixed``/unknown version).

    ``targets`` holds ``{"worker_id", "url", "base_url"}`` dicts, one per engine written (DP ranks
    share one). ``selector`` is the fan-out form's (trimmed) selector, null for the per-worker form.
    """

    weight_version: str
    targets: tuple[dict[str, str], ...] = _tuple_field()
    selector: str | None = None
    principal: str | None = None
    request_id: str | None = None


@event_type("engine.state_set", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class EngineStateSet(Event):
    """An explicit control-state write (``POST /v1/rl/workers/{id}/state`` or
    ``POST /v1/rl/state?selector=``): the table says ``control`` from now on (routing follows)."""

    control: EngineControl
    targets: tuple[dict[str, str], ...] = _tuple_field()
    selector: str | None = None
    principal: str | None = None
    request_id: str | None = None


@event_type("dataplane.request_looped_back", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class RequestLoopedBack(Event):
    """A rollout an engine aborted because of a control call through the gateway (a sync) and
    that the data plane continued (partial-rollout loopback, ``smgrl.dataplane.loopback``).

    ``segments`` holds one ``{"iteration", "worker_id", "url", "dp_rank", "version", "start",
    "end", "finish_reason", "op_id"}`` dict per engine answer (token span over the output);
    ``op_ids`` the operations whose aborts caused the loopbacks (``op:<op_id>`` streams).
    """

    request_id: str | None = None
    route: str = "/generate"
    model: str | None = None
    prompt_tokens: int = 0
    generated_tokens: int = 0
    tokens_kept: int = 0  # decoded before the last loopback: not regenerated
    loopbacks: int = 0
    outcome: Literal["completed", "aborted", "limit_exceeded", "failed", "cancelled"] = "completed"
    op_ids: tuple[str, ...] = _tuple_field()
    segments: tuple[dict[str, Any], ...] = _tuple_field()


@event_type("dataplane.group_pinned", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class GroupPinned(Event):
    """A prompt group's instance, decided once across the gateway processes sharing the journal
    (appended only if no pin of the group was appended since the deciding process's position;
    ``smgrl.dataplane.pins``). A lone gateway keeps its pins in memory and writes none."""

    prompt_id: str
    worker_id: str  # the instance's engine (the rank-0 record's registry id)
    dp_rank: int = 0
    gateway: str = ""  # the process that decided it, and releases it (its identity)


@event_type("dataplane.group_released", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class GroupReleased(Event):
    """The pin ``pin_seq`` of a prompt group ended: its process's last running request of the
    group ended (``ended``), or that process is gone (``gateway_gone``, by the recovery holder)."""

    prompt_id: str
    pin_seq: int
    reason: Literal["ended", "gateway_gone"] = "ended"


@event_type("dataplane.dispatch_set", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class DispatchSet(Event):
    """The coordinator paused or resumed rollout dispatch (``POST /routing_loop/pause|resume``):
    while paused, new rollout requests wait in the gateway and in-flight ones finish."""

    paused: bool
    principal: str | None = None
    request_id: str | None = None


# -- agent sessions (docs/sessions.md): lifecycle and one summary per captured turn -------------
# Never token arrays, message text or header values beyond the allow-listed routing defaults.


@event_type("session.created", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class SessionCreated(Event):
    """``owner`` is the id of the gateway process holding the session in memory; ``api`` says
    which route made it (``sessions``: ``POST /sessions``; ``tito``: SMG's ``/tito/sessions`` or a
    first ``x-smg-tito-session-id`` turn)."""

    session_id: str
    owner: str
    api: str = "sessions"
    sticky: bool = False
    version_floor: str | None = None
    default_headers: dict[str, str] = attrs.field(factory=dict)


@event_type("session.turn", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class SessionTurn(Event):
    """One assistant turn of a session: sizes, prefix reuse, the weights that produced it, the
    engine, timings (milliseconds). ``weight_versions`` holds ``{"version","start","end"}`` spans
    over the output tokens when the weights changed during the turn."""

    session_id: str
    turn: int
    trajectory_id: int
    prompt_tokens: int
    output_tokens: int
    reused_tokens: int
    prefix: str
    captured: bool
    finish_reason: str
    weight_version: str | None = None
    weight_versions: tuple[dict[str, Any], ...] = _tuple_field()
    worker_id: str | None = None
    engine_url: str | None = None
    prepare_ms: float = 0.0
    engine_ms: float = 0.0
    request_id: str | None = None


@event_type("session.hung", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class SessionHung(Event):
    """``deferred``: a turn was in flight, the session hangs when it ends (nothing is aborted)."""

    session_id: str
    deferred: bool


@event_type("session.continued", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class SessionContinued(Event):
    session_id: str
    pin_worker_id: str | None = None
    pin_dp_rank: int | None = None


@event_type("session.deleted", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class SessionDeleted(Event):
    session_id: str
    turns: int
    reason: str


@event_type("session.ended", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class SessionEnded(Event):
    """A session the journal saw created and never deleted, ended by a later gateway start
    (``reason: restart``): sessions live in memory and are never served half-remembered."""

    session_id: str
    reason: str
    owner: str | None = None

"""The catalogue of smgrl's journal events (docs/journal.md): fleet, control, audit, gateway,
snapshot, engine, data-plane and session events. The machinery (``Event``, ``event_type``, the
canonical codec) and ``control.started`` are the journal's own (``journal/codec.py``)."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from journal.codec import Event, event_type, tuple_field

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
    dp_rank_ids: tuple[str, ...] = tuple_field()


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
    recorded_targets: tuple[str, ...] = tuple_field()
    missing_targets: tuple[str, ...] = tuple_field()


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
    counts: tuple[dict[str, Any], ...] = tuple_field()


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


# -- explicit version/state writes (the data plane's version table, docs/data-plane.md) --------

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
    targets: tuple[dict[str, str], ...] = tuple_field()
    selector: str | None = None
    principal: str | None = None
    request_id: str | None = None


@event_type("engine.state_set", schema=1)
@attrs.frozen(slots=True, kw_only=True)
class EngineStateSet(Event):
    """An explicit control-state write (``POST /v1/rl/workers/{id}/state`` or
    ``POST /v1/rl/state?selector=``): the table says ``control`` from now on (routing follows)."""

    control: EngineControl
    targets: tuple[dict[str, str], ...] = tuple_field()
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
    op_ids: tuple[str, ...] = tuple_field()
    segments: tuple[dict[str, Any], ...] = tuple_field()


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
    weight_versions: tuple[dict[str, Any], ...] = tuple_field()
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

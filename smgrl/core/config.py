"""Gateway configuration: one frozen value built from ``smgrl launch`` flags.

Flags mirror SMG 1.13.0's ``smg launch`` where they apply (same names, defaults and meaning);
``validate`` reproduces SMG's startup error texts for the RL section because operators grep for
them. Nothing here does I/O.
"""

from __future__ import annotations

from typing import Any

import attrs

from journal.urls import redact_url
from smgrl.core import reaches_listener, self_registration, worker_url_problem
from smgrl.core.auth import ControlPlaneKey, TenantKey
from smgrl.core.errors import ConfigError

DEFAULT_JOURNAL = "./smgrl-journal.db"


@attrs.frozen
class RlConfig:
    enabled: bool = False
    control_timeout_secs: int = 600
    fanout_concurrency: int = 32
    version_policy: str = "any"


@attrs.frozen
class HealthConfig:
    enabled: bool = True
    interval_secs: float = 60.0
    timeout_secs: float = 5.0
    failure_threshold: int = 3
    success_threshold: int = 2
    endpoint: str = "/health"


@attrs.frozen
class RetryConfig:
    """Data-plane retries (SMG's ``--retry-*``): only before the first byte reaches the client,
    only on connection errors and 5xx answers; control calls never retry."""

    max_retries: int = 5
    initial_backoff_ms: int = 50
    max_backoff_ms: int = 30_000
    backoff_multiplier: float = 1.5
    jitter_factor: float = 0.2
    enabled: bool = True


@attrs.frozen
class BreakerConfig:
    """Per-engine circuit breaker (SMG's ``--cb-*``); data plane only. ``--disable-circuit-breaker``
    is ``Config.disable_circuit_breaker``."""

    failure_threshold: int = 10
    success_threshold: int = 3
    timeout_secs: float = 60.0
    window_secs: float = 120.0


@attrs.frozen
class DataPlaneConfig:
    """Rollout routing: policy tuning, admission, retries, breaker and the eligibility wait."""

    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    max_tree_size: int = 67_108_864
    # How long a request may wait in the gateway for an eligible engine before a retryable 503.
    # None: through a sync in progress (paused engines, an open refit...) up to the whole
    # --request-timeout-secs, and 30 s past it (smgrl/dataplane/waiting.py); a value bounds every wait.
    eligible_wait_secs: float | None = None
    max_concurrent_requests: int = -1
    queue_size: int = 100
    queue_timeout_secs: float = 60.0
    retry: RetryConfig = RetryConfig()
    breaker: BreakerConfig = BreakerConfig()
    # Memory bounds (docs/data-plane.md): the largest rollout request body (also capped by
    # --max-payload-size), and the bytes of rollout bodies and buffered answers held at once.
    max_body_size: int = 67_108_864
    memory_budget: int = 1_073_741_824
    # How long a rollout or session body may take to arrive, from the first read: a declared body
    # holds its bytes of the budget while it trickles in (408 request_body_stalled after).
    body_timeout_secs: float = 30.0
    # SMG's --stream-body-stall-timeout-secs: no body bytes for this long is a 408 (0: off).
    stall_timeout_secs: float = 300.0
    # --admission-hook module:object (smgrl/dataplane/hook.py); None admits everything.
    admission_hook: str | None = None
    # Partial-rollout loopbacks per request (smgrl/dataplane/loopback/); 0 turns them off.
    max_loopbacks: int = 8
    # --psrl-group-sticky (PSRL's psrl_enable_group_sticky): pin a prompt group's requests to the
    # instance its first request took while the group runs; off by default, as in PSRL's fork.
    psrl_group_sticky: bool = False


@attrs.frozen
class SessionsConfig:
    """Agent sessions with token-exact capture (docs/sessions.md); off without a tokenizer."""

    tokenizer_path: str | None = None
    # Without tokenizer_path: take the tokenizer a gRPC engine serves (GetTokenizer), once one is
    # registered, as PSRL's SMG fork does for TITO; turns before that answer 503.
    from_engines: bool = False
    max_sessions: int = 4096
    gc_threshold: int = 0
    trajectory_strategy: str = "auto"  # "auto" | "manual"
    tool_parser: str = "hermes"
    debug: bool = False
    idle_timeout_secs: float = 3600.0  # 0: sessions never expire
    max_stored_tokens: int = 2_000_000  # per session, its captured trajectories' ids; 0: no budget


SORT_KEYS = ("version", "reserve_capability")
STRATEGIES = ("naive", "psrl")


@attrs.frozen
class PsrlConfig:
    # "psrl": requests carrying routing metadata take the staged selection; "naive" as well
    # (smgrl stages every request that carries metadata: docs/psrl.md).
    strategy: str = "psrl"
    # Stage 5's order: "version" (newest first / lowest acceptable first) or PSManager's
    # reserve indicator ("reserve_capability", needs ps_manager_addr).
    candidate_sort_key: str = "version"
    # PSManager's gRPC address (host:port, grpc:// or http:// accepted); None: no PSManager.
    ps_manager_addr: str | None = None
    # The bound on one PSManager call; past it the call counts as failed (the fork's fallback).
    ps_manager_timeout_secs: float = 0.5
    # How often a request held out by PSManager or the KV gate asks again (the fork's routing
    # loop re-polls its queue every check interval).
    recheck_secs: float = 0.01
    reject_on_waiting: bool = False
    kv_capacity_threshold: float = 1.0


@attrs.frozen
class RoutingLoopConfig:
    """PSRL's routing loop (RouterArgs ``enable_routing_loop`` and its tunables): requests that
    find no admissible instance wait in one queue per model and are handed dispatch attempts in
    the fork's order (smgrl/routing/dispatch_order.py, smgrl/runtime/routing_loop.py)."""

    # How often requests held out by answers no event announces (PSManager, the engines'
    # reports, an open breaker) are tried again; every other change wakes the loop at once.
    check_interval_secs: float = 0.01
    sort_key: str = "short_length"  # short_length | long_length | small_id
    multi_priority: bool = False  # partitions by version tag, lowest first
    dispatch_batch_size: int = 1024  # dispatch attempts per pass
    # Requests in flight per instance (RouterArgs max_concurrent_seqs_per_instance); past it an
    # instance is held out (``instance_full``) and requests wait in the queue. None: no cap.
    max_seqs_per_instance: int | None = None


@attrs.frozen
class Config:
    host: str = "127.0.0.1"
    port: int = 30000
    worker_urls: tuple[str, ...] = ()
    api_key: str | None = attrs.field(default=None, repr=False)
    policy: str = "cache_aware"
    rl: RlConfig = RlConfig()
    health: HealthConfig = HealthConfig()
    max_payload_size: int = 536_870_912
    # Control-plane requests with a body over 1 MiB served at once (smgrl/http/bodies/control_bodies.py).
    max_concurrent_large_bodies: int = 4
    request_timeout_secs: float = 1800.0
    # Server-sent event streams open at once (journal stream, refit events): smgrl/http/routes/event_streams.py.
    max_event_streams: int = 64
    disable_circuit_breaker: bool = False
    dp_aware: bool = False
    dataplane: DataPlaneConfig = DataPlaneConfig()
    sessions: SessionsConfig = SessionsConfig()
    control_plane_keys: tuple[ControlPlaneKey, ...] = ()
    tenant_keys: tuple[TenantKey, ...] = ()
    prometheus_host: str | None = None
    prometheus_port: int | None = (
        29000  # 0: a free port (logged); None: no metrics listener (in-process gateways)
    )
    shutdown_grace_period_secs: float = 180.0
    # HTTP connection bounds, as SMG's (smgrl/http/server/connection.py): a connection
    # must send a complete request head this soon after it is accepted (or after the first byte
    # of a keep-alive connection's next head), and a keep-alive connection with no request in
    # flight closes after the idle bound. 0 disables either.
    header_read_timeout_secs: float = 30.0
    idle_connection_timeout_secs: float = 90.0
    log_level: str = "info"
    log_json: bool = False
    disable_load_monitoring: bool = False
    # The load monitor (smgrl/registry/loads.py): seconds between a worker group's reads, and
    # SMG's overload-protection switch, which only completes --disable-load-monitoring's gate.
    load_monitor_interval_secs: float = 10.0
    disable_worker_overload_protection: bool = False
    journal: str = DEFAULT_JOURNAL
    # How long a journal append waits for SQLite's write lock held by another process (a
    # `smgrl journal compact`, say) before the operation fails with 503.
    journal_lock_wait_secs: float = 5.0
    audit: bool = True
    # Reads and denials are journaled as counts, one audit.control_plane_counts event per interval.
    audit_interval_secs: float = 60.0
    # Registration probe retry: first retry after this many seconds, doubling up to the cap.
    registration_backoff_initial_secs: float = 0.5
    registration_backoff_max_secs: float = 30.0
    # Several gateway hosts on one journal: the URL other hosts forward requests for this
    # process's sessions and refits to (docs/scale-out.md, "Forwarding"); None: same host only.
    advertise_url: str | None = None
    # The private loopback port the other gateway processes forward to (0: a free one), and with
    # --workers N each worker's own metrics port that the supervisor scrapes (0: a free one);
    # worker i takes PORT + i (docs/scale-out.md, "Pinning the per-worker ports").
    forward_port: int = 0
    worker_metrics_port: int = 0

    # PSRL's selection settings (RouterArgs, smgrl.launch_router; docs/psrl.md): None leaves the
    # data plane as the flags set it.
    psrl: PsrlConfig | None = None
    # PSRL's routing loop (RouterArgs enable_routing_loop): None, requests wait each on its own.
    routing_loop: RoutingLoopConfig | None = None

    def scrubbed(self) -> dict[str, Any]:
        """The configuration as JSON with every secret removed (for the journal's gateway.started)."""
        return {
            "host": self.host,
            "port": self.port,
            "worker_urls": list(self.worker_urls),
            "api_key_set": self.api_key is not None,
            "policy": self.policy,
            "rl": attrs.asdict(self.rl),
            "health": attrs.asdict(self.health),
            "max_payload_size": self.max_payload_size,
            "dp_aware": self.dp_aware,
            "sessions": attrs.asdict(self.sessions),
            "control_plane_keys": [
                {"id": k.id, "name": k.name, "role": k.role} for k in self.control_plane_keys
            ],
            "tenant_keys": [k.tenant for k in self.tenant_keys],
            "journal": redact_url(self.journal),  # a postgresql:// URL without its password
            "journal_lock_wait_secs": self.journal_lock_wait_secs,
            "audit": self.audit,
            "audit_interval_secs": self.audit_interval_secs,
            "advertise_url": self.advertise_url,
            "psrl": attrs.asdict(self.psrl) if self.psrl is not None else None,
        }


def check(cfg: Config) -> Config:
    """Raise ConfigError with SMG's wording for values SMG refuses; return cfg unchanged otherwise.

    Pure: what needs the process (loading the admission hook's module) is checked at startup by
    ``smgrl.runtime.startup.validate``, which calls this first."""
    rl = cfg.rl
    if rl.enabled:
        # SMG reports only the first failing rule (the timeout is checked first).
        problem = None
        if rl.control_timeout_secs < 1:
            problem = "rl.control_timeout_secs must be >= 1"
        elif rl.fanout_concurrency < 1:
            problem = "rl.fanout_concurrency must be >= 1"
        if problem:
            raise ConfigError(
                "Configuration error: Invalid value for field 'rl': "
                f"control_timeout_secs={rl.control_timeout_secs} "
                f"fanout_concurrency={rl.fanout_concurrency} - {problem}"
            )
    elif rl.version_policy != "any":
        raise ConfigError(
            "Configuration error: Invalid value for field 'rl': --rl-version-policy requires --enable-rl"
        )
    _validate_dataplane(cfg)
    for name, port in (
        ("--forward-port", cfg.forward_port),
        ("--worker-metrics-port", cfg.worker_metrics_port),
    ):
        if not 0 <= port <= 65535:
            raise ConfigError(f"Invalid {name} {port} (expected 0-65535)")
    if cfg.advertise_url is not None:
        problem = advertise_url_problem(cfg.advertise_url)
        if problem is not None:
            raise ConfigError(f"--advertise-url: {problem}")
    for url in cfg.worker_urls:
        problem = worker_url_problem(url)
        if problem is not None:
            # SMG's launch says "Configuration error: <the /workers text>" too.
            raise ConfigError(f"Configuration error: {problem}")
        if cfg.port and reaches_listener(url, cfg.host, cfg.port):
            raise ConfigError(f"Configuration error: {self_registration(url)}")
    if not 0 <= cfg.port <= 65535:
        raise ConfigError(f"Invalid --port {cfg.port} (expected 0-65535)")
    if cfg.prometheus_port is not None and not 0 <= cfg.prometheus_port <= 65535:
        raise ConfigError(f"Invalid --prometheus-port {cfg.prometheus_port} (expected 0-65535)")
    if cfg.max_payload_size < 1:
        raise ConfigError("Invalid --max-payload-size (expected a positive number of bytes)")
    if cfg.max_concurrent_large_bodies < 1:
        raise ConfigError("Invalid --max-concurrent-large-bodies (expected >= 1)")
    if cfg.health.interval_secs < 1 or cfg.health.timeout_secs < 1:
        raise ConfigError("Invalid health check timing (interval and timeout must be at least 1 second)")
    if cfg.health.failure_threshold < 1 or cfg.health.success_threshold < 1:
        raise ConfigError("Invalid health check thresholds (expected at least 1)")
    ids = [k.id for k in cfg.control_plane_keys]
    if len(set(ids)) != len(ids):
        raise ConfigError("Duplicate id in --control-plane-api-keys")
    if cfg.shutdown_grace_period_secs < 0:
        raise ConfigError("Invalid --shutdown-grace-period-secs (expected >= 0)")
    if not cfg.header_read_timeout_secs >= 0:
        raise ConfigError("Invalid --header-read-timeout-secs (expected >= 0)")
    if not cfg.idle_connection_timeout_secs >= 0:
        raise ConfigError("Invalid --idle-connection-timeout-secs (expected >= 0)")
    if cfg.journal_lock_wait_secs < 0:
        raise ConfigError("Invalid --journal-lock-wait-secs (expected >= 0)")
    if cfg.audit_interval_secs <= 0:
        raise ConfigError("Invalid --audit-interval-secs (expected > 0)")
    return cfg


def _validate_dataplane(cfg: Config) -> None:
    # The version policy's grammar is the routing layer's (smgrl.routing.VersionPolicy): it is
    # checked by smgrl.runtime.startup.validate, above both.
    dp = cfg.dataplane
    if dp.max_loopbacks < 0:
        raise ConfigError("Invalid --max-loopbacks (expected >= 0)")
    if dp.eligible_wait_secs is not None and dp.eligible_wait_secs < 0:
        raise ConfigError("Invalid --eligible-wait-secs (expected >= 0)")
    if dp.max_body_size < 1 or dp.memory_budget < dp.max_body_size:
        # A budget smaller than one body would refuse every request at its size limit.
        raise ConfigError(
            "Invalid --dataplane-max-body-size / --dataplane-memory-budget "
            "(expected 1 <= max body size <= memory budget)"
        )
    if not dp.stall_timeout_secs >= 0:
        raise ConfigError("Invalid --stream-body-stall-timeout-secs (expected >= 0)")
    if not dp.body_timeout_secs > 0:
        raise ConfigError("Invalid --dataplane-body-timeout-secs (expected > 0)")
    if cfg.request_timeout_secs <= 0:
        raise ConfigError("Invalid --request-timeout-secs (expected > 0)")


def advertise_url_problem(url: str) -> str | None:
    """``--advertise-url`` is ``http://HOST:PORT`` (or https): no credentials (it is journaled
    in ``gateway.peer``), no path, query or fragment."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a URL (expected http://HOST:PORT)"
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return "expected http://HOST:PORT (or https://)"
    if parts.username is not None or parts.password is not None:
        return "must not hold credentials (it is written to the journal)"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must not have a path, query or fragment"
    return None

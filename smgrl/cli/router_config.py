"""``RouterArgs`` -> smgrl's ``Config``: what every field does here (docs/psrl.md has the table).

Every field is in exactly one of three places (``tests/unit/test_router_args.py`` checks it):

- ``translate`` below: the field takes effect;
- ``INERT``: accepted with any value and changes nothing here, for the reason given (most are
  tunables of fork features whose switch is off, or of policies PSRL does not use);
- ``DEFAULT_ONLY``: its default needs nothing; any other value asks for behaviour smgrl cannot
  give, so the launch stops with one line naming the field.

Values the fork refuses at launch (``_validate_router_args``) are refused with its rule.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import tempfile

import attrs

from smgrl.cli.router_args import RouterArgs, RouterArgsError
from smgrl.core.auth import ControlPlaneKey
from smgrl.core.config import (
    SORT_KEYS,
    STRATEGIES,
    BreakerConfig,
    Config,
    DataPlaneConfig,
    HealthConfig,
    PsrlConfig,
    RetryConfig,
    RoutingLoopConfig,
    SessionsConfig,
)
from smgrl.core.errors import ConfigError
from smgrl.runtime.startup import validate
from smgrl.upstream import InvalidPsManagerAddress, parse_ps_manager_addr

# A request timeout this long or longer (PSRL passes 2**64 - 1) means none.
NO_TIMEOUT_FROM = 2**32
NO_TIMEOUT_SECS = 1e12  # ~31,700 years: finite, so every deadline sum stays a plain float
JOURNAL_DIR_ENV = "SMGRL_JOURNAL_DIR"
TOKENIZER_ENV = "SMGRL_TOKENIZER_PATH"

_THROUGHPUT = "used only by the throughput_optimal policies, which smgrl does not have"
_CACHE_V1 = "used only by cache_aware_v1's KV-event scoring; smgrl's cache_aware has no KV events"
_PD = "prefill/decode disaggregation only (pd_disaggregation is refused)"
_DISCOVERY = "Kubernetes service discovery only (service_discovery is refused)"
_HISTORY = "history backends only (history_backend other than memory is refused)"
_LOOP = "a tunable of the fork's routing loop ingress channel; smgrl's requests join the queue directly"

INERT = {
    "worker_startup_timeout_secs": "smgrl retries a registration probe with backoff, without a deadline",
    "worker_startup_check_interval": "as worker_startup_timeout_secs",
    "eviction_interval_secs": "smgrl's prefix tree evicts on insert past max_tree_size",
    "block_size": "smgrl's prefix tree matches whole characters or tokens, not KV pages",
    "gpu_overlap_weight": _CACHE_V1,
    "lmcache_overlap_weight": _CACHE_V1,
    "max_idle_secs": "the manual policy's key eviction; smgrl's manual is random with routing keys",
    "assignment_mode": "as max_idle_secs",
    "bucket_adjust_interval_secs": "the bucket policy (prefill only)",
    "cost_model_path": _THROUGHPUT,
    "delta_throughput_threshold": _THROUGHPUT,
    "max_prompt_length": _THROUGHPUT,
    "request_budget": _THROUGHPUT + " (a KV page size in tokens, not a count of requests)",
    "max_num_waiting_reqs_after_preemption": _THROUGHPUT,
    "prefill_policy": _PD,
    "decode_policy": _PD,
    "connection_mode": "smgrl picks each worker's transport from its URL (http://, grpc://)",
    "selector": _DISCOVERY,
    "service_discovery_port": _DISCOVERY,
    "service_discovery_namespace": _DISCOVERY,
    "prefill_selector": _DISCOVERY,
    "decode_selector": _DISCOVERY,
    "router_selector": _DISCOVERY,
    "bootstrap_port_annotation": _DISCOVERY,
    "model_id_from": _DISCOVERY,
    "routing_loop_receive_batch_size": _LOOP,
    "routing_loop_max_running_dispatch_tasks": "the fork's cap on its dispatch tasks; smgrl's "
    "requests dispatch in their own tasks, bounded by max_concurrent_requests",
    "psrl_enable_mig_strategy": "smgrl honours an instance hint only when the request opts in "
    "(x-is-sticky, x-force-pin-once) or loops back, whichever this is",
    "psrl_kv_transfer_mode": "KV transfer only (psrl_kv_transfer_enable is refused)",
    "psrl_kv_transfer_timeout_ms": "as psrl_kv_transfer_mode",
    "disable_tokenizer_autoload": "smgrl loads a tokenizer only from tokenizer_path / model_path",
    "tokenizer_cache_enable_l0": "a tokenizer cache: a speed knob",
    "tokenizer_cache_l0_max_entries": "as tokenizer_cache_enable_l0",
    "tokenizer_cache_enable_l1": "as tokenizer_cache_enable_l0",
    "tokenizer_cache_l1_max_memory": "as tokenizer_cache_enable_l0",
    "oracle_wallet_path": _HISTORY,
    "oracle_tns_alias": _HISTORY,
    "oracle_connect_descriptor": _HISTORY,
    "oracle_username": _HISTORY,
    "oracle_password": _HISTORY,
    "oracle_external_auth": _HISTORY,
    "oracle_pool_min": _HISTORY,
    "oracle_pool_max": _HISTORY,
    "oracle_pool_timeout_secs": _HISTORY,
    "postgres_db_url": _HISTORY,
    "postgres_pool_max": _HISTORY,
    "redis_url": _HISTORY,
    "redis_pool_max": _HISTORY,
    "redis_retention_days": _HISTORY,
    "schema_config": _HISTORY,
    "otlp_traces_endpoint": "tracing only (enable_trace is refused)",
    "control_plane_audit_enabled": "smgrl journals control-plane audit events by default",
    "mesh_server_name": "mesh only (enable_mesh is refused)",
    "mesh_host": "as mesh_server_name",
    "mesh_advertise_host": "as mesh_server_name",
    "mesh_port": "as mesh_server_name",
    "mesh_peer_urls": "as mesh_server_name",
}

DEFAULT_ONLY = {
    "pd_disaggregation": "smgrl has no prefill/decode disaggregation",
    "prefill_urls": "smgrl has no prefill/decode disaggregation",
    "decode_urls": "smgrl has no prefill/decode disaggregation",
    "dp_minimum_tokens_scheduler": "smgrl has no minimum-tokens DP scheduler",
    "enable_igw": "smgrl has no inter-gateway mode",
    "service_discovery": "smgrl has no Kubernetes service discovery",
    "prometheus_duration_buckets": "smgrl's histogram buckets are fixed",
    "request_id_headers": "smgrl reads the request id from x-request-id only",
    "storage_context_headers": "smgrl has no storage hooks",
    "rate_limit_tokens_per_second": "smgrl has no token-bucket rate limit",
    "psrl_kv_transfer_enable": "smgrl has no KV-cache transfer on migration",
    "cors_allowed_origins": "smgrl serves no CORS headers",
    "remove_unhealthy_workers": "smgrl keeps unhealthy workers listed (held out of routing)",
    "chat_template": "smgrl uses the tokenizer's own chat template",
    "reasoning_parser": "smgrl has no reasoning parsers",
    "mcp_config_path": "smgrl has no MCP client",
    "backend": "smgrl has no backend switch",
    "storage_hook_wasm_path": "smgrl has no WASM storage hooks",
    "history_backend": "smgrl keeps no response history",
    "client_cert_path": "smgrl has no mTLS to workers",
    "client_key_path": "smgrl has no mTLS to workers",
    "ca_cert_paths": "smgrl has no mTLS to workers",
    "server_cert_path": "smgrl serves plain HTTP (put a TLS proxy in front)",
    "server_key_path": "smgrl serves plain HTTP (put a TLS proxy in front)",
    "enable_trace": "smgrl exports no OpenTelemetry traces",
    "jwt_issuer": "smgrl has no JWT/OIDC authentication",
    "jwt_audience": "smgrl has no JWT/OIDC authentication",
    "jwt_jwks_uri": "smgrl has no JWT/OIDC authentication",
    "jwt_role_mapping": "smgrl has no JWT/OIDC authentication",
    "enable_mesh": "smgrl has no mesh (several hosts share a journal instead)",
}

# Policies: the fork's names smgrl serves as they are, and the one it maps to its nearest.
POLICY_NAMES = {
    "random": "random",
    "round_robin": "round_robin",
    "cache_aware": "cache_aware",
    "cache_aware_v1": "cache_aware",
    "power_of_two": "power_of_two",
    "manual": "manual",
    "request_num_balance": "request_num_balance",
}
TOOL_PARSERS = ("hermes", "qwen", "none")


@attrs.frozen
class Launch:
    config: Config
    psrl: PsrlConfig
    log_file: str | None  # where log lines go (log_dir); None: stderr
    journal_dir: str | None = None  # the default journal's directory, made at launch
    notes: tuple[str, ...] = ()  # one line each, written where the logs go when the gateway starts


def translate(args: RouterArgs, *, env: dict[str, str] | None = None, now=None) -> Launch:
    """The launch ``args`` describe, or RouterArgsError (one line naming the field)."""
    env = os.environ if env is None else env
    _refuse_non_defaults(args)
    _check_fork_rules(args)
    policy = POLICY_NAMES.get(args.policy)
    if policy is None:
        raise RouterArgsError(
            f"RouterArgs.policy={args.policy!r}: smgrl serves {', '.join(sorted(POLICY_NAMES))}"
        )
    if args.policy.startswith("cache_aware") and (
        args.balance_token_usage_threshold < 1.0 or args.overload_token_usage_threshold < 1.0
    ):
        name = "balance" if args.balance_token_usage_threshold < 1.0 else "overload"
        raise RouterArgsError(
            f"RouterArgs.{name}_token_usage_threshold below 1.0: smgrl's cache_aware has no KV-usage triggers"
        )
    # The fork connects to PSManager only with its routing loop on.
    psm = (args.psrl_ps_manager_addr or "").strip() or None
    if not args.enable_routing_loop:
        psm = None
    if psm is not None:
        try:
            parse_ps_manager_addr(psm)
        except InvalidPsManagerAddress as exc:
            raise RouterArgsError(f"RouterArgs.psrl_ps_manager_addr: {exc}") from None
    if args.psrl_candidate_sort_key == "reserve_capability" and (
        psm is None or args.worker_selection_strategy != "psrl"
    ):
        raise RouterArgsError(
            "RouterArgs.psrl_candidate_sort_key='reserve_capability' needs psrl_ps_manager_addr, "
            "enable_routing_loop and worker_selection_strategy='psrl'"
        )
    tool_parser = args.tool_call_parser or "hermes"
    if tool_parser not in TOOL_PARSERS:
        raise RouterArgsError(
            f"RouterArgs.tool_call_parser={tool_parser!r}: smgrl parses {', '.join(TOOL_PARSERS)}"
        )
    if args.trajectory_id_strategy not in ("auto", "manual"):
        raise RouterArgsError(
            f"RouterArgs.trajectory_id_strategy={args.trajectory_id_strategy!r}: expected 'auto' or 'manual'"
        )
    timeout = float(args.request_timeout_secs)
    if timeout >= NO_TIMEOUT_FROM:
        timeout = NO_TIMEOUT_SECS
    tokenizer = args.tokenizer_path or args.model_path or env.get(TOKENIZER_ENV) or None
    cfg = Config(
        host=args.host,
        port=int(args.port),
        worker_urls=tuple(args.worker_urls),
        api_key=args.api_key,
        policy=policy,
        health=HealthConfig(
            enabled=not args.disable_health_check,
            interval_secs=float(args.health_check_interval_secs),
            timeout_secs=float(args.health_check_timeout_secs),
            failure_threshold=int(args.health_failure_threshold),
            success_threshold=int(args.health_success_threshold),
            endpoint=args.health_check_endpoint,
        ),
        max_payload_size=int(args.max_payload_size),
        request_timeout_secs=timeout,
        disable_circuit_breaker=bool(args.disable_circuit_breaker),
        dp_aware=bool(args.dp_aware),
        dataplane=DataPlaneConfig(
            cache_threshold=float(args.cache_threshold),
            balance_abs_threshold=int(args.balance_abs_threshold),
            balance_rel_threshold=float(args.balance_rel_threshold),
            max_tree_size=int(args.max_tree_size),
            max_concurrent_requests=int(args.max_concurrent_requests),
            queue_size=int(args.queue_size),
            queue_timeout_secs=float(args.queue_timeout_secs),
            psrl_group_sticky=bool(args.psrl_enable_group_sticky),
            retry=RetryConfig(
                max_retries=int(args.retry_max_retries),
                initial_backoff_ms=int(args.retry_initial_backoff_ms),
                max_backoff_ms=int(args.retry_max_backoff_ms),
                backoff_multiplier=float(args.retry_backoff_multiplier),
                jitter_factor=float(args.retry_jitter_factor),
                enabled=not args.disable_retries,
            ),
            breaker=BreakerConfig(
                failure_threshold=int(args.cb_failure_threshold),
                success_threshold=int(args.cb_success_threshold),
                timeout_secs=float(args.cb_timeout_duration_secs),
                window_secs=float(args.cb_window_duration_secs),
            ),
        ),
        sessions=SessionsConfig(
            tokenizer_path=tokenizer if args.enable_tito else None,
            # As the fork: without a tokenizer, TITO takes the one the gRPC workers serve.
            from_engines=bool(args.enable_tito) and tokenizer is None,
            gc_threshold=int(args.tito_gc_threshold or 0),
            trajectory_strategy=args.trajectory_id_strategy,
            tool_parser=tool_parser,
            debug=bool(args.tito_debug),
        ),
        control_plane_keys=tuple(
            ControlPlaneKey(id=kid, name=name, role=role, key=key)
            for kid, name, key, role in args.control_plane_api_keys
        ),
        prometheus_host=args.prometheus_host,
        prometheus_port=args.prometheus_port,
        shutdown_grace_period_secs=float(args.shutdown_grace_period_secs),
        log_level=_log_level(args.log_level),
        log_json=bool(args.log_json),
        load_monitor_interval_secs=float(args.load_monitor_interval),
        journal=args.smgrl_journal or default_journal(args, env, now),
    )
    journal_dir = None if args.smgrl_journal else os.path.dirname(cfg.journal)
    psrl = PsrlConfig(
        strategy=args.worker_selection_strategy,
        candidate_sort_key=args.psrl_candidate_sort_key,
        ps_manager_addr=psm,
        recheck_secs=int(args.routing_loop_check_interval_ms) / 1000,
        reject_on_waiting=bool(args.enable_kv_admission_control),
        kv_capacity_threshold=float(args.kv_capacity_threshold),
    )
    loop = None
    if args.enable_routing_loop:
        if int(args.max_concurrent_seqs_per_instance) < 1:
            raise RouterArgsError(
                "RouterArgs.max_concurrent_seqs_per_instance must be >= 1 with enable_routing_loop "
                "(it caps the requests in flight per instance)"
            )
        loop = RoutingLoopConfig(
            check_interval_secs=int(args.routing_loop_check_interval_ms) / 1000,
            sort_key=args.routing_loop_request_sort_key,
            multi_priority=bool(args.routing_loop_multi_priority_queue),
            dispatch_batch_size=int(args.routing_loop_dispatch_batch_size),
            max_seqs_per_instance=int(args.max_concurrent_seqs_per_instance),
        )
    cfg = attrs.evolve(cfg, psrl=psrl, routing_loop=loop)
    log_file = os.path.join(args.log_dir, f"smgrl-gateway-{cfg.port}.log") if args.log_dir else None
    try:
        cfg = validate(cfg)
    except ConfigError as exc:
        raise RouterArgsError(str(exc)) from None
    return Launch(config=cfg, psrl=psrl, log_file=log_file, journal_dir=journal_dir)


def default_journal(args: RouterArgs, env, now=None) -> str:
    """A journal file of its own per launch: ``<dir>/gateway-<port>-<UTC time>-<pid>.db``, so
    gateways of one run (and of successive runs) never share one, and a new run does not replay
    the last run's fleet. ``<dir>``: ``smgrl_journal_dir``, else ``$SMGRL_JOURNAL_DIR``, else
    ``<temp dir>/smgrl-journals``; made if missing."""
    directory = (
        args.smgrl_journal_dir
        or env.get(JOURNAL_DIR_ENV)
        or os.path.join(tempfile.gettempdir(), "smgrl-journals")
    )
    stamp = (now or datetime.datetime.now(datetime.UTC)).strftime("%Y%m%dT%H%M%S")
    return os.path.join(directory, f"gateway-{int(args.port)}-{stamp}-{os.getpid()}.db")


def _refuse_non_defaults(args: RouterArgs) -> None:
    defaults = RouterArgs()
    for name, reason in DEFAULT_ONLY.items():
        value = getattr(args, name)
        if value != getattr(defaults, name) and not (value in (None, "") and not getattr(defaults, name)):
            shown = "(set)" if name in SECRET_FIELDS else repr(value)
            raise RouterArgsError(f"RouterArgs.{name}={shown}: {reason}")


SECRET_FIELDS = frozenset(
    {"api_key", "oracle_password", "postgres_db_url", "redis_url", "control_plane_api_keys", "smgrl_journal"}
)


def _check_fork_rules(args: RouterArgs) -> None:
    """The fork's own launch checks, with its rules."""
    if args.connection_mode not in (None, "http", "grpc"):
        raise RouterArgsError(
            f"RouterArgs.connection_mode={args.connection_mode!r}: must be 'http' or 'grpc'"
        )
    if args.routing_loop_request_sort_key not in ("short_length", "long_length", "small_id"):
        raise RouterArgsError(
            f"RouterArgs.routing_loop_request_sort_key={args.routing_loop_request_sort_key!r}: "
            "must be 'short_length', 'long_length' or 'small_id'"
        )
    for name in (
        "routing_loop_check_interval_ms",
        "routing_loop_receive_batch_size",
        "routing_loop_dispatch_batch_size",
        "routing_loop_max_running_dispatch_tasks",
    ):
        if int(getattr(args, name)) < 1:
            raise RouterArgsError(f"RouterArgs.{name} must be >= 1")
    if args.worker_selection_strategy not in STRATEGIES:
        raise RouterArgsError(
            f"RouterArgs.worker_selection_strategy={args.worker_selection_strategy!r}: must be 'naive' or 'psrl'"
        )
    if args.psrl_candidate_sort_key not in SORT_KEYS:
        raise RouterArgsError(
            f"RouterArgs.psrl_candidate_sort_key={args.psrl_candidate_sort_key!r}: "
            "must be 'version' or 'reserve_capability'"
        )


def _log_level(level: str | None) -> str:
    level = (level or "info").lower()
    level = {"warning": "warn", "trace": "debug", "critical": "error"}.get(level, level)
    if level not in ("debug", "info", "warn", "error"):
        raise RouterArgsError(f"RouterArgs.log_level={level!r}: expected debug, info, warn or error")
    return level


MAPPED = frozenset(
    f.name for f in dataclasses.fields(RouterArgs) if f.name not in INERT and f.name not in DEFAULT_ONLY
)

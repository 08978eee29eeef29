"""``RouterArgs``: the launch arguments of PSRL's SMG fork, as a value smgrl can launch from.

PSRL builds its gateway's arguments as an ``argparse.Namespace`` and turns it into the fork's
``RouterArgs`` with ``RouterArgs.from_cli_args`` (PSRL 19c0474
psrl/workers/gen/smg_adapter.py:47-153). This class has the same fields with the same defaults
(those of ``Somoku/smg`` psrl-dev 7169017b, ``bindings/python/src/smg/router_args.py``: a superset
of SMG 1.13.0's) plus the few PSRL sets that the fork's class has no field for, and smgrl's own
(``smgrl_*``). Which field does what in smgrl is ``smgrl.cli.router_config``; docs/psrl.md has the table.

``from_cli_args`` reads the namespace the way the fork does: for each field the ``router_``-
prefixed key when ``use_router_prefix`` and it is set, else the plain key unless it is ``None``
or ``""`` (a key the namespace lacks keeps the default); keys that name no field are ignored, as
the fork ignores them. Pure: no I/O.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import field
from typing import Any

from smgrl.core.errors import ConfigError


class RouterArgsError(ConfigError):
    """A value ``from_cli_args`` cannot parse, or one smgrl cannot honour (one line)."""


@dataclasses.dataclass
class RouterArgs:
    # Workers and listener.
    worker_urls: list[str] = field(default_factory=list)
    host: str = "0.0.0.0"
    port: int = 30000
    # Prefill/decode disaggregation.
    pd_disaggregation: bool = False
    prefill_urls: list[tuple] = field(default_factory=list)  # (url, bootstrap port or None)
    decode_urls: list[str] = field(default_factory=list)
    # Policy and its tunables.
    policy: str = "cache_aware"
    prefill_policy: str | None = None
    decode_policy: str | None = None
    worker_startup_timeout_secs: int = 1800
    worker_startup_check_interval: int = 30
    load_monitor_interval: int = 10
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    eviction_interval_secs: int = 60
    max_tree_size: int = 2**26
    block_size: int = 16
    gpu_overlap_weight: float = 1.0
    lmcache_overlap_weight: float = 0.5
    balance_token_usage_threshold: float = 1.0
    overload_token_usage_threshold: float = 1.0
    max_idle_secs: int = 4 * 3600
    assignment_mode: str = "random"
    max_payload_size: int = 512 * 1024 * 1024
    bucket_adjust_interval_secs: int = 5
    # The fork's throughput_optimal policies.
    cost_model_path: str | None = None
    max_concurrent_seqs_per_instance: int = 100
    delta_throughput_threshold: float = 0.5
    max_prompt_length: int = 8192
    request_budget: int = 1024
    max_num_waiting_reqs_after_preemption: int = 1000
    # Data parallelism, mode, connection.
    dp_aware: bool = False
    dp_minimum_tokens_scheduler: bool = False
    enable_igw: bool = False
    connection_mode: str | None = None
    api_key: str | None = field(default=None, repr=False)
    # Logging.
    log_dir: str | None = None
    log_level: str | None = None
    log_json: bool = False
    # Kubernetes service discovery.
    service_discovery: bool = False
    selector: dict[str, str] = field(default_factory=dict)
    service_discovery_port: int = 80
    service_discovery_namespace: str | None = None
    prefill_selector: dict[str, str] = field(default_factory=dict)
    decode_selector: dict[str, str] = field(default_factory=dict)
    router_selector: dict[str, str] = field(default_factory=dict)
    bootstrap_port_annotation: str = "sglang.ai/bootstrap-port"
    model_id_from: str | None = None
    # Metrics.
    prometheus_port: int | None = None
    prometheus_host: str | None = None
    prometheus_duration_buckets: list[float] | None = None
    # Requests.
    request_id_headers: list[str] | None = None
    storage_context_headers: dict[str, str] = field(default_factory=dict)
    request_timeout_secs: int = 1800
    shutdown_grace_period_secs: int = 180
    max_concurrent_requests: int = -1
    queue_size: int = 100
    queue_timeout_secs: int = 60
    rate_limit_tokens_per_second: int | None = None
    # The fork's routing loop.
    enable_routing_loop: bool = False
    routing_loop_check_interval_ms: int = 10
    routing_loop_request_sort_key: str = "short_length"
    routing_loop_multi_priority_queue: bool = False
    routing_loop_receive_batch_size: int = 1024
    routing_loop_dispatch_batch_size: int = 1024
    routing_loop_max_running_dispatch_tasks: int = 4096
    # PSRL's worker selection.
    worker_selection_strategy: str = "naive"
    psrl_ps_manager_addr: str = ""
    psrl_enable_mig_strategy: bool = False
    psrl_candidate_sort_key: str = "version"
    psrl_enable_group_sticky: bool = False
    psrl_kv_transfer_enable: bool = False
    psrl_kv_transfer_mode: str = "async"
    psrl_kv_transfer_timeout_ms: int = 30000
    # Token-in token-out sessions.
    enable_tito: bool = False
    tito_debug: bool = False
    tito_gc_threshold: int | None = None
    cors_allowed_origins: list[str] = field(default_factory=list)
    # Retries, health checks, circuit breaker.
    retry_max_retries: int = 5
    retry_initial_backoff_ms: int = 50
    retry_max_backoff_ms: int = 30_000
    retry_backoff_multiplier: float = 1.5
    retry_jitter_factor: float = 0.2
    disable_retries: bool = False
    health_failure_threshold: int = 3
    health_success_threshold: int = 2
    health_check_timeout_secs: int = 5
    health_check_interval_secs: int = 60
    health_check_endpoint: str = "/health"
    disable_health_check: bool = False
    remove_unhealthy_workers: bool = False
    cb_failure_threshold: int = 10
    cb_success_threshold: int = 3
    cb_timeout_duration_secs: int = 60
    cb_window_duration_secs: int = 120
    disable_circuit_breaker: bool = False
    # Tokenizer and parsers.
    model_path: str | None = None
    tokenizer_path: str | None = None
    chat_template: str | None = None
    disable_tokenizer_autoload: bool = False
    tokenizer_cache_enable_l0: bool = False
    tokenizer_cache_l0_max_entries: int = 10000
    tokenizer_cache_enable_l1: bool = False
    tokenizer_cache_l1_max_memory: int = 50 * 1024 * 1024
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    mcp_config_path: str | None = None
    # Backend and history storage.
    backend: str = "sglang"
    storage_hook_wasm_path: str | None = None
    history_backend: str = "memory"
    oracle_wallet_path: str | None = None
    oracle_tns_alias: str | None = None
    oracle_connect_descriptor: str | None = None
    oracle_username: str | None = None
    oracle_password: str | None = field(default=None, repr=False)
    oracle_external_auth: bool = False
    oracle_pool_min: int = 1
    oracle_pool_max: int = 16
    oracle_pool_timeout_secs: int = 30
    postgres_db_url: str | None = field(default=None, repr=False)
    postgres_pool_max: int = 16
    redis_url: str | None = field(default=None, repr=False)
    redis_pool_max: int = 16
    redis_retention_days: int = 30
    schema_config: str | None = None
    # TLS.
    client_cert_path: str | None = None
    client_key_path: str | None = None
    ca_cert_paths: list[str] = field(default_factory=list)
    server_cert_path: str | None = None
    server_key_path: str | None = None
    # Tracing.
    enable_trace: bool = False
    otlp_traces_endpoint: str = "localhost:4317"
    # Control-plane authentication: (id, name, key, role) tuples.
    control_plane_api_keys: list[tuple] = field(default_factory=list, repr=False)
    control_plane_audit_enabled: bool = False
    jwt_issuer: str | None = None
    jwt_audience: str | None = None
    jwt_jwks_uri: str | None = None
    jwt_role_mapping: dict[str, str] = field(default_factory=dict)
    # Mesh.
    enable_mesh: bool = False
    mesh_server_name: str | None = None
    mesh_host: str = "0.0.0.0"
    mesh_advertise_host: str | None = None
    mesh_port: int = 39527
    mesh_peer_urls: list[str] = field(default_factory=list)
    # PSRL sets these; the fork's class has no field for them (its from_cli_args drops them).
    trajectory_id_strategy: str = "auto"
    enable_kv_admission_control: bool = False  # PSRL: admit only to instances with no waiting requests
    kv_capacity_threshold: float = 1.0  # admit only below this KV usage; >= 1.0 disables
    # smgrl's own: the journal (a file, a postgresql:// URL or ":memory:"; None: a per-launch
    # file under the journal directory, docs/psrl.md) and that directory (None: the default).
    smgrl_journal: str | None = field(default=None, repr=False)
    smgrl_journal_dir: str | None = None

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace, use_router_prefix: bool = False) -> RouterArgs:
        given = vars(args)
        prefix = "router_" if use_router_prefix else ""
        no_fallback = bool(given.get(f"{prefix}disable_arg_fallback", False))
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            own = given.get(prefix + f.name)
            if own is not None:
                values[f.name] = own
            elif not no_fallback and given.get(f.name) not in (None, ""):
                values[f.name] = given[f.name]
        for cli_name, name in (("tls_cert_path", "server_cert_path"), ("tls_key_path", "server_key_path")):
            if prefix + cli_name in given:
                values[name] = given[prefix + cli_name]
        # The argparse shapes of these flags become the field values (as the fork parses them).
        values["prefill_urls"] = _prefill(given.get(prefix + "prefill"))
        values["decode_urls"] = [item[0] for item in given.get(prefix + "decode") or ()]
        for name in (
            "selector",
            "prefill_selector",
            "decode_selector",
            "router_selector",
            "storage_context_headers",
        ):
            values[name] = _pairs(given.get(prefix + name))
        values["bootstrap_port_annotation"] = "sglang.ai/bootstrap-port"
        values["control_plane_api_keys"] = _api_keys(given.get(prefix + "control_plane_api_keys"))
        values["jwt_role_mapping"] = _role_mapping(given.get(prefix + "jwt_role_mapping"))
        return cls(**values)


def _prefill(items) -> list[tuple]:
    out = []
    for item in items or ():
        port = item[1] if len(item) > 1 else None
        if isinstance(port, str):
            if port.lower() == "none":
                port = None
            else:
                try:
                    port = int(port)
                except ValueError:
                    raise RouterArgsError(f"invalid bootstrap port {port!r} (a number or 'none')") from None
        out.append((item[0], port))
    return out


def _pairs(items) -> dict[str, str]:
    if not items:
        return {}
    if isinstance(items, dict):
        return dict(items)
    if len(items) == 1 and " " in items[0]:
        items = items[0].split(" ")
    return dict(item.split("=", 1) for item in items if "=" in item)


def _api_keys(items) -> list[tuple]:
    out = []
    for text in items or ():
        if isinstance(text, tuple):
            out.append(text)
            continue
        parts = text.split(":", 3)
        if len(parts) != 4 or parts[2].lower() not in ("admin", "user"):
            # The entry holds a key: never echoed.
            raise RouterArgsError(
                "invalid control_plane_api_keys entry (expected 'id:name:role:key', role admin or user)"
            )
        kid, name, role, key = parts
        out.append((kid, name, key, role.lower()))
    return out


def _role_mapping(items) -> dict[str, str]:
    if isinstance(items, dict):
        return dict(items)
    out = {}
    for text in items or ():
        idp, sep, role = text.partition("=")
        if not sep or role.lower() not in ("admin", "user"):
            raise RouterArgsError(f"invalid jwt_role_mapping entry {text!r} (expected 'idp_role=admin|user')")
        out[idp] = role.lower()
    return out

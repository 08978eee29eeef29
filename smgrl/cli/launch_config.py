"""``smgrl launch``'s options as a ``Config`` (checked by ``smgrl.runtime.startup.validate``: a bad
value is one line, exit 1)."""

from __future__ import annotations

from smgrl.core.auth import ControlPlaneKey, TenantKey
from smgrl.core.config import (
    BreakerConfig,
    Config,
    DataPlaneConfig,
    HealthConfig,
    PsrlConfig,
    RetryConfig,
    RlConfig,
    SessionsConfig,
)
from smgrl.core.errors import ConfigError
from smgrl.runtime.startup import validate


def config_from_options(o: dict) -> Config:
    cfg = Config(
        host=o["host"],
        port=o["port"],
        worker_urls=tuple(o["worker_urls"]),
        api_key=o["api_key"],
        policy=o["policy"],
        rl=RlConfig(
            enabled=o["enable_rl"],
            control_timeout_secs=o["rl_control_timeout_secs"],
            fanout_concurrency=o["rl_fanout_concurrency"],
            version_policy=o["rl_version_policy"],
        ),
        health=HealthConfig(
            enabled=not o["disable_health_check"],
            interval_secs=o["health_check_interval_secs"],
            timeout_secs=o["health_check_timeout_secs"],
            failure_threshold=o["health_failure_threshold"],
            success_threshold=o["health_success_threshold"],
            endpoint=o["health_check_endpoint"],
        ),
        max_payload_size=o["max_payload_size"],
        max_concurrent_large_bodies=o["max_concurrent_large_bodies"],
        request_timeout_secs=o["request_timeout_secs"],
        max_event_streams=o["max_event_streams"],
        disable_circuit_breaker=o["disable_circuit_breaker"],
        dp_aware=o["dp_aware"],
        dataplane=dataplane_config(o),
        sessions=SessionsConfig(
            tokenizer_path=o["tokenizer_path"],
            max_sessions=o["max_sessions"],
            gc_threshold=o["session_gc_threshold"],
            trajectory_strategy=o["session_trajectory_strategy"],
            tool_parser=o["session_tool_parser"],
            debug=o["session_debug"],
            idle_timeout_secs=o["session_idle_timeout_secs"],
            max_stored_tokens=o["session_max_stored_tokens"],
        ),
        control_plane_keys=tuple(ControlPlaneKey.parse(k) for k in o["control_plane_api_keys"]),
        tenant_keys=tuple(TenantKey.parse(k) for k in o["tenant_api_key"]),
        prometheus_host=o["prometheus_host"],
        prometheus_port=o["prometheus_port"],
        shutdown_grace_period_secs=o["shutdown_grace_period_secs"],
        header_read_timeout_secs=o["header_read_timeout_secs"],
        idle_connection_timeout_secs=o["idle_connection_timeout_secs"],
        log_level=o["log_level"],
        log_json=o["log_json"],
        disable_load_monitoring=o["disable_load_monitoring"],
        load_monitor_interval_secs=o["load_monitor_interval"],
        disable_worker_overload_protection=o["disable_worker_overload_protection"],
        journal=o["journal_path"],
        journal_lock_wait_secs=o["journal_lock_wait_secs"],
        audit=not o["disable_audit_logging"],
        audit_interval_secs=o["audit_interval_secs"],
        advertise_url=o.get("advertise_url"),
        forward_port=o.get("forward_port", 0),
        worker_metrics_port=o.get("worker_metrics_port", 0),
        psrl=psrl_config(o),
    )
    cfg = validate(cfg)
    if cfg.sessions.tokenizer_path:
        from smgrl.sessions import load_tokenizer

        load_tokenizer(cfg.sessions.tokenizer_path)  # a bad model directory: one line, exit 1
    return cfg


def psrl_config(o: dict) -> PsrlConfig | None:
    """PSManager admission (``--psrl-ps-manager-addr``); None without it."""
    addr = o.get("psrl_ps_manager_addr")
    if not addr:
        if o.get("psrl_candidate_sort_key", "version") != "version":
            raise ConfigError("--psrl-candidate-sort-key reserve_capability needs --psrl-ps-manager-addr")
        return None
    from smgrl.upstream import InvalidPsManagerAddress, parse_ps_manager_addr

    try:
        parse_ps_manager_addr(addr)
    except InvalidPsManagerAddress as exc:
        raise ConfigError(f"--psrl-ps-manager-addr: {exc}") from None
    return PsrlConfig(
        ps_manager_addr=addr,
        candidate_sort_key=o["psrl_candidate_sort_key"],
        recheck_secs=o["psrl_check_interval_ms"] / 1000,
    )


def dataplane_config(o: dict) -> DataPlaneConfig:
    return DataPlaneConfig(
        cache_threshold=o["cache_threshold"],
        balance_abs_threshold=o["balance_abs_threshold"],
        balance_rel_threshold=o["balance_rel_threshold"],
        max_tree_size=o["max_tree_size"],
        eligible_wait_secs=o["eligible_wait_secs"],
        admission_hook=o["admission_hook"],
        max_loopbacks=o["max_loopbacks"],
        psrl_group_sticky=o["psrl_group_sticky"],
        max_body_size=o["dataplane_max_body_size"],
        memory_budget=o["dataplane_memory_budget"],
        body_timeout_secs=o["dataplane_body_timeout_secs"],
        stall_timeout_secs=o["stream_body_stall_timeout_secs"],
        max_concurrent_requests=o["max_concurrent_requests"],
        queue_size=o["queue_size"],
        queue_timeout_secs=o["queue_timeout_secs"],
        retry=RetryConfig(
            max_retries=o["retry_max_retries"],
            initial_backoff_ms=o["retry_initial_backoff_ms"],
            max_backoff_ms=o["retry_max_backoff_ms"],
            backoff_multiplier=o["retry_backoff_multiplier"],
            jitter_factor=o["retry_jitter_factor"],
            enabled=not o["disable_retries"],
        ),
        breaker=BreakerConfig(
            failure_threshold=o["cb_failure_threshold"],
            success_threshold=o["cb_success_threshold"],
            timeout_secs=o["cb_timeout_duration_secs"],
            window_secs=o["cb_window_duration_secs"],
        ),
    )

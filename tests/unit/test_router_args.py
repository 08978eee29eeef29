"""``RouterArgs`` -> smgrl's configuration: every field classified once, PSRL's namespaces accepted
and mapped, a value smgrl cannot honour refused in one line naming the field."""

from __future__ import annotations

import argparse
import dataclasses
import datetime

import pytest

from smgrl.cli.router_config import DEFAULT_ONLY, INERT, MAPPED, NO_TIMEOUT_SECS, default_journal
from smgrl.launch_router import RouterArgs, RouterArgsError, plan
from tests.e2e.test_launch_router import reward_namespace, rollout_namespace


def test_every_field_has_exactly_one_meaning():
    names = {f.name for f in dataclasses.fields(RouterArgs)}
    assert not set(INERT) & set(DEFAULT_ONLY)
    assert set(INERT) <= names and set(DEFAULT_ONLY) <= names
    assert MAPPED == names - set(INERT) - set(DEFAULT_ONLY)


def test_defaults_launch_quietly():
    launch = plan(RouterArgs())
    assert (launch.config.host, launch.config.port, launch.config.policy) == ("0.0.0.0", 30000, "cache_aware")
    assert launch.config.prometheus_port is None


TOKENIZER = {"SMGRL_TOKENIZER_PATH": "/m"}  # PSRL's rollout gateway enables TITO: it needs one


def test_psrl_rollout_namespace_maps_as_psrl_means_it():
    launch = plan(rollout_namespace("127.0.0.1", 8100, "10.0.0.1:50051", "/logs"), env=TOKENIZER)
    cfg, psrl = launch.config, launch.psrl
    assert cfg.policy == "request_num_balance"
    assert cfg.dp_aware and not cfg.health.enabled and not cfg.dataplane.retry.enabled
    assert cfg.prometheus_port is None
    assert cfg.request_timeout_secs == NO_TIMEOUT_SECS  # 2**64 - 1: no timeout, no overflow
    assert cfg.log_level == "warn"
    assert cfg.sessions.trajectory_strategy == "manual"
    assert (psrl.strategy, psrl.ps_manager_addr) == ("psrl", "10.0.0.1:50051")
    assert cfg.dataplane.psrl_group_sticky
    assert psrl.recheck_secs == 0.01
    assert launch.log_file == "/logs/smgrl-gateway-8100.log"
    assert cfg.sessions.tokenizer_path == "/m" and not launch.notes
    # The routing loop: PSRL's sort key, batch and interval, and its per-instance cap.
    loop = cfg.routing_loop
    assert (loop.sort_key, loop.multi_priority, loop.dispatch_batch_size) == ("short_length", False, 1)
    assert (loop.check_interval_secs, loop.max_seqs_per_instance) == (0.01, 1024)
    assert plan(reward_namespace("127.0.0.1", 8300, None, None)).config.routing_loop is None


def test_tito_without_a_tokenizer_takes_the_one_the_grpc_workers_serve():
    # PSRL's rollout namespace names no tokenizer: as the fork, sessions take the workers' one.
    ns = rollout_namespace("127.0.0.1", 8100, "x:1", None)
    sessions = plan(ns, env={}).config.sessions
    assert (sessions.tokenizer_path, sessions.from_engines) == (None, True)
    ns.model_path = "/models/qwen"  # or tokenizer_path, or $SMGRL_TOKENIZER_PATH: that one serves
    sessions = plan(ns, env={}).config.sessions
    assert (sessions.tokenizer_path, sessions.from_engines) == ("/models/qwen", False)
    ns.enable_tito = False
    ns.model_path = None
    sessions = plan(ns, env={}).config.sessions
    assert (sessions.tokenizer_path, sessions.from_engines) == (None, False)  # no TITO: no sessions


def test_max_concurrent_seqs_below_one_stops_a_routing_loop_launch():
    ns = rollout_namespace("127.0.0.1", 8100, "x:1", None)
    ns.max_concurrent_seqs_per_instance = 0
    with pytest.raises(RouterArgsError, match="RouterArgs.max_concurrent_seqs_per_instance"):
        plan(ns, env=TOKENIZER)


def test_psrl_reward_namespace_keeps_its_metrics_port_and_no_ps_manager():
    launch = plan(reward_namespace("127.0.0.1", 8300, 4100, None))
    assert (launch.config.policy, launch.config.prometheus_port) == ("round_robin", 4100)
    assert launch.psrl.ps_manager_addr is None and not launch.config.dataplane.psrl_group_sticky
    assert launch.log_file is None


def test_prefixed_keys_win_and_fall_back_to_plain_ones():
    ns = argparse.Namespace(router_policy="random", policy="round_robin", router_port=None, port=9000)
    args = RouterArgs.from_cli_args(ns, use_router_prefix=True)
    assert (args.policy, args.port) == ("random", 9000)
    ns.router_disable_arg_fallback = True
    assert RouterArgs.from_cli_args(ns, use_router_prefix=True).port == 30000
    # An empty plain value keeps the default, as the fork reads it.
    assert RouterArgs.from_cli_args(argparse.Namespace(psrl_ps_manager_addr="")).psrl_ps_manager_addr == ""


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("pd_disaggregation", True),
        ("enable_igw", True),
        ("psrl_kv_transfer_enable", True),
        ("policy", "throughput_optimal"),
        ("routing_loop_request_sort_key", "longest"),
        ("worker_selection_strategy", "fancy"),
        ("routing_loop_dispatch_batch_size", 0),
        ("connection_mode", "carrier-pigeon"),
    ],
)
def test_a_value_smgrl_cannot_honour_is_one_line_naming_the_field(field, value):
    ns = rollout_namespace("127.0.0.1", 8100, "x:1", None)
    setattr(ns, field, value)
    with pytest.raises(RouterArgsError) as info:
        plan(ns, env=TOKENIZER)
    message = str(info.value)
    assert f"RouterArgs.{field}" in message and "\n" not in message


def test_kv_usage_triggers_refused_only_where_they_would_act():
    ns = rollout_namespace("127.0.0.1", 8100, "x:1", None)
    ns.balance_token_usage_threshold = 0.5
    plan(ns, env=TOKENIZER)  # request_num_balance: the fork's cache_aware triggers do nothing
    ns.policy = "cache_aware"
    with pytest.raises(RouterArgsError, match="RouterArgs.balance_token_usage_threshold"):
        plan(ns, env=TOKENIZER)


def test_reserve_capability_needs_a_ps_manager():
    ns = reward_namespace("127.0.0.1", 8300, None, None)
    ns.psrl_candidate_sort_key = "reserve_capability"
    with pytest.raises(RouterArgsError, match="psrl_candidate_sort_key"):
        plan(ns)


def test_secrets_are_not_echoed():
    ns = reward_namespace("127.0.0.1", 8300, None, None)
    ns.control_plane_api_keys = ["id:name:boss:s3cret"]
    with pytest.raises(RouterArgsError) as info:
        RouterArgs.from_cli_args(ns)
    assert "s3cret" not in str(info.value)


def test_the_default_journal_is_per_port_and_per_launch():
    args = RouterArgs(port=8100)
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    path = default_journal(args, {"SMGRL_JOURNAL_DIR": "/j"}, when)
    assert path.startswith("/j/gateway-8100-20260102T030405-") and path.endswith(".db")
    assert default_journal(RouterArgs(port=8300), {"SMGRL_JOURNAL_DIR": "/j"}, when) != path
    named = plan(RouterArgs(port=8100, smgrl_journal=":memory:"))
    assert named.config.journal == ":memory:" and named.journal_dir is None


def test_smgrl_launch_flags_set_the_same_ps_manager_settings():
    from smgrl.cli.launch_config import psrl_config
    from smgrl.core.errors import ConfigError

    opts = {"psrl_ps_manager_addr": None, "psrl_candidate_sort_key": "version", "psrl_check_interval_ms": 10}
    assert psrl_config(opts) is None
    opts["psrl_ps_manager_addr"] = "grpc://10.0.0.1:50051"
    cfg = psrl_config(opts)
    assert (cfg.ps_manager_addr, cfg.candidate_sort_key, cfg.recheck_secs) == (
        "grpc://10.0.0.1:50051",
        "version",
        0.01,
    )
    with pytest.raises(ConfigError, match="--psrl-ps-manager-addr"):
        psrl_config({**opts, "psrl_ps_manager_addr": "https://h:1"})
    with pytest.raises(ConfigError, match="needs --psrl-ps-manager-addr"):
        psrl_config({**opts, "psrl_ps_manager_addr": None, "psrl_candidate_sort_key": "reserve_capability"})

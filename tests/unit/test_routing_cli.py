"""The data-plane flags of `smgrl launch` reach the configuration."""

from __future__ import annotations

import click

from smgrl.cli.launch_config import config_from_options
from smgrl.cli.main import cli


def parse(*argv: str):
    command = cli.commands["launch"]
    ctx = command.make_context("launch", list(argv), resilient_parsing=False)
    return config_from_options(ctx.params)


def test_defaults_are_smgs():
    cfg = parse()
    dp = cfg.dataplane
    assert (cfg.policy, dp.cache_threshold, dp.balance_abs_threshold, dp.balance_rel_threshold) == (
        "cache_aware",
        0.3,
        64,
        1.5,
    )
    assert dp.max_tree_size == 67_108_864


def test_routing_flags():
    cfg = parse(
        "--policy", "power_of_two", "--cache-match-threshold", "0.5", "--balance-abs-threshold", "8",
        "--balance-rel-threshold", "2", "--max-tree-size", "1000", "--dp-aware",
    )  # fmt: skip
    dp = cfg.dataplane
    assert cfg.policy == "power_of_two" and cfg.dp_aware
    assert (dp.cache_threshold, dp.balance_abs_threshold, dp.balance_rel_threshold, dp.max_tree_size) == (
        0.5,
        8,
        2.0,
        1000,
    )


def test_out_of_range_values_are_refused():
    for argv in (["--cache-threshold", "1.5"], ["--balance-rel-threshold", "0.5"], ["--max-tree-size", "0"]):
        try:
            parse(*argv)
        except click.BadParameter:
            continue
        raise AssertionError(f"{argv} was accepted")

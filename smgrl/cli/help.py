"""Help as people read it: ``smgrl launch --help`` in groups, and every command's help at 80
columns.

click has no option groups, so ``GroupedHelpCommand`` prints a command's options under the
headings of ``LAUNCH_GROUPS`` (the one place that maps a flag to its group), in the order of
``GROUP_ORDER``, as SMG's own ``smg launch --help`` groups its flags. Options without an entry
land under "Other options", and ``tests/unit/test_cli_help.py`` fails on them: **every new
``smgrl launch`` flag needs an entry in LAUNCH_GROUPS and a ``help=`` text** (the test also
checks that every option of every command has help and that no help line passes 80 columns).

Pure formatting: nothing here reads the environment except the terminal width click asks for.
"""

from __future__ import annotations

import click

WIDTH = 80  # the widest a help line may be, whatever the terminal (CONTEXT below)
CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": WIDTH}

GROUP_ORDER = (
    "Gateway",
    "Engines",
    "RL control plane",
    "Journal",
    "Auth and audit",
    "Routing (data plane)",
    "PSRL rollouts",
    "Request limits (data plane)",
    "Retries and circuit breakers (data plane)",
    "Agent sessions (TITO)",
    "Metrics and logs",
    "Other options",
)

# flag -> group. A flag missing here is listed under "Other options" and fails the help test.
LAUNCH_GROUPS: dict[str, str] = {
    **dict.fromkeys(
        (
            "--host",
            "--port",
            "--workers",
            "--advertise-url",
            "--forward-port",
            "--worker-metrics-port",
            "--max-payload-size",
            "--request-timeout-secs",
            "--max-concurrent-large-bodies",
            "--max-event-streams",
            "--header-read-timeout-secs",
            "--idle-connection-timeout-secs",
            "--shutdown-grace-period-secs",
        ),
        "Gateway",
    ),
    **dict.fromkeys(
        (
            "--worker-urls",
            "--api-key",
            "--dp-aware",
            "--disable-health-check",
            "--health-check-interval-secs",
            "--health-check-timeout-secs",
            "--health-failure-threshold",
            "--health-success-threshold",
            "--health-check-endpoint",
            "--disable-load-monitoring",
            "--load-monitor-interval",
            "--disable-worker-overload-protection",
        ),
        "Engines",
    ),
    **dict.fromkeys(
        ("--enable-rl", "--rl-control-timeout-secs", "--rl-fanout-concurrency", "--rl-version-policy"),
        "RL control plane",
    ),
    **dict.fromkeys(("--journal", "--journal-lock-wait-secs"), "Journal"),
    **dict.fromkeys(
        (
            "--control-plane-api-keys",
            "--tenant-api-key",
            "--control-plane-audit-enabled",
            "--disable-audit-logging",
            "--audit-interval-secs",
        ),
        "Auth and audit",
    ),
    **dict.fromkeys(
        (
            "--policy",
            "--cache-threshold",
            "--balance-abs-threshold",
            "--balance-rel-threshold",
            "--max-tree-size",
            "--eligible-wait-secs",
        ),
        "Routing (data plane)",
    ),
    **dict.fromkeys(
        (
            "--max-loopbacks",
            "--admission-hook",
            "--psrl-group-sticky",
            "--psrl-candidate-sort-key",
            "--psrl-check-interval-ms",
            "--psrl-ps-manager-addr",
        ),
        "PSRL rollouts",
    ),
    **dict.fromkeys(
        (
            "--dataplane-max-body-size",
            "--dataplane-memory-budget",
            "--dataplane-body-timeout-secs",
            "--stream-body-stall-timeout-secs",
            "--max-concurrent-requests",
            "--queue-size",
            "--queue-timeout-secs",
        ),
        "Request limits (data plane)",
    ),
    **dict.fromkeys(
        (
            "--retry-max-retries",
            "--retry-initial-backoff-ms",
            "--retry-max-backoff-ms",
            "--retry-backoff-multiplier",
            "--retry-jitter-factor",
            "--disable-retries",
            "--cb-failure-threshold",
            "--cb-success-threshold",
            "--cb-timeout-duration-secs",
            "--cb-window-duration-secs",
            "--disable-circuit-breaker",
        ),
        "Retries and circuit breakers (data plane)",
    ),
    **dict.fromkeys(
        (
            "--tokenizer-path",
            "--max-sessions",
            "--session-gc-threshold",
            "--session-trajectory-strategy",
            "--session-tool-parser",
            "--session-debug",
            "--session-idle-timeout-secs",
            "--session-max-stored-tokens",
        ),
        "Agent sessions (TITO)",
    ),
    **dict.fromkeys(
        ("--prometheus-host", "--prometheus-port", "--log-level", "--log-json"), "Metrics and logs"
    ),
}


def group_of(param: click.Parameter, groups: dict[str, str]) -> str:
    """The heading an option is listed under (its first long flag decides)."""
    for opt in param.opts:
        if opt in groups:
            return groups[opt]
    return "Other options"


class GroupedHelpCommand(click.Command):
    """A command whose ``--help`` lists its options under the headings of ``groups``."""

    groups: dict[str, str] = LAUNCH_GROUPS

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                sections.setdefault(group_of(param, self.groups), []).append(record)
        for title in GROUP_ORDER:
            if title in sections:
                with formatter.section(title):
                    formatter.write_dl(sections[title])

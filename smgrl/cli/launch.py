"""``smgrl launch``: its flags (SMG's, with SMG's meaning: ``smg launch --help``), including its
argparse habit of several values after one flag (``--worker-urls URL URL ...``). The options
become a ``Config`` in ``smgrl.cli.launch_config``; the process runs in ``smgrl.cli.gateway``.
"""

from __future__ import annotations

import sys

import click

from smgrl.cli.gateway import run_gateway
from smgrl.cli.help import CONTEXT, GroupedHelpCommand
from smgrl.cli.launch_config import config_from_options
from smgrl.core.config import DEFAULT_JOURNAL
from smgrl.routing import POLICIES

# Flags that take several values after one occurrence, argparse-style (nargs="*"/"+").
MULTI_VALUE = ("--worker-urls", "--control-plane-api-keys", "--tenant-api-key")


def expand_multi_value(args: list[str]) -> list[str]:
    """``--worker-urls a b --port 1`` -> ``--worker-urls a --worker-urls b --port 1``."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        name, eq, value = arg.partition("=")
        if name in MULTI_VALUE:
            if eq:
                out += [name, value]
                i += 1
                continue
            i += 1
            while i < len(args) and not args[i].startswith("--"):
                out += [name, args[i]]
                i += 1
            continue
        out.append(arg)
        i += 1
    return out


class _MultiValueCommand(GroupedHelpCommand):
    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, expand_multi_value(list(args)))


# The command's own context settings too (not only the group's): click keeps a command's help
# option once made, so `launch` run on its own (a test, PSRL's launch) must not fix it at --help.
@click.command(cls=_MultiValueCommand, context_settings=CONTEXT)
@click.option(
    "--host", default="127.0.0.1", show_default=True, help="Address to bind (SMG's default is 0.0.0.0)."
)
@click.option("--port", default=30000, show_default=True, type=int, help="HTTP port (0: any free port).")
@click.option(
    "--worker-urls", multiple=True, help="Engine URLs to register at startup (several after one flag)."
)
@click.option(
    "--api-key", default=None, help="The worker API key: sent as bearer to engines from --worker-urls."
)
@click.option(
    "--policy",
    default="cache_aware",
    show_default=True,
    type=click.Choice(list(POLICIES)),
    metavar="POLICY",
    help="Data-plane load balancing: " + ", ".join(POLICIES) + " (docs/data-plane.md).",
)
@click.option(
    "--cache-threshold",
    "--cache-match-threshold",
    "cache_threshold",
    default=0.3,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="cache_aware: matched-prefix share above which a request stays with the instance that has it.",
)
# Flag declarations like their neighbours': each flag's own type, default and help.
@click.option(
    "--balance-abs-threshold",
    default=64,
    show_default=True,
    type=click.IntRange(min=0),
    help="cache_aware: in-flight spread (max - min) beyond which the least-loaded instance wins.",
)
@click.option(
    "--balance-rel-threshold",
    default=1.5,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="cache_aware: ... and max > this x min.",
)
# Flags are declarations of one shape (`duplicates` pairs them): each is its own flag, nothing to share.
@click.option(
    "--max-tree-size",
    default=67_108_864,
    show_default=True,
    type=click.IntRange(min=1),
    help="cache_aware: prefix-tree size per model (characters or tokens); LRU eviction beyond it.",
)
@click.option("--enable-rl", is_flag=True, help="Mount the RL control plane under /v1/rl.")
@click.option(
    "--rl-control-timeout-secs",
    default=600,
    show_default=True,
    type=int,
    help="Deadline of one engine control call (>= 1 with --enable-rl).",
)
@click.option(
    "--rl-fanout-concurrency",
    default=32,
    show_default=True,
    type=int,
    help="Engine calls in flight in one fan-out (>= 1 with --enable-rl).",
)
@click.option(
    "--rl-version-policy",
    default="any",
    show_default=True,
    help="Which engine versions rollouts may use: any | latest-only | min-version:V | max-staleness:K "
    "(needs --enable-rl; per request: x-smg-version-policy).",
)
@click.option(
    "--max-payload-size",
    default=536_870_912,
    show_default=True,
    type=int,
    help="Largest request body in bytes; larger gets 413.",
)
@click.option(
    "--request-timeout-secs",
    default=1800.0,
    show_default=True,
    type=float,
    help="Data plane: the whole request (waiting, engine call, relay) and its body's arrival.",
)
@click.option(
    "--max-event-streams",
    default=64,
    show_default=True,
    type=click.IntRange(min=1),
    help="Server-sent event streams (journal stream, refit events) open at once; more get 429 "
    "too_many_streams.",
)
@click.option(
    "--max-concurrent-large-bodies",
    default=4,
    show_default=True,
    type=click.IntRange(min=1),
    help="Control-plane requests with a body over 1 MiB (tensor refits) served at once; more wait.",
)
@click.option(
    "--dataplane-max-body-size",
    default=67_108_864,
    show_default=True,
    type=click.IntRange(min=1),
    help="Largest rollout request body in bytes (also capped by --max-payload-size); larger gets 413.",
)
@click.option(
    "--dataplane-memory-budget",
    default=1_073_741_824,
    show_default=True,
    type=click.IntRange(min=1),
    help="Bytes of rollout request bodies and buffered answers held at once; beyond it a retryable "
    "503 memory_budget_exceeded (before a declared body is read).",
)
@click.option(
    "--dataplane-body-timeout-secs",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0.0, min_open=True),
    help="Seconds a rollout or session request body may take to arrive; after it a 408 "
    "request_body_stalled (its bytes of the memory budget are released).",
)
@click.option(
    "--stream-body-stall-timeout-secs",
    default=300.0,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="As SMG: no rollout or session request body bytes for this many seconds is a 408 "
    "request_body_stalled; 0 disables.",
)
@click.option(
    "--admission-hook",
    default=None,
    metavar="MODULE:OBJECT",
    help="A Python object with async reserve(instance, request) and release(reservation): the "
    "framework's per-instance capacity logic (refused instances are skipped; default: admit all).",
)
@click.option(
    "--psrl-group-sticky/--no-psrl-group-sticky",
    default=False,
    show_default=True,
    help="PSRL's psrl_enable_group_sticky: the requests of one prompt group (x-prompt-id) go to "
    "the instance its first request took while the group runs; off: the policy spreads them.",
)
@click.option(
    "--psrl-ps-manager-addr",
    default=None,
    metavar="HOST:PORT",
    help="PSRL's PSManager (gRPC): asked before each selection of a request with PSRL routing "
    "metadata, as PSRL's fork asks it (docs/psrl.md, PSManager admission).",
)
@click.option(
    "--psrl-candidate-sort-key",
    type=click.Choice(["version", "reserve_capability"]),
    default="version",
    show_default=True,
    help="Staged selection's order: by version, or by PSManager's reserve indicators.",
)
@click.option(
    "--psrl-check-interval-ms",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="How often a request PSManager holds out asks again.",
)
@click.option(
    "--max-loopbacks",
    default=8,
    show_default=True,
    type=click.IntRange(min=0),
    help="Partial-rollout loopbacks per /generate request (a rollout a weight sync aborted is "
    "continued from its tokens); past it 503 loopback_limit_exceeded. 0 turns loopback off.",
)
@click.option(
    "--eligible-wait-secs",
    default=None,
    type=click.FloatRange(min=0.0),
    help="How long a rollout request may wait for an eligible engine before a retryable 503. "
    "Default: through a sync in progress (paused engines, an open refit, dispatch paused) up to "
    "--request-timeout-secs, and 30 s otherwise; a value bounds every wait.",
)
@click.option(
    "--retry-max-retries",
    default=5,
    show_default=True,
    type=click.IntRange(min=1),
    help="Data plane: attempts per request (1 = no retry); only before the first byte.",
)
@click.option(
    "--retry-initial-backoff-ms",
    default=50,
    show_default=True,
    type=click.IntRange(min=0),
    help="First retry delay.",
)
@click.option(
    "--retry-max-backoff-ms",
    default=30_000,
    show_default=True,
    type=click.IntRange(min=0),
    help="Largest retry delay.",
)
@click.option(
    "--retry-backoff-multiplier",
    default=1.5,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="Delay growth per retry.",
)
@click.option(
    "--retry-jitter-factor",
    default=0.2,
    show_default=True,
    type=click.FloatRange(0.0, 1.0),
    help="+/- share of randomness on each delay.",
)
@click.option("--disable-retries", is_flag=True, help="Data plane: one attempt per request.")
@click.option(
    "--cb-failure-threshold",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="Failures (connection errors, 5xx) in the window that open an engine's breaker.",
)
@click.option(
    "--cb-success-threshold",
    default=3,
    show_default=True,
    type=click.IntRange(min=1),
    help="Successes while half-open that close it.",
)
@click.option(
    "--cb-timeout-duration-secs",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="How long an open breaker keeps the engine out of routing.",
)
@click.option(
    "--cb-window-duration-secs",
    default=120.0,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="The window failures are counted in.",
)
@click.option(
    "--max-concurrent-requests",
    default=-1,
    show_default=True,
    type=click.IntRange(min=-1),
    help="Rollout requests in progress at once (-1: 1024 per core, at least 4096; 0: no limit).",
)
@click.option(
    "--queue-size",
    default=100,
    show_default=True,
    type=click.IntRange(min=0),
    help="Requests that may wait for a slot; beyond it 429.",
)
@click.option(
    "--queue-timeout-secs",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=0.0),
    help="Longest wait for a slot; then 429 queue_timeout.",
)
@click.option(
    "--disable-health-check",
    is_flag=True,
    help="No periodic health probes of the engines.",
)
@click.option(
    "--health-check-interval-secs",
    default=60.0,
    show_default=True,
    type=float,
    help="Seconds between two health probes of an engine.",
)
@click.option(
    "--health-check-timeout-secs",
    default=5.0,
    show_default=True,
    type=float,
    help="Deadline of one probe.",
)
@click.option(
    "--health-failure-threshold",
    default=3,
    show_default=True,
    type=int,
    help="Failed probes in a row before an engine is not_ready.",
)
@click.option(
    "--health-success-threshold",
    default=2,
    show_default=True,
    type=int,
    help="Good probes in a row before it is ready again.",
)
@click.option(
    "--health-check-endpoint",
    default="/health",
    show_default=True,
    help="The path probed (paused, asleep or unknown engines are not probed).",
)
@click.option(
    "--disable-circuit-breaker", is_flag=True, help="No per-engine circuit breaker on the data plane."
)
@click.option(
    "--dp-aware",
    is_flag=True,
    help="Register an engine reporting dp_size N as N ranks url@0..N-1; route to (worker, rank).",
)
@click.option("--control-plane-api-keys", multiple=True, help="id:name:role:key (role admin or user).")
@click.option(
    "--tenant-api-key", multiple=True, help="tenant_id:key (data plane; refused on control routes)."
)
@click.option(
    "--control-plane-audit-enabled",
    is_flag=True,
    help="Accepted for SMG compatibility: audit is on by default.",
)
@click.option("--disable-audit-logging", is_flag=True, help="Do not journal/log control-plane audit events.")
@click.option(
    "--audit-interval-secs",
    default=60.0,
    show_default=True,
    type=float,
    help="Control-plane reads and denials are journaled as counts, one event per this interval.",
)
@click.option(
    "--prometheus-host",
    default=None,
    help="Metrics listener address (default: --host).",
)
@click.option(
    "--prometheus-port",
    default=29000,
    show_default=True,
    type=int,
    help="Metrics listener port (GET /metrics; 0: any free port, logged).",
)
@click.option(
    "--shutdown-grace-period-secs",
    default=180.0,
    show_default=True,
    type=float,
    help="How long SIGTERM waits for in-flight requests.",
)
@click.option(
    "--header-read-timeout-secs",
    default=30.0,
    show_default=True,
    type=float,
    help="Close a connection that has not sent a complete request head this many seconds after it "
    "was accepted (or after the first byte of its next head on keep-alive). 0 disables.",
)
@click.option(
    "--idle-connection-timeout-secs",
    default=90.0,
    show_default=True,
    type=float,
    help="Close a keep-alive connection with no request in flight for this many seconds (an open "
    "stream counts as in flight). 0 keeps idle connections open.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warn", "error"], case_sensitive=False),
    help="Log lines at this level and above.",
)
@click.option("--log-json", is_flag=True, help="One JSON object per log line.")
@click.option(
    "--disable-load-monitoring",
    is_flag=True,
    help="Poll engine loads only when the policy (cache_aware, power_of_two, least_load) or overload "
    "protection needs them (SMG's gate; docs/cli.md).",
)
@click.option(
    "--load-monitor-interval",
    default=10,
    show_default=True,
    type=click.IntRange(min=1),
    help="Seconds between two reads of an engine's GET /v1/loads (engine_load in GET /workers).",
)
@click.option(
    "--disable-worker-overload-protection",
    is_flag=True,
    help="smgrl has no overload protection; with --disable-load-monitoring this lets the load monitor stop.",
)
@click.option(
    "--journal",
    "journal_path",
    default=DEFAULT_JOURNAL,
    show_default=True,
    envvar="SMGRL_JOURNAL",
    help="The SQLite journal file, or a postgresql:// URL (env SMGRL_JOURNAL).",
)
@click.option(
    "--journal-lock-wait-secs",
    default=5.0,
    show_default=True,
    type=float,
    help="How long a journal append waits for another process's write lock before the operation answers 503.",
)
@click.option(
    "--tokenizer-path",
    default=None,
    help="Model dir (tokenizer.json + tokenizer_config.json) for agent sessions with token-exact "
    "capture (docs/sessions.md); without it the session routes answer 503 sessions_disabled.",
)
@click.option(
    "--max-sessions",
    default=4096,
    show_default=True,
    type=click.IntRange(min=1),
    help="Open sessions at most; POST /sessions beyond it gets 429 too_many_sessions.",
)
@click.option(
    "--session-idle-timeout-secs",
    default=3600.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="A session unused this long (no turn, no continue) is ended (session.ended, reason idle); never "
    "a hung session or one with a turn in flight. 0: never.",
)
@click.option(
    "--session-max-stored-tokens",
    default=2_000_000,
    show_default=True,
    type=click.IntRange(min=0),
    help="Token ids one session's captured trajectories may hold; a turn that could pass it answers 400 "
    "session_budget_exceeded. 0: no budget.",
)
@click.option(
    "--session-gc-threshold",
    default=0,
    show_default=True,
    type=click.IntRange(min=0),
    help="Captured turns a session keeps before collecting abandoned branches (0: after every turn).",
)
@click.option(
    "--session-trajectory-strategy",
    type=click.Choice(["auto", "manual"]),
    default="auto",
    show_default=True,
    help="auto: branches get their own trajectory ids; manual: x-smg-tito-trajectory-id names it.",
)
@click.option(
    "--session-tool-parser",
    type=click.Choice(["hermes", "qwen", "none"]),
    default="hermes",
    show_default=True,
    help="How tool calls are parsed from generated text.",
)
@click.option(
    "--session-debug",
    is_flag=True,
    help="Validate every reused prefix against a full re-tokenization (CPU-heavy; mismatch_report).",
)
@click.option(
    "--advertise-url",
    default=None,
    help="With several gateway hosts on one journal: the http://HOST:PORT other hosts forward a "
    "session's or a refit's requests to (docs/scale-out.md, Forwarding).",
)
@click.option(
    "--forward-port",
    default=0,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="The private loopback port other gateway processes forward a session's or a refit's requests "
    "to; with --workers N, worker i listens on PORT+i. 0: a free port.",
)
@click.option(
    "--worker-metrics-port",
    default=0,
    show_default=True,
    type=click.IntRange(0, 65535),
    help="With --workers N: worker i's own metrics listener on 127.0.0.1:PORT+i, which --prometheus-port "
    "merges. 0: a free port.",
)
@click.option(
    "--workers",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Gateway processes serving one port and one journal (docs/scale-out.md).",
)
def launch(**opts) -> None:
    """Run the gateway."""
    workers = opts.pop("workers")
    cfg = config_from_options(opts)
    if workers > 1:
        if cfg.journal == ":memory:":
            raise click.UsageError("--workers needs a journal file or a postgresql:// URL, not :memory:")
        from smgrl.cluster.supervisor import run_supervisor

        run_supervisor(cfg, _launch_args(), workers)
        return
    run_gateway(cfg)


def _launch_args() -> list[str]:
    """The flags given to ``launch`` (for the --workers supervisor's workers)."""
    argv = sys.argv[1:]
    return argv[argv.index("launch") + 1 :] if "launch" in argv else argv

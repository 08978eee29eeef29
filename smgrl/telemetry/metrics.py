"""Prometheus metrics: one registry per gateway, served on the ``--prometheus-port`` listener.

The ``smg_rl_*`` families, labels, HELP texts and buckets are SMG 1.13.0's (docs/rl-control-plane.md, "Metrics") so existing
dashboards keep working; with ``--enable-rl`` off none of them exist (no HELP/TYPE either).
No label ever carries a secret or an unbounded value (``op`` is normalised, never the raw path).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)

from smgrl.telemetry.tallies import Spread, Tally

# SMG exposes no ``*_created`` series; prometheus_client adds one per counter and histogram unless
# told not to (a process-wide switch, hence at import).
disable_created_metrics()

DURATION_BUCKETS = (
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30, 45, 60, 90, 120, 180,
    240, 300, 480, 900, 1200, 1800, 2700, 3600, 5400, 7200,
)  # fmt: skip


class Metrics:
    def __init__(self, *, rl_enabled: bool) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.rl_enabled = rl_enabled
        r = self.registry
        # The families updated on every fan-out and commit are tallies (smgrl/telemetry/tallies.py):
        # the same scrape, without prometheus_client's per-update cost.
        self.journal_appends = Tally(
            "smgrl_journal_events", "Events appended to the journal, by type", ["type"], registry=r
        )
        self.journal_transactions = Tally(
            "smgrl_journal_transactions", "Journal transactions committed (one per group commit)", registry=r
        )
        # Read from the journal writer at scrape time (Gateway.build sets the function).
        self.journal_lock_waits = Gauge(
            "smgrl_journal_lock_waits",
            "Journal batches that found SQLite's write lock taken and waited for it in the writer's thread",
            registry=r,
        )
        self.workers = Gauge("smgrl_workers", "Registry entries, by health", ["health"], registry=r)
        self.auth_denied = Counter(
            "smgrl_control_plane_denied_total",
            "Control-plane requests refused by auth, by status",
            ["status"],
            registry=r,
        )
        if not rl_enabled:
            return
        self.control_calls = Tally(
            "smg_rl_control_calls",
            "RL control-plane calls proxied to engines, by operation and result",
            ["op", "result"],
            registry=r,
        )
        self.control_duration = Spread(
            "smg_rl_control_call_duration_seconds",
            "Latency of one proxied RL control call, by operation",
            ["op"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.fanouts = Tally("smg_rl_fanout", "RL fan-out requests, by result", ["result"], registry=r)
        self.fanout_duration = Spread(
            "smg_rl_fanout_duration_seconds",
            "Wall time of one RL fan-out request",
            buckets=DURATION_BUCKETS,
            registry=r,
        )

    def control_call(self, op: str, result: str, seconds: float) -> None:
        self.control_calls.inc((op, result))
        self.control_duration.observe((op,), seconds)

    def fanout(self, result: str, seconds: float) -> None:
        self.fanouts.inc((result,))
        self.fanout_duration.observe((), seconds)

    def journaled(self, records) -> None:
        """Count committed events by type (called with each committed batch: one transaction)."""
        self.journal_transactions.inc()
        appends = self.journal_appends
        for rec in records:
            appends.inc((getattr(rec.event, "TYPE", "unknown"),))

    def render(self, registry_state=None) -> bytes:
        if registry_state is not None:
            # Computed at scrape time from the projection: no bookkeeping on the hot path.
            counts = {h: 0 for h in ("pending", "ready", "not_ready", "failed", "draining")}
            for w in registry_state:
                counts[w.status] = counts.get(w.status, 0) + 1
            for health, n in counts.items():
                self.workers.labels(health=health).set(n)
        return generate_latest(self.registry)

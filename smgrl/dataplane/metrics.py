"""Data-plane metrics, registered on the gateway's own registry (served on ``--prometheus-port``).

Always: ``smgrl_dataplane_requests_total{route,status}``,
``smgrl_dataplane_request_duration_seconds{route}``, ``smgrl_dataplane_retries_total``,
``smgrl_dataplane_waiting_requests`` (and ``..._by_reason{reason}``) and
``smgrl_dataplane_inflight_requests{worker}``.

With ``--enable-rl``, SMG M2's families (docs/data-plane.md, "Metrics") under an ``smgrl_rl_`` prefix: SMG
1.13.0 has no M2, and its ``smg_rl_*`` set is pinned by ``tests/api/test_rl_metrics.py`` (rename
when SMG ships M2):
``smgrl_rl_worker_weight_version{worker}`` (numeric versions only),
``smgrl_rl_worker_control_state{worker}`` (0 active, 1 paused, 2 asleep; 3 unknown is smgrl's),
``smgrl_rl_candidates_filtered_total{reason}``, ``smgrl_rl_requests_unroutable_total``,
``smgrl_rl_mixed_version_total`` and ``smgrl_rl_version_change_with_inflight_total``. The gauges are
computed at scrape time from the routing table: nothing is kept up to date on the hot path.
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily

from smgrl.core import parse_u64
from smgrl.telemetry.metrics import DURATION_BUCKETS
from smgrl.telemetry.tallies import Spread, Tally

CONTROL_CODES = {"active": 0, "paused": 1, "asleep": 2, "unknown": 3}


class _TableCollector:
    """Scrape-time gauges from the data plane's routing table and counters."""

    def __init__(self, dataplane, rl_enabled: bool) -> None:
        self.dataplane = dataplane
        self.rl_enabled = rl_enabled

    def describe(self):
        return []

    def collect(self):
        dataplane = self.dataplane
        waiting = GaugeMetricFamily(
            "smgrl_dataplane_waiting_requests",
            "Rollout requests waiting in the gateway for an eligible engine",
        )
        waiting.add_metric([], dataplane.waiting)
        yield waiting
        by_reason = GaugeMetricFamily(
            "smgrl_dataplane_waiting_requests_by_reason",
            "Rollout requests waiting in the gateway for an eligible engine, by the reason holding "
            "out most candidates (stale, unversioned: an x-version-tag floor; paused, asleep, ...)",
            labels=["reason"],
        )
        for reason, n in sorted(dataplane.waiting_by_reason.items()):
            if n:
                by_reason.add_metric([reason], n)
        yield by_reason
        held = GaugeMetricFamily(
            "smgrl_dataplane_memory_held_bytes",
            "Bytes of rollout request bodies and buffered answers held (--dataplane-memory-budget)",
        )
        held.add_metric([], dataplane.budget.used)
        yield held
        table = dataplane.table()
        entries = [e for slot in table.models.values() for e in slot.entries]
        inflight = GaugeMetricFamily(
            "smgrl_dataplane_inflight_requests", "Rollout requests in flight, by worker", labels=["worker"]
        )
        for e in entries:
            inflight.add_metric([e.instance.url], dataplane.loads.get(e.instance.worker_id, 0))
        yield inflight
        if not self.rl_enabled:
            return
        version = GaugeMetricFamily(
            "smgrl_rl_worker_weight_version",
            "Weight version of each worker (numeric versions only)",
            labels=["worker"],
        )
        control = GaugeMetricFamily(
            "smgrl_rl_worker_control_state",
            "Control state of each worker (0 active, 1 paused, 2 asleep, 3 unknown)",
            labels=["worker"],
        )
        for e in entries:
            numeric = parse_u64(e.version) if e.version is not None else None
            if numeric is not None:
                version.add_metric([e.instance.url], numeric)
            control.add_metric([e.instance.url], CONTROL_CODES.get(e.control, 3))
        yield version
        yield control


class DataPlaneMetrics:
    def __init__(self, registry, *, rl_enabled: bool, dataplane) -> None:
        r = registry
        self.rl_enabled = rl_enabled
        # Updated on every rollout answer: tallies (smgrl/telemetry/tallies.py), as the fan-out's.
        self.requests = Tally(
            "smgrl_dataplane_requests",
            "Rollout requests answered, by route and status",
            ["route", "status"],
            registry=r,
        )
        # Declarations shaped like smgrl/telemetry/metrics.py's: each names its own series, nothing to share.
        self.duration = Spread(
            "smgrl_dataplane_request_duration_seconds",
            "Wall time of one rollout request, streamed body included",
            ["route"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.retries = Counter(
            "smgrl_dataplane_retries", "Rollout attempts retried before the first byte", registry=r
        )
        self.loopbacks = Counter(
            "smgrl_dataplane_loopbacks",
            "Partial-rollout continuations dispatched after a sync aborted a rollout",
            registry=r,
        )
        self.tokens_kept = Counter(
            "smgrl_dataplane_loopback_tokens_kept",
            "Decoded tokens a loopback kept (not regenerated)",
            registry=r,
        )
        r.register(_TableCollector(dataplane, rl_enabled))
        if not rl_enabled:
            return
        self.filtered = Counter(
            "smgrl_rl_candidates_filtered",
            "Routing candidates held out by the state- and version-aware filter, by reason",
            ["reason"],
            registry=r,
        )
        self.unroutable = Counter(
            "smgrl_rl_requests_unroutable",
            "Requests answered 503 because no candidate was eligible",
            registry=r,
        )
        self.mixed = Counter(
            "smgrl_rl_mixed_version",
            "Buffered /generate answers whose weights changed mid-request",
            registry=r,
        )
        self.version_change_inflight = Counter(
            "smgrl_rl_version_change_with_inflight",
            "Weight-version changes observed while the worker had requests in flight",
            registry=r,
        )

    # -- hooks (cheap no-ops when RL is off) ---------------------------------------------------

    def answered(self, route: str, status: int, seconds: float) -> None:
        self.requests.inc((route, str(status)))
        self.duration.observe((route,), seconds)

    def held_out(self, reasons: Mapping[str, int]) -> None:
        if self.rl_enabled:
            for reason, n in reasons.items():
                self.filtered.labels(reason=reason).inc(n)

    def unroutable_request(self) -> None:
        if self.rl_enabled:
            self.unroutable.inc()

    def mixed_answer(self) -> None:
        if self.rl_enabled:
            self.mixed.inc()

    def version_changed_with_inflight(self) -> None:
        if self.rl_enabled:
            self.version_change_inflight.inc()

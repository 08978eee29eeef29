"""Counters and histograms for the hot paths, exposed through a prometheus_client registry.

Every engine call of a fan-out counts one call and observes one latency, and every journal commit
counts its events by type: about 25 metric updates per 8-engine fan-out. Through
prometheus_client each update takes the metric's lock, checks observability and (for a histogram)
walks the buckets in Python: about 5% of the gateway's CPU per fan-out (docs/benchmarks.md).
Here an update is a dictionary lookup and an addition, and the work of the exposition format
(cumulative buckets, names, labels) is done at scrape time, as a prometheus_client collector, by
prometheus_client's own metric families. The text a scrape gets is the one prometheus_client's
``Counter`` and ``Histogram`` give for the same updates, byte for byte
(``tests/unit/test_tallies.py`` drives both with the same random updates and compares).

Updated from the event loop's thread only (the gateway's request tasks and the journal writer's
task); a scrape renders on the same thread, so no lock is needed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

__all__ = ["Spread", "Tally"]


class Tally:
    """A counter, by label values (a tuple, in ``labelnames`` order). An unlabelled one is
    exposed at 0 from the start, as prometheus_client's ``Counter`` is."""

    __slots__ = ("_doc", "_labelnames", "_name", "_values")

    def __init__(
        self, name: str, doc: str, labelnames: Sequence[str] = (), *, registry: CollectorRegistry
    ) -> None:
        self._name, self._doc, self._labelnames = name, doc, tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {} if self._labelnames else {(): 0.0}
        registry.register(self)  # type: ignore[arg-type]  # a collector by its shape

    def inc(self, labels: tuple[str, ...] = (), amount: float = 1.0) -> None:
        values = self._values
        values[labels] = values.get(labels, 0.0) + amount

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._doc, labels=self._labelnames)
        for labels, value in self._values.items():
            family.add_metric(labels, value)
        yield family


class Spread:
    """A histogram, by label values, with ``buckets`` as upper bounds (``+Inf`` added). An
    unlabelled one is exposed (all zero) from the start, as prometheus_client's ``Histogram`` is."""

    __slots__ = ("_bounds", "_doc", "_labelnames", "_les", "_name", "_rows")

    def __init__(
        self,
        name: str,
        doc: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = [float(b) for b in buckets]
        if bounds != sorted(bounds):
            raise ValueError("buckets must be in increasing order")
        if not bounds or bounds[-1] != math.inf:
            bounds.append(math.inf)
        self._name, self._doc, self._labelnames = name, doc, tuple(labelnames)
        self._bounds = bounds
        self._les = [floatToGoString(b) for b in bounds]
        # label values -> [count per bucket (not cumulative)..., sum]
        self._rows: dict[tuple[str, ...], list[float]] = {}
        if not self._labelnames:
            self._rows[()] = [0.0] * (len(bounds) + 1)
        registry.register(self)  # type: ignore[arg-type]

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        row = self._rows.get(labels)
        if row is None:
            row = self._rows[labels] = [0.0] * (len(self._bounds) + 1)
        # The first bucket whose bound is >= value: prometheus_client's ``value <= bound``.
        row[bisect.bisect_left(self._bounds, value)] += 1
        row[-1] += value

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self._name, self._doc, labels=self._labelnames)
        for labels, row in self._rows.items():
            cumulative, buckets = 0.0, []
            for le, count in zip(self._les, row, strict=False):
                cumulative += count
                buckets.append((le, cumulative))
            family.add_metric(labels, buckets, row[-1])
        yield family

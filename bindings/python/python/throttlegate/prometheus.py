"""The limiter's per-rule metrics as a ``prometheus_client`` collector.

Register it in one line and the metrics appear on your existing ``/metrics``::

    from prometheus_client import REGISTRY
    from throttlegate.prometheus import LimiterCollector

    REGISTRY.register(LimiterCollector(limiter))

The numbers are the core's (``Limiter.metrics()``), under the same names and
labels as ``Limiter.metrics_text()``: ``throttlegate_checks_total{rule}``,
``throttlegate_decisions_total{rule,outcome}``,
``throttlegate_backend_errors_total{rule}``, ``throttlegate_timeouts_total{rule}``
and the ``throttlegate_backend_call_seconds`` histogram. ``prometheus_client``
is an optional dependency (``pip install throttlegate[prometheus]``).
"""

from __future__ import annotations

from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from throttlegate._native import METRIC_FAMILIES, Limiter

__all__ = ["LimiterCollector"]


class LimiterCollector(Collector):
    """Collects ``limiter``'s metrics on every scrape (nothing when they are off).

    The families (names, help texts, types, labels) are the core's
    ``throttlegate.METRIC_FAMILIES``; this only puts the numbers of
    ``Limiter.metrics()`` into ``prometheus_client``'s types.
    """

    def __init__(self, limiter: Limiter) -> None:
        self._limiter = limiter

    def collect(self) -> Iterator[Metric]:
        metrics: Any = self._limiter.metrics()
        if metrics is None:
            return
        for family in METRIC_FAMILIES:
            if family["type"] == "counter":
                counter = CounterMetricFamily(family["name"], family["help"], labels=list(family["labels"]))
                for labels, value in metrics["counters"][family["name"]]:
                    counter.add_metric(labels, value)
                yield counter
            else:
                latency = metrics["backend_latency"]
                buckets = [(repr(float(le)), n) for le, n in latency["buckets"]]
                buckets.append(("+Inf", latency["count"]))
                yield HistogramMetricFamily(
                    family["name"],
                    family["help"],
                    buckets=buckets,
                    sum_value=latency["sum_seconds"],
                    unit=family["unit"] or "",
                )

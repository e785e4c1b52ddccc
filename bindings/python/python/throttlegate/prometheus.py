"""The limiter's per-rule metrics as a ``prometheus_client`` collector.

Register it in one line and the metrics appear on your existing ``/metrics``::

    from prometheus_client import REGISTRY
    from throttlegate.prometheus import LimiterCollector

    REGISTRY.register(LimiterCollector(limiter))

The numbers are the core's (``Limiter.metrics()``), and so are the families:
their names, help texts, types, label names and label values come from
``throttlegate.METRIC_FAMILIES`` and each family's samples in
``Limiter.metrics()["counters"]``, exactly as ``Limiter.metrics_text()`` writes
them; this module names no metric itself. ``prometheus_client`` is an optional
dependency (``pip install throttlegate[prometheus]``).
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

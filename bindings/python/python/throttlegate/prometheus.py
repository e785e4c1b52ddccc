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

from throttlegate._native import Limiter

__all__ = ["LimiterCollector"]

_OUTCOMES = ("allowed", "denied", "shadow_denied", "degraded_allowed", "degraded_denied")


class LimiterCollector(Collector):
    """Collects ``limiter``'s metrics on every scrape (nothing when they are off)."""

    def __init__(self, limiter: Limiter) -> None:
        self._limiter = limiter

    def collect(self) -> Iterator[Metric]:
        metrics: Any = self._limiter.metrics()
        if metrics is None:
            return
        rules = metrics["rules"]
        checks = CounterMetricFamily("throttlegate_checks", "Checks and peeks each rule applied to.", labels=["rule"])
        decisions = CounterMetricFamily(
            "throttlegate_decisions",
            "How each rule's checks ended: its own verdict, or the failure policy's.",
            labels=["rule", "outcome"],
        )
        errors = CounterMetricFamily(
            "throttlegate_backend_errors", "Backend failures returned as errors, per rule.", labels=["rule"]
        )
        timeouts = CounterMetricFamily("throttlegate_timeouts", "Backend calls that ran out of time, per rule.", labels=["rule"])
        for r in rules:
            checks.add_metric([r["rule"]], r["checks"])
            for outcome in _OUTCOMES:
                decisions.add_metric([r["rule"], outcome], r[outcome])
            errors.add_metric([r["rule"]], r["backend_errors"])
            timeouts.add_metric([r["rule"]], r["timeouts"])
        latency = metrics["backend_latency"]
        buckets = [(repr(float(le)), n) for le, n in latency["buckets"]]
        buckets.append(("+Inf", latency["count"]))
        histogram = HistogramMetricFamily(
            "throttlegate_backend_call_seconds",
            "Time of backend calls (Redis round trips).",
            buckets=buckets,
            sum_value=latency["sum_seconds"],
            unit="seconds",
        )
        reloads = CounterMetricFamily("throttlegate_policy_reloads", "Policies applied by a reload.")
        reloads.add_metric([], metrics["reloads"])
        reload_errors = CounterMetricFamily(
            "throttlegate_policy_reload_errors", "Reloads refused; the policy in force stayed."
        )
        reload_errors.add_metric([], metrics["reload_errors"])
        yield from (checks, decisions, errors, timeouts, histogram, reloads, reload_errors)

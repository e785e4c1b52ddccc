"""Per-rule metrics: the core's numbers, the OpenMetrics text, and the
prometheus_client collector, on the embedded backend and a real Redis."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import parser as text_parser
from prometheus_client.openmetrics import parser as openmetrics_parser

import throttlegate as tg
from throttlegate.prometheus import LimiterCollector

RULES = [
    {"name": "per-ip", "key": "ip:{ip}", "limit": 2, "window": "1m"},
    {"name": "shadow-bucket", "key": "b:{ip}", "algorithm": "token_bucket", "capacity": 1, "refill_rate": 0.001, "shadow": True},
]


def test_decisions_are_counted_per_rule_and_outcome(backend_url: str | None, prefix: str) -> None:
    limiter = tg.Limiter(RULES, backend_url, prefix=prefix)
    for _ in range(3):
        limiter.check({"ip": "198.51.100.1"})
    m = limiter.metrics()
    assert m is not None
    ip, bucket = m["rules"]
    assert (ip["rule"], ip["checks"], ip["allowed"], ip["denied"]) == ("per-ip", 3, 2, 1)
    assert (bucket["checks"], bucket["allowed"], bucket["shadow_denied"]) == (3, 1, 2)
    latency = m["backend_latency"]
    assert latency["count"] == (0 if backend_url is None else 3)
    assert [le for le, _ in latency["buckets"]] == [
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5
    ]
    text = limiter.metrics_text()
    assert text is not None
    assert 'throttlegate_decisions_total{rule="per-ip",outcome="denied"} 1\n' in text
    assert f"throttlegate_backend_call_seconds_count {latency['count']}\n" in text
    assert "198.51.100.1" not in text, "no attribute value in a label"
    assert text.endswith("# EOF\n")
    assert tg.METRICS_CONTENT_TYPE.startswith("application/openmetrics-text")


def test_the_collector_gives_prometheus_client_the_same_numbers(redis_server: object, prefix: str) -> None:
    limiter = tg.Limiter(RULES, getattr(redis_server, "url"), prefix=prefix)
    for _ in range(3):
        limiter.check({"ip": "198.51.100.2"})
    registry = CollectorRegistry()
    registry.register(LimiterCollector(limiter))
    text = generate_latest(registry).decode()
    assert 'throttlegate_checks_total{rule="per-ip"} 3.0' in text
    assert 'throttlegate_decisions_total{outcome="shadow_denied",rule="shadow-bucket"} 2.0' in text
    assert "throttlegate_backend_call_seconds_count 3.0" in text
    assert 'throttlegate_backend_call_seconds_bucket{le="+Inf"} 3.0' in text
    assert "throttlegate_policy_reloads_total 0.0" in text
    assert "throttlegate_policy_reload_errors_total 0.0" in text


def test_the_families_are_the_cores_in_both_expositions(redis_server: object, prefix: str) -> None:
    limiter = tg.Limiter(RULES, getattr(redis_server, "url"), prefix=prefix)
    limiter.check({"ip": "198.51.100.5"})
    registry = CollectorRegistry()
    registry.register(LimiterCollector(limiter))
    collected = generate_latest(registry).decode()
    core = limiter.metrics_text()
    assert core is not None
    assert [f["name"] for f in tg.METRIC_FAMILIES] == [
        "throttlegate_checks", "throttlegate_decisions", "throttlegate_backend_errors",
        "throttlegate_timeouts", "throttlegate_settles", "throttlegate_settle_refunded",
        "throttlegate_settle_debited", "throttlegate_reserve_trips", "throttlegate_reserve_local",
        "throttlegate_reserve_reserved_units", "throttlegate_reserve_returned_units",
        "throttlegate_reserve_dropped_units", "throttlegate_policy_reloads", "throttlegate_policy_reload_errors",
        "throttlegate_backend_call_seconds",
    ]
    for f in tg.METRIC_FAMILIES:
        # The Prometheus text format (generate_latest) names a counter family with its _total.
        exposed = f["name"] + "_total" if f["type"] == "counter" else f["name"]
        for text, name in ((core, f["name"]), (collected, exposed)):
            assert f"# HELP {name} {f['help']}\n" in text, name
            assert f"# TYPE {name} {f['type']}\n" in text, name
    assert tg.OUTCOMES == ("allowed", "denied", "shadow_denied", "degraded_allowed", "degraded_denied")
    m = limiter.metrics()
    assert m is not None
    decisions = m["counters"]["throttlegate_decisions"]
    assert [tuple(labels) for labels, _ in decisions] == [(r, o) for r in ("per-ip", "shadow-bucket") for o in tg.OUTCOMES]
    assert m["counters"]["throttlegate_checks"] == [(["per-ip"], 1), (["shadow-bucket"], 1)]


def _families(text: str, openmetrics: bool) -> dict[str, tuple[str, str, list[tuple[str, tuple[tuple[str, Any], ...], float]]]]:
    """Each family of an exposition by its name (a counter's without `_total`):
    its help, type and samples, labels sorted and `le` read as a number."""
    parse = openmetrics_parser.text_string_to_metric_families if openmetrics else text_parser.text_string_to_metric_families
    out = {}
    for f in parse(text):
        samples = sorted(
            (s.name, tuple(sorted((k, float(v) if k == "le" else v) for k, v in s.labels.items())), float(s.value))
            for s in f.samples
        )
        out[f.name.removesuffix("_total")] = (f.documentation, f.type, samples)
    return out


def test_the_collector_gives_exactly_the_cores_exposition(redis_server: object, prefix: str) -> None:
    """Every family of metrics_text() (names, help texts, types, label names and
    values, numbers) is what the collector gives prometheus_client, and nothing else."""
    rules = [*RULES, {"name": "bucket", "key": "k:{ip}", "algorithm": "token_bucket", "capacity": 5, "refill_rate": 0.001}]
    limiter = tg.Limiter(rules, getattr(redis_server, "url"), prefix=prefix)
    ip = {"ip": "198.51.100.6"}
    for _ in range(3):
        limiter.check(ip)
    d = limiter.check({"ip": "198.51.100.7"}, 1, call_id="one")
    assert limiter.settle(d, 0) == 3
    limiter.reload(rules)
    registry = CollectorRegistry()
    registry.register(LimiterCollector(limiter))
    core_text = limiter.metrics_text()
    assert core_text is not None
    core = _families(core_text, openmetrics=True)
    collected = _families(generate_latest(registry).decode(), openmetrics=False)
    assert list(core) == [f["name"] for f in tg.METRIC_FAMILIES]
    assert collected == core
    assert core["throttlegate_settles"][2] == [
        ("throttlegate_settles_total", (("rule", r),), n) for r, n in (("bucket", 1.0), ("per-ip", 1.0), ("shadow-bucket", 1.0))
    ]
    assert core["throttlegate_policy_reloads"][2] == [("throttlegate_policy_reloads_total", (), 1.0)]


def test_failures_are_counted_for_every_rule_of_the_call(prefix: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    limiter = tg.Limiter(RULES, f"redis://127.0.0.1:{port}", timeout=0.3, on_backend_error="error", prefix=prefix)
    with pytest.raises(tg.BackendUnavailableError):
        limiter.check({"ip": "198.51.100.3"})
    m = limiter.metrics()
    assert m is not None
    assert [(r["checks"], r["backend_errors"]) for r in m["rules"]] == [(1, 1), (1, 1)]


def test_metrics_can_be_turned_off_and_the_option_is_checked() -> None:
    limiter = tg.Limiter(RULES, metrics=False)
    limiter.check({"ip": "198.51.100.4"})
    assert limiter.metrics() is None
    assert limiter.metrics_text() is None
    assert limiter.stats()["calls"] == 1
    registry = CollectorRegistry()
    registry.register(LimiterCollector(limiter))
    assert b"throttlegate" not in generate_latest(registry)
    with pytest.raises(tg.InvalidArgumentTypeError, match="metrics: expected a boolean, got a string"):
        tg.Limiter(RULES, metrics="yes")  # type: ignore[arg-type]

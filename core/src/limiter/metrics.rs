//! Per-rule metrics: how each rule's checks ended, and how long backend
//! calls took. Labels are the rule's name and the outcome only (never a key
//! or an attribute value), so their number is bounded by the policy.
//!
//! Counting is a few relaxed atomic additions per applicable rule, striped
//! over cache lines like the limiter's totals; [`Metrics::to_text`] writes
//! the OpenMetrics text exposition (which Prometheus scrapes) through the
//! `prometheus-client` crate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::MetricType;
use prometheus_client::collector::Collector;
use prometheus_client::registry::{Registry, Unit};

use super::stats::{stripe, StripeRef, STRIPES};
use crate::decision::{RuleName, RuleResult};

/// The content type of [`Metrics::to_text`], for a `/metrics` response.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds (seconds) of the backend latency histogram's buckets.
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

/// The kind of a metric family, as Prometheus types it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// A monotonic count (exposed with a `_total` suffix).
    Counter,
    /// The backend latency histogram (`_bucket`, `_sum`, `_count`).
    Histogram,
}

impl MetricKind {
    /// `"counter"` or `"histogram"`, as every client library spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Histogram => "histogram",
        }
    }
}

/// One family of the metrics every front end exposes: the one description
/// that the text exposition and the Python and Node collectors all use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricFamily {
    /// The family's name, without the `_total` a counter's samples carry
    /// (`throttlegate_checks`); a histogram's ends with its unit.
    pub name: &'static str,
    /// The help text.
    pub help: &'static str,
    /// Counter or histogram.
    pub kind: MetricKind,
    /// The label names of its samples, in order (`rule`, `outcome`).
    pub labels: &'static [&'static str],
    /// The unit its name ends with (`seconds`), if any.
    pub unit: Option<&'static str>,
}

/// Every metric family, in exposition order: the per-rule counters
/// `throttlegate_checks`, `throttlegate_decisions` (by outcome, see
/// [`OUTCOMES`]), `throttlegate_backend_errors`, `throttlegate_timeouts`,
/// `throttlegate_settles`, `throttlegate_settle_refunded` and
/// `throttlegate_settle_debited`, the reserved rules' counters
/// `throttlegate_reserve_trips`, `throttlegate_reserve_local`,
/// `throttlegate_reserve_reserved_units`, `throttlegate_reserve_returned_units` and
/// `throttlegate_reserve_dropped_units` (see [`RuleReserveMetrics`]), the policy's counters `throttlegate_policy_reloads` and
/// `throttlegate_policy_reload_errors` (no labels), then the
/// `throttlegate_backend_call_seconds` histogram (no labels).
pub const METRIC_FAMILIES: [MetricFamily; 15] = [
    MetricFamily {
        name: "throttlegate_checks",
        help: "Checks and peeks each rule applied to.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_decisions",
        help: "How each rule's checks ended: its own verdict, or the failure policy's.",
        kind: MetricKind::Counter,
        labels: &["rule", "outcome"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_backend_errors",
        help: "Backend failures returned as errors, per rule.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_timeouts",
        help: "Backend calls that ran out of time, per rule.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_settles",
        help: "Checks settled to their actual cost, per rule.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_settle_refunded",
        help: "Units settles gave back (the actual cost below the check's), per rule.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_settle_debited",
        help: "Units settles took beyond the check's cost, per rule.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_reserve_trips",
        help: "Checks and peeks on a reserved rule that went to the backend, per reserved rule.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_reserve_local",
        help: "Checks a reserved rule answered from this limiter's reservation, with no round trip, per reserved rule.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_reserve_reserved_units",
        help: "Units reserved from the backend, per reserved rule.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_reserve_returned_units",
        help: "Reserved units given back unspent, per reserved rule.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_reserve_dropped_units",
        help: "Reserved units dropped unspent (their period ended, or the backend could not take them back), per reserved rule.",
        kind: MetricKind::Counter,
        labels: &["rule"],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_policy_reloads",
        help: "Policies applied by a reload.",
        kind: MetricKind::Counter,
        labels: &[],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_policy_reload_errors",
        help: "Reloads refused; the policy in force stayed.",
        kind: MetricKind::Counter,
        labels: &[],
        unit: None,
    },
    MetricFamily {
        name: "throttlegate_backend_call_seconds",
        help: "Time of backend calls (Redis round trips).",
        kind: MetricKind::Histogram,
        labels: &[],
        unit: Some("seconds"),
    },
];

/// The values of the `outcome` label of `throttlegate_decisions`, in order
/// (each also names a [`RuleMetrics`] field).
pub const OUTCOMES: [&str; 5] = ["allowed", "denied", "shadow_denied", "degraded_allowed", "degraded_denied"];

/// A counter family's samples: each one's label values (in the order of
/// [`MetricFamily::labels`]) and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CounterSamples {
    /// The family.
    pub family: &'static MetricFamily,
    /// `(label values, value)`, rules in policy order.
    pub samples: Vec<(Vec<String>, u64)>,
}

/// One rule's counters since the limiter was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleMetrics {
    /// The rule's name.
    pub rule: RuleName,
    /// Checks and peeks the rule applied to (degraded ones included).
    pub checks: u64,
    /// The rule admitted the request (its own verdict; a shadow rule's too).
    pub allowed: u64,
    /// The rule refused the request.
    pub denied: u64,
    /// The rule is in shadow mode and would have refused the request.
    pub shadow_denied: u64,
    /// The backend failed and the failure policy admitted the request.
    pub degraded_allowed: u64,
    /// The backend failed and the failure policy refused the request.
    pub degraded_denied: u64,
    /// The backend failed and the error was returned (`on_backend_error = error`).
    pub backend_errors: u64,
    /// The backend did not answer within the timeout (counted also as degraded or error).
    pub timeouts: u64,
    /// Checks settled ([`crate::Limiter::settle`], [`crate::Limiter::settle_call`]) on this rule.
    pub settles: u64,
    /// Units settles gave back on this rule (the check's cost less the
    /// actual cost, capped at the rule's limit).
    pub settle_refunded: u64,
    /// Units settles took on this rule beyond the check's cost.
    pub settle_debited: u64,
}

impl RuleMetrics {
    /// Every counter with its name (the names every front end uses), in
    /// declaration order.
    pub fn fields(&self) -> [(&'static str, u64); 11] {
        [
            ("checks", self.checks),
            ("allowed", self.allowed),
            ("denied", self.denied),
            ("shadow_denied", self.shadow_denied),
            ("degraded_allowed", self.degraded_allowed),
            ("degraded_denied", self.degraded_denied),
            ("backend_errors", self.backend_errors),
            ("timeouts", self.timeouts),
            ("settles", self.settles),
            ("settle_refunded", self.settle_refunded),
            ("settle_debited", self.settle_debited),
        ]
    }

    /// The decision outcomes with their label values, in the order of [`OUTCOMES`].
    pub fn outcomes(&self) -> [(&'static str, u64); 5] {
        let values = [self.allowed, self.denied, self.shadow_denied, self.degraded_allowed, self.degraded_denied];
        let mut out = [("", 0); 5];
        for (o, (name, value)) in out.iter_mut().zip(OUTCOMES.into_iter().zip(values)) {
            *o = (name, value);
        }
        out
    }
}

/// One reserved rule's reservation counters since the limiter was made (a
/// rule with `reserve`, on a network backend; see docs/concepts/reserve.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleReserveMetrics {
    /// The rule's name.
    pub rule: RuleName,
    /// Checks and peeks on the rule that went to the backend (each in one script run).
    pub trips: u64,
    /// Checks the rule answered from this limiter's reservation.
    pub local: u64,
    /// Units reserved from the backend.
    pub reserved: u64,
    /// Units given back unspent.
    pub returned: u64,
    /// Units dropped unspent.
    pub dropped: u64,
}

/// The latency of backend calls (Redis round trips; the embedded backend
/// answers in process and is not timed).
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyHistogram {
    /// `(upper bound in seconds, calls at or under it)` for each of
    /// [`LATENCY_BUCKETS`]: cumulative, as Prometheus counts them.
    pub buckets: Vec<(f64, u64)>,
    /// Calls timed (answered or failed).
    pub count: u64,
    /// Their total time, in seconds.
    pub sum_seconds: f64,
}

/// A limiter's metrics: see [`crate::Limiter::metrics`].
#[derive(Debug, Clone, PartialEq)]
pub struct Metrics {
    /// One entry per rule, in policy order.
    pub rules: Vec<RuleMetrics>,
    /// One entry per reserved rule (`reserve`), in policy order.
    pub reserves: Vec<RuleReserveMetrics>,
    /// The backend calls' latency.
    pub backend_latency: LatencyHistogram,
    /// Policies applied by [`crate::Limiter::reload`] or `reload_on_change`.
    pub reloads: u64,
    /// Reloads refused (a policy that did not parse or could not replace
    /// the current one); see [`crate::Limiter::reload_status`].
    pub reload_errors: u64,
}

impl Metrics {
    /// The OpenMetrics text exposition (served as [`METRICS_CONTENT_TYPE`]):
    /// `throttlegate_checks_total{rule}`,
    /// `throttlegate_decisions_total{rule,outcome}`,
    /// `throttlegate_backend_errors_total{rule}`,
    /// `throttlegate_timeouts_total{rule}`,
    /// `throttlegate_settles_total{rule}`,
    /// `throttlegate_settle_refunded_total{rule}`,
    /// `throttlegate_settle_debited_total{rule}`,
    /// `throttlegate_reserve_trips_total{rule}`,
    /// `throttlegate_reserve_local_total{rule}`,
    /// `throttlegate_reserve_reserved_units_total{rule}`,
    /// `throttlegate_reserve_returned_units_total{rule}`,
    /// `throttlegate_reserve_dropped_units_total{rule}` (reserved rules only),
    /// `throttlegate_policy_reloads_total`,
    /// `throttlegate_policy_reload_errors_total` and the
    /// `throttlegate_backend_call_seconds` histogram, then `# EOF`. Only the
    /// current policy's rules are listed: a rule a reload removed is no
    /// longer exposed, and one that keeps its name keeps its counts.
    pub fn to_text(&self) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Snapshot(self.clone())));
        let mut out = String::new();
        // Writing to a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }

    /// The samples of every counter family of [`METRIC_FAMILIES`], in its order.
    pub fn counters(&self) -> Vec<CounterSamples> {
        METRIC_FAMILIES
            .iter()
            .filter(|f| f.kind == MetricKind::Counter)
            .map(|family| {
                let rule = |r: &RuleMetrics| r.rule.to_string();
                let per_rule =
                    |value: fn(&RuleMetrics) -> u64| self.rules.iter().map(|r| (vec![rule(r)], value(r))).collect();
                let per_reserved = |value: fn(&RuleReserveMetrics) -> u64| {
                    self.reserves.iter().map(|r| (vec![r.rule.to_string()], value(r))).collect()
                };
                let samples = match family.name {
                    "throttlegate_checks" => per_rule(|r| r.checks),
                    "throttlegate_decisions" => self
                        .rules
                        .iter()
                        .flat_map(|r| r.outcomes().map(|(o, n)| (vec![rule(r), o.to_string()], n)))
                        .collect(),
                    "throttlegate_backend_errors" => per_rule(|r| r.backend_errors),
                    "throttlegate_timeouts" => per_rule(|r| r.timeouts),
                    "throttlegate_settles" => per_rule(|r| r.settles),
                    "throttlegate_settle_refunded" => per_rule(|r| r.settle_refunded),
                    "throttlegate_settle_debited" => per_rule(|r| r.settle_debited),
                    "throttlegate_reserve_trips" => per_reserved(|r| r.trips),
                    "throttlegate_reserve_local" => per_reserved(|r| r.local),
                    "throttlegate_reserve_reserved_units" => per_reserved(|r| r.reserved),
                    "throttlegate_reserve_returned_units" => per_reserved(|r| r.returned),
                    "throttlegate_reserve_dropped_units" => per_reserved(|r| r.dropped),
                    "throttlegate_policy_reloads" => vec![(vec![], self.reloads)],
                    "throttlegate_policy_reload_errors" => vec![(vec![], self.reload_errors)],
                    other => unreachable!("no counter family {other}"),
                };
                CounterSamples { family, samples }
            })
            .collect()
    }

    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        for c in self.counters() {
            let mut family = encoder.encode_descriptor(c.family.name, c.family.help, None, MetricType::Counter)?;
            for (values, n) in &c.samples {
                if c.family.labels.is_empty() {
                    // No label set at all (`name_total 3`, not `name_total{} 3`).
                    ConstCounter::new(*n).encode(family)?;
                    break;
                }
                let labels: Vec<(&str, &str)> =
                    c.family.labels.iter().copied().zip(values.iter().map(String::as_str)).collect();
                ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
            }
        }
        let h = &self.backend_latency;
        // The encoder takes each bucket's own calls and sums them; the last
        // bucket, `+Inf`, holds every call.
        let mut below = 0;
        let mut buckets: Vec<(f64, u64)> = h
            .buckets
            .iter()
            .map(|&(bound, cumulative)| (bound, cumulative - std::mem::replace(&mut below, cumulative)))
            .collect();
        buckets.push((f64::MAX, h.count - below));
        let histogram = &METRIC_FAMILIES[METRIC_FAMILIES.len() - 1];
        debug_assert_eq!((histogram.kind, histogram.unit), (MetricKind::Histogram, Some("seconds")));
        // The encoder appends the unit to the name itself.
        let name = histogram.name.trim_end_matches("_seconds");
        let mut family = encoder.encode_descriptor(name, histogram.help, Some(&Unit::Seconds), MetricType::Histogram)?;
        family.encode_histogram::<NoLabelSet>(h.sum_seconds, h.count, &buckets, None)
    }
}

/// Metrics read at one moment, as `prometheus-client` encodes them.
#[derive(Debug)]
struct Snapshot(Metrics);

impl Collector for Snapshot {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        self.0.encode(encoder)
    }
}

/// One rule's atomics in one stripe (a check is one of the outcomes or a
/// returned error, so `checks` is their sum: one addition per rule).
#[derive(Default)]
#[repr(align(64))]
struct RuleCells {
    allowed: AtomicU64,
    denied: AtomicU64,
    shadow_denied: AtomicU64,
    degraded_allowed: AtomicU64,
    degraded_denied: AtomicU64,
    backend_errors: AtomicU64,
    timeouts: AtomicU64,
    settles: AtomicU64,
    settle_refunded: AtomicU64,
    settle_debited: AtomicU64,
    reserve_trips: AtomicU64,
    reserve_local: AtomicU64,
    reserve_reserved: AtomicU64,
    reserve_returned: AtomicU64,
    reserve_dropped: AtomicU64,
}

/// The backend latency histogram's atomics.
#[derive(Default)]
struct Latency {
    /// Calls at or under each bucket's bound (not cumulative), then above the last.
    buckets: [AtomicU64; LATENCY_BUCKETS.len() + 1],
    micros: AtomicU64,
}

/// What the limiter counts per rule (when metrics are on), for one policy:
/// a reload makes a new one that shares the cells of the rules it keeps by
/// name ([`RuleCounters::carried`]), so their counters go on.
pub(crate) struct RuleCounters {
    names: Vec<RuleName>,
    /// Which rules are reserved (`reserve`), in the same order.
    reserved: Vec<bool>,
    /// Per rule, `STRIPES` cells.
    cells: Vec<Arc<[RuleCells]>>,
    latency: Arc<Latency>,
}

fn fresh_cells() -> Arc<[RuleCells]> {
    (0..STRIPES).map(|_| RuleCells::default()).collect()
}

fn add(a: &AtomicU64) {
    a.fetch_add(1, Ordering::Relaxed);
}

impl RuleCounters {
    pub fn new(names: Vec<RuleName>) -> RuleCounters {
        let cells = names.iter().map(|_| fresh_cells()).collect();
        RuleCounters { reserved: vec![false; names.len()], names, cells, latency: Default::default() }
    }

    /// The counters of a reloaded policy with rules `names`: a rule whose
    /// name was here keeps its cells (its counters go on, also for checks
    /// still running on the old policy), a new one starts at zero, and the
    /// latency histogram is shared.
    pub fn carried(&self, names: Vec<RuleName>) -> RuleCounters {
        let cells = names
            .iter()
            .map(|n| match self.names.iter().position(|o| o == n) {
                Some(i) => Arc::clone(&self.cells[i]),
                None => fresh_cells(),
            })
            .collect();
        RuleCounters { reserved: vec![false; names.len()], names, cells, latency: Arc::clone(&self.latency) }
    }

    /// These counters with the reserved rules marked (`reserved[i]` for rule i).
    pub fn with_reserved(mut self, reserved: Vec<bool>) -> RuleCounters {
        self.reserved = reserved;
        self
    }

    /// Count `n` of a reserved rule's reservation counter `what`.
    pub fn reserve_count(&self, rule: RuleName, what: super::reserve::ReserveCount, n: u64) {
        use super::reserve::ReserveCount;
        let Some(i) = self.names.iter().position(|r| *r == rule) else { return };
        let s = stripe();
        let c = &self.cells[i][s.index];
        let cell = match what {
            ReserveCount::Trips => &c.reserve_trips,
            ReserveCount::Local => &c.reserve_local,
            ReserveCount::Reserved => &c.reserve_reserved,
            ReserveCount::Returned => &c.reserve_returned,
            ReserveCount::Dropped => &c.reserve_dropped,
        };
        s.add(cell, n);
    }

    fn cells(&self, index: usize, s: StripeRef) -> Option<&RuleCells> {
        self.cells.get(index).map(|c| &c[s.index])
    }

    /// Count each rule's result of a decision (`degraded`: from the failure
    /// policy) in this thread's stripe `s`.
    pub fn count(&self, s: StripeRef, results: &[RuleResult], degraded: bool) {
        for r in results {
            let Some(c) = self.cells(r.index, s) else { continue };
            s.add(match (degraded, r.allowed, r.shadow) {
                (true, true, _) => &c.degraded_allowed,
                (true, false, _) => &c.degraded_denied,
                (false, true, _) => &c.allowed,
                (false, false, false) => &c.denied,
                (false, false, true) => &c.shadow_denied,
            }, 1);
        }
    }

    /// Count a backend failure returned as an error, or a timeout, for the rules of a call.
    pub fn failed(&self, rules: impl Iterator<Item = usize>, timeout: bool, returned: bool) {
        let s = stripe();
        for index in rules {
            let Some(c) = self.cells(index, s) else { continue };
            if returned {
                s.add(&c.backend_errors, 1);
            }
            if timeout {
                s.add(&c.timeouts, 1);
            }
        }
    }

    /// Count a settle that corrected the rule at `index`: `refunded` units
    /// given back, `debited` taken beyond the check's cost.
    pub fn settled(&self, index: usize, refunded: u64, debited: u64) {
        let s = stripe();
        let Some(c) = self.cells(index, s) else { return };
        s.add(&c.settles, 1);
        s.add(&c.settle_refunded, refunded);
        s.add(&c.settle_debited, debited);
    }

    /// Time one backend call.
    pub fn observe(&self, took: Duration) {
        let secs = took.as_secs_f64();
        let bucket = LATENCY_BUCKETS.iter().position(|&b| secs <= b).unwrap_or(LATENCY_BUCKETS.len());
        add(&self.latency.buckets[bucket]);
        self.latency.micros.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    pub fn read(&self) -> Metrics {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let rules = self
            .names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let sum = |f: fn(&RuleCells) -> &AtomicU64| self.cells[i].iter().map(|c| get(f(c))).sum();
                let mut m = RuleMetrics {
                    rule: *name,
                    checks: 0,
                    allowed: sum(|c| &c.allowed),
                    denied: sum(|c| &c.denied),
                    shadow_denied: sum(|c| &c.shadow_denied),
                    degraded_allowed: sum(|c| &c.degraded_allowed),
                    degraded_denied: sum(|c| &c.degraded_denied),
                    backend_errors: sum(|c| &c.backend_errors),
                    timeouts: sum(|c| &c.timeouts),
                    settles: sum(|c| &c.settles),
                    settle_refunded: sum(|c| &c.settle_refunded),
                    settle_debited: sum(|c| &c.settle_debited),
                };
                m.checks = m.allowed + m.denied + m.shadow_denied + m.degraded_allowed + m.degraded_denied + m.backend_errors;
                m
            })
            .collect();
        let mut cumulative = 0;
        let buckets = LATENCY_BUCKETS
            .iter()
            .zip(&self.latency.buckets)
            .map(|(&bound, a)| {
                cumulative += get(a);
                (bound, cumulative)
            })
            .collect();
        let count = cumulative + get(&self.latency.buckets[LATENCY_BUCKETS.len()]);
        let sum_seconds = get(&self.latency.micros) as f64 / 1e6;
        let reserves = self
            .names
            .iter()
            .enumerate()
            .filter(|(i, _)| self.reserved.get(*i).copied().unwrap_or(false))
            .map(|(i, name)| {
                let sum = |f: fn(&RuleCells) -> &AtomicU64| self.cells[i].iter().map(|c| get(f(c))).sum();
                RuleReserveMetrics {
                    rule: *name,
                    trips: sum(|c| &c.reserve_trips),
                    local: sum(|c| &c.reserve_local),
                    reserved: sum(|c| &c.reserve_reserved),
                    returned: sum(|c| &c.reserve_returned),
                    dropped: sum(|c| &c.reserve_dropped),
                }
            })
            .collect();
        Metrics {
            rules,
            reserves,
            backend_latency: LatencyHistogram { buckets, count, sum_seconds },
            reloads: 0,
            reload_errors: 0,
        }
    }
}

impl std::fmt::Display for Metrics {
    /// The same as [`Metrics::to_text`].
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(index: usize, allowed: bool, shadow: bool) -> RuleResult {
        RuleResult {
            rule: RuleName::from(["a", "b"][index]),
            index,
            allowed,
            shadow,
            limit: 1,
            remaining: 0,
            retry_after: Duration::ZERO,
            reset_after: Duration::ZERO,
            window: Duration::from_secs(1),
        }
    }

    #[test]
    fn outcomes_per_rule_and_the_text_exposition() {
        let c = RuleCounters::new(vec![RuleName::from("a"), RuleName::from("b")]);
        c.count(stripe(), &[result(0, true, false), result(1, false, true)], false);
        c.count(stripe(), &[result(0, false, false)], false);
        c.count(stripe(), &[result(0, true, false)], true);
        c.failed([0, 1].into_iter(), true, true);
        c.observe(Duration::from_micros(700));
        c.settled(1, 3, 0);
        c.settled(1, 0, 2);
        let m = c.read();
        assert_eq!((m.rules[1].settles, m.rules[1].settle_refunded, m.rules[1].settle_debited), (2, 3, 2));
        assert_eq!(m.rules[0].settles, 0);
        assert_eq!((m.rules[0].checks, m.rules[0].allowed, m.rules[0].denied, m.rules[0].degraded_allowed), (4, 1, 1, 1));
        assert_eq!((m.rules[1].checks, m.rules[1].shadow_denied, m.rules[1].backend_errors, m.rules[1].timeouts), (2, 1, 1, 1));
        assert_eq!(m.backend_latency.count, 1);
        assert_eq!(m.backend_latency.buckets[2], (0.0005, 0));
        assert_eq!(m.backend_latency.buckets[3], (0.001, 1));
        let text = m.to_text();
        for line in [
            "# TYPE throttlegate_checks counter",
            "throttlegate_checks_total{rule=\"a\"} 4",
            "throttlegate_decisions_total{rule=\"b\",outcome=\"shadow_denied\"} 1",
            "throttlegate_backend_errors_total{rule=\"b\"} 1",
            "throttlegate_policy_reloads_total 0",
            "throttlegate_settles_total{rule=\"b\"} 2",
            "throttlegate_settle_refunded_total{rule=\"b\"} 3",
            "throttlegate_settle_debited_total{rule=\"a\"} 0",
            "# UNIT throttlegate_backend_call_seconds seconds",
            "throttlegate_backend_call_seconds_bucket{le=\"0.001\"} 1",
            "throttlegate_backend_call_seconds_count 1",
            "throttlegate_backend_call_seconds_bucket{le=\"+Inf\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
        // Every family of the list is in the text, with its help and type.
        for f in METRIC_FAMILIES {
            let help = format!("# HELP {} {}", f.name, f.help);
            let kind = format!("# TYPE {} {}", f.name, f.kind.as_str());
            assert!(text.lines().any(|l| l == help), "missing {help:?}");
            assert!(text.lines().any(|l| l == kind), "missing {kind:?}");
        }
        let counters = m.counters();
        assert_eq!(counters.len(), 14);
        assert_eq!(counters[12].samples, [(vec![], 0)]);
        // No rule is reserved: the reservation families have no samples.
        assert!(counters[7..12].iter().all(|c| c.samples.is_empty()));
        let decisions = &counters[1];
        assert_eq!(decisions.family.labels, ["rule", "outcome"]);
        assert_eq!(decisions.samples.len(), 2 * OUTCOMES.len());
        assert_eq!(decisions.samples[1], (vec!["a".to_string(), "denied".to_string()], 1));
        assert_eq!(m.rules[1].outcomes().map(|(o, _)| o), OUTCOMES);
    }
}

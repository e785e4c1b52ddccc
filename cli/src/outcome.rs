//! The result of a simulation, as data: what one policy did to the
//! traffic ([`Report`]) and the words both the printed report and the HTML
//! page (`--report`) use for it. `simulate` fills it; `report` only reads it.

use std::collections::HashMap;
use std::time::Duration;

use throttlegate::duration::format_duration;
use throttlegate::Algorithm;

/// Requests allowed and denied (by a rule, or by the whole policy).
#[derive(Debug, Clone, Default)]
pub(crate) struct Counts {
    pub allowed: u64,
    pub denied: u64,
    /// Shadow rules: denials of requests the policy admitted.
    pub would_deny_admitted: u64,
}

/// One rule over the whole run.
#[derive(Debug, Clone, Default)]
pub(crate) struct RuleTotals {
    pub applied: u64,
    pub allowed: u64,
    pub denied: u64,
    /// Denials where this rule was the headline (most restrictive) rule.
    pub caused: u64,
    /// Shadow rules: would have denied a request that was admitted.
    pub would_deny_admitted: u64,
}

/// One interval of the run: the policy's decisions and each rule's.
#[derive(Debug, Clone, Default)]
pub(crate) struct Interval {
    pub total: Counts,
    /// In policy order.
    pub rules: Vec<Counts>,
}

/// One client (in one phase) over the whole run.
#[derive(Debug, Clone, Default)]
pub(crate) struct ClientTotals {
    pub requests: u64,
    pub denied: u64,
    /// Its fixed attributes (`ip=10.0.0.3 api_key=api_key-3`).
    pub label: String,
}

/// What one policy did to the traffic.
pub(crate) struct Report {
    pub interval: Duration,
    pub intervals: Vec<Interval>,
    pub rules: Vec<RuleTotals>,
    pub phases: Vec<Counts>,
    pub clients: HashMap<(usize, u64), ClientTotals>,
    pub total: Counts,
}

/// A rule's algorithm in a few words (`10 per 1m`, `bucket 5, +1/s`).
pub(crate) fn algorithm_text(a: &Algorithm) -> String {
    match *a {
        Algorithm::SlidingWindowLog { limit, window } => {
            format!("{limit} per {}", format_duration(window))
        }
        Algorithm::TokenBucket {
            capacity,
            refill_rate,
        } => format!("bucket {capacity}, +{refill_rate}/s"),
        Algorithm::SlidingWindow { limit, window, precision } => {
            format!("{limit} per {} (counted per {})", format_duration(window), format_duration(precision))
        }
        Algorithm::FixedWindow { limit, window } => {
            format!("{limit} per fixed {}", format_duration(window))
        }
        Algorithm::Quota { limit, period, utc_offset_minutes } => {
            format!("{limit} per {} (UTC{})", period.as_str(), throttlegate::format_utc_offset(utc_offset_minutes))
        }
        Algorithm::Concurrency { limit, lease } => {
            format!("{limit} at once (lease {})", format_duration(lease))
        }
    }
}

/// Virtual time as `h:mm:ss`.
pub(crate) fn clock_text(us: i64) -> String {
    let s = us / 1_000_000;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// `part` of `whole` as a percentage with one decimal (`-` for nothing).
pub(crate) fn pct(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", part as f64 * 100.0 / whole as f64)
    }
}

/// The `n` clients with the most denials (ties by phase and client number).
pub(crate) fn top_clients(report: &Report, n: usize) -> Vec<(&(usize, u64), &ClientTotals)> {
    let mut v: Vec<_> = report
        .clients
        .iter()
        .filter(|(_, c)| c.denied > 0)
        .collect();
    v.sort_by(|a, b| b.1.denied.cmp(&a.1.denied).then(a.0.cmp(b.0)));
    v.truncate(n);
    v
}

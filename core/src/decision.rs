//! Decisions, per-rule results, "most restrictive" selection and HTTP headers.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// A rule's name as decisions carry it: a plain copyable reference to a
/// string interned once per distinct name, so building a decision touches
/// no reference count (an atomic operation on a shared cache line, which
/// costs more than the rest of an in-process check when threads share a
/// limiter). Reads like a `&str`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleName(&'static str);

impl RuleName {
    /// The name `name`, interned (each distinct name is stored once for the
    /// life of the process; names come from policies, so they are few).
    pub fn new(name: &str) -> RuleName {
        // A B-tree, not a hash set: its nodes are found from their starts, so
        // leak checkers see the names as reachable, not as possibly lost.
        static NAMES: OnceLock<Mutex<BTreeSet<&'static str>>> = OnceLock::new();
        let mut names = NAMES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(&known) = names.get(name) {
            return RuleName(known);
        }
        let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
        names.insert(leaked);
        RuleName(leaked)
    }

    /// The name.
    pub fn as_str(&self) -> &'static str {
        self.0
    }
}

impl std::ops::Deref for RuleName {
    type Target = str;
    fn deref(&self) -> &str {
        self.0
    }
}

impl AsRef<str> for RuleName {
    fn as_ref(&self) -> &str {
        self.0
    }
}

impl std::borrow::Borrow<str> for RuleName {
    fn borrow(&self) -> &str {
        self.0
    }
}

impl std::fmt::Debug for RuleName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self.0, f)
    }
}

impl std::fmt::Display for RuleName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl From<&str> for RuleName {
    fn from(name: &str) -> RuleName {
        RuleName::new(name)
    }
}

impl From<&String> for RuleName {
    fn from(name: &String) -> RuleName {
        RuleName::new(name)
    }
}

impl From<String> for RuleName {
    fn from(name: String) -> RuleName {
        RuleName::new(&name)
    }
}

impl From<Arc<str>> for RuleName {
    fn from(name: Arc<str>) -> RuleName {
        RuleName::new(&name)
    }
}

impl PartialEq<str> for RuleName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for RuleName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl serde::Serialize for RuleName {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.0)
    }
}

/// The outcome of one rule for one check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleResult {
    /// The rule's name.
    pub rule: RuleName,
    /// The rule's position in the policy (0 for the first rule).
    pub index: usize,
    /// Whether this rule admits the request (for a shadow rule: would admit).
    pub allowed: bool,
    /// The rule is in shadow mode: reported, never the cause of a denial.
    pub shadow: bool,
    /// The rule's `limit` (windows and quotas) or `capacity` (token bucket).
    pub limit: u64,
    /// Units left (floor for buckets): for a rule that admits, what is left
    /// once this request's cost is taken (also when another rule denied the
    /// request and nothing was taken, so every front end and backend reports
    /// the same figure); for a rule that denies, what is left now.
    pub remaining: u64,
    /// How long until a request of the same cost would pass this rule (zero when allowed).
    pub retry_after: Duration,
    /// How long until the rule's state is back to full (log or counters empty,
    /// bucket full, the fixed window's or quota's period over).
    pub reset_after: Duration,
    /// The window advertised in headers (`w`): the window, the time a bucket
    /// takes to refill, or a quota's longest period.
    pub window: Duration,
}

/// The per-rule results of a decision, in policy order: a list that keeps
/// one result inline (the commonest policy has one rule applying).
pub type RuleResults = smallvec::SmallVec<[RuleResult; 1]>;

/// The answer to one check: allowed or not, with the most restrictive rule's
/// figures as the headline and every applied rule's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Whether the request is admitted.
    pub allowed: bool,
    /// The headline rule's limit (0 when no rule applied).
    pub limit: u64,
    /// The headline rule's remaining units.
    pub remaining: u64,
    /// When denied, the longest wait among the denying rules; zero when allowed.
    pub retry_after: Duration,
    /// The headline rule's time until it is back to full.
    pub reset_after: Duration,
    /// The most restrictive rule's name; `None` when no (non-shadow) rule applied.
    pub rule: Option<RuleName>,
    /// One result per applied rule, in policy order (shadow rules included).
    /// A decision of one rule keeps its result inline: no allocation.
    pub results: RuleResults,
    /// True when the answer came from the failure policy (`on_backend_error`),
    /// not from the backend.
    pub degraded: bool,
    /// What [`Limiter::settle`](crate::Limiter::settle) needs to settle this
    /// decision's check: set on an admitted check made with a call id (not
    /// degraded), `None` otherwise.
    pub settle: Option<Arc<SettleTicket>>,
    /// What [`Limiter::release`](crate::Limiter::release) and
    /// [`Limiter::extend`](crate::Limiter::extend) need: set on an admitted
    /// check (not degraded) that took slots of a concurrency rule, `None`
    /// otherwise (a denied decision holds nothing).
    pub lease: Option<Arc<LeaseTicket>>,
}

/// The slots an admitted check holds: its lease id, and the keys and rules
/// of the concurrency rules it took slots from.
#[derive(Debug, PartialEq, Eq)]
pub struct LeaseTicket {
    pub(crate) lease_id: String,
    pub(crate) keys: Vec<String>,
    /// The rules' places in the policy and names, one per key.
    pub(crate) rules: Vec<((usize, Option<usize>), RuleName)>,
}

impl LeaseTicket {
    /// The lease id the slots are held under: the check's call id when it
    /// had one, else one the limiter made (32 hex digits, 128 random bits).
    pub fn lease_id(&self) -> &str {
        &self.lease_id
    }
}

/// The check behind an admitted decision, as a settle needs it: its call id,
/// its cost (the estimate), and the keys and rules it was decided on.
#[derive(Debug, PartialEq, Eq)]
pub struct SettleTicket {
    pub(crate) call_id: String,
    pub(crate) cost: u64,
    pub(crate) keys: Vec<String>,
    /// The rules' places in the policy (position and tier, as the plan
    /// locates them) and names, one per key.
    pub(crate) rules: Vec<((usize, Option<usize>), RuleName)>,
}

impl SettleTicket {
    /// The check's call id.
    pub fn call_id(&self) -> &str {
        &self.call_id
    }

    /// The cost the check was made with (the estimate a settle corrects).
    pub fn cost(&self) -> u64 {
        self.cost
    }
}

/// Ceiling of a duration in whole seconds.
pub fn ceil_secs(d: Duration) -> u64 {
    let us = d.as_micros() as u64;
    us.div_ceil(1_000_000)
}

/// Ceiling of a duration in whole milliseconds.
pub fn ceil_millis(d: Duration) -> u64 {
    let us = d.as_micros() as u64;
    us.div_ceil(1_000)
}

/// Options of the header computation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeaderOptions {
    /// Also emit `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset`.
    pub legacy: bool,
}

impl Decision {
    /// Build a decision from per-rule results (policy order): pick the most
    /// restrictive non-shadow rule as the headline.
    ///
    /// Denied: the denying rule with the longest `retry_after` (ties: policy
    /// order). Allowed: the rule with the fewest `remaining` (ties: the shortest
    /// `reset_after`, then policy order).
    pub fn from_results(results: impl Into<RuleResults>, degraded: bool) -> Decision {
        let results = results.into();
        if let [one] = &results[..] {
            return Self::from_one(one.clone(), degraded);
        }
        Self::from_many(results, degraded)
    }

    /// [`Decision::from_results`] of a single result (the commonest
    /// decision): the same figures, without the search for the headline.
    pub(crate) fn from_one(r: RuleResult, degraded: bool) -> Decision {
        let (allowed, limit, remaining, retry_after, reset_after, rule) = if r.shadow {
            (true, 0, 0, Duration::ZERO, Duration::ZERO, None)
        } else {
            let retry_after = if r.allowed { Duration::ZERO } else { r.retry_after };
            (r.allowed, r.limit, r.remaining, retry_after, r.reset_after, Some(r.rule))
        };
        Decision {
            allowed,
            limit,
            remaining,
            retry_after,
            reset_after,
            rule,
            results: RuleResults::from_buf([r]),
            degraded,
            settle: None,
            lease: None,
        }
    }

    fn from_many(results: RuleResults, degraded: bool) -> Decision {
        let live = || results.iter().filter(|r| !r.shadow);
        let allowed = live().all(|r| r.allowed);
        let mut head: Option<&RuleResult> = None;
        for r in live() {
            if !allowed && r.allowed {
                continue;
            }
            let better = match head {
                None => true,
                Some(h) if !allowed => r.retry_after > h.retry_after,
                Some(h) => {
                    (r.remaining, r.reset_after) < (h.remaining, h.reset_after)
                }
            };
            if better {
                head = Some(r);
            }
        }
        let (limit, remaining, retry_after, reset_after, rule) = match head {
            Some(h) => (
                h.limit,
                h.remaining,
                if allowed { Duration::ZERO } else { h.retry_after },
                h.reset_after,
                Some(h.rule),
            ),
            None => (0, 0, Duration::ZERO, Duration::ZERO, None),
        };
        Decision {
            allowed,
            limit,
            remaining,
            retry_after,
            reset_after,
            rule,
            results,
            degraded,
            settle: None,
            lease: None,
        }
    }

    /// The lease id this decision's slots are held under, when it holds
    /// slots of a concurrency rule (see [`LeaseTicket::lease_id`]).
    pub fn lease_id(&self) -> Option<&str> {
        self.lease.as_deref().map(LeaseTicket::lease_id)
    }

    /// The decision when no rule applies: admitted, nothing to report.
    pub fn unlimited() -> Decision {
        Decision::from_results(RuleResults::new(), false)
    }

    /// `retry_after` in whole milliseconds, rounded up.
    pub fn retry_after_ms(&self) -> u64 {
        ceil_millis(self.retry_after)
    }

    /// `reset_after` in whole milliseconds, rounded up.
    pub fn reset_after_ms(&self) -> u64 {
        ceil_millis(self.reset_after)
    }

    /// The HTTP headers for this decision, with the default options.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        self.headers_with(HeaderOptions::default())
    }

    /// The HTTP headers for this decision, identical bytes in every language.
    ///
    /// - `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset` (seconds,
    ///   rounded up) from the headline rule;
    /// - `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-11)
    ///   with one named entry per applied, non-shadow rule;
    /// - `Retry-After` on a denial: the longest wait among the denying rules,
    ///   in whole seconds rounded up, at least 1;
    /// - with `legacy`, `X-RateLimit-*` copies of the first three.
    ///
    /// No header at all when no rule applied. A [degraded](Decision::degraded)
    /// decision was made without reading any count, so it claims none: it
    /// has `RateLimit-Limit` and `RateLimit-Policy` (the policy, which is
    /// known), `Retry-After` on a denial and, with `legacy`,
    /// `X-RateLimit-Limit`; never `RateLimit-Remaining`, `RateLimit-Reset`,
    /// `RateLimit` or their `X-` copies.
    pub fn headers_with(&self, options: HeaderOptions) -> Vec<(&'static str, String)> {
        let mut out = Vec::with_capacity(8);
        if self.rule.is_none() {
            return out;
        }
        if self.degraded {
            out.push(("RateLimit-Limit", self.limit.to_string()));
            out.push(("RateLimit-Policy", self.policy_header()));
            if !self.allowed {
                out.push(("Retry-After", ceil_secs(self.retry_after).max(1).to_string()));
            }
            if options.legacy {
                out.push(("X-RateLimit-Limit", self.limit.to_string()));
            }
            return out;
        }
        let reset = ceil_secs(self.reset_after).to_string();
        out.push(("RateLimit-Limit", self.limit.to_string()));
        out.push(("RateLimit-Remaining", self.remaining.to_string()));
        out.push(("RateLimit-Reset", reset.clone()));
        let mut policy = String::new();
        let mut current = String::new();
        for r in self.results.iter().filter(|r| !r.shadow) {
            if !policy.is_empty() {
                policy.push_str(", ");
                current.push_str(", ");
            }
            let _ = write!(
                policy,
                "\"{}\";q={};w={}",
                r.rule,
                r.limit,
                ceil_secs(r.window).max(1)
            );
            let _ = write!(
                current,
                "\"{}\";r={};t={}",
                r.rule,
                r.remaining,
                ceil_secs(r.reset_after)
            );
        }
        out.push(("RateLimit-Policy", policy));
        out.push(("RateLimit", current));
        if !self.allowed {
            out.push(("Retry-After", ceil_secs(self.retry_after).max(1).to_string()));
        }
        if options.legacy {
            out.push(("X-RateLimit-Limit", self.limit.to_string()));
            out.push(("X-RateLimit-Remaining", self.remaining.to_string()));
            out.push(("X-RateLimit-Reset", reset));
        }
        out
    }

    /// The `RateLimit-Policy` header's value: one entry per applied,
    /// non-shadow rule.
    fn policy_header(&self) -> String {
        let mut policy = String::new();
        for r in self.results.iter().filter(|r| !r.shadow) {
            if !policy.is_empty() {
                policy.push_str(", ");
            }
            let _ = write!(policy, "\"{}\";q={};w={}", r.rule, r.limit, ceil_secs(r.window).max(1));
        }
        policy
    }

    /// The decision as JSON in the conformance-vector format
    /// (`tests/vectors/README.md`): times in milliseconds rounded up, the
    /// per-rule results, and the headers as ordered `[name, value]` pairs.
    pub fn to_json(&self, options: HeaderOptions) -> serde_json::Value {
        let results: Vec<serde_json::Value> = self
            .results
            .iter()
            .map(|r| {
                serde_json::json!({
                    "rule": &*r.rule,
                    "allowed": r.allowed,
                    "shadow": r.shadow,
                    "limit": r.limit,
                    "remaining": r.remaining,
                    "retry_after_ms": ceil_millis(r.retry_after),
                    "reset_after_ms": ceil_millis(r.reset_after),
                })
            })
            .collect();
        let headers: Vec<serde_json::Value> = self
            .headers_with(options)
            .into_iter()
            .map(|(k, v)| serde_json::json!([k, v]))
            .collect();
        serde_json::json!({
            "allowed": self.allowed,
            "limit": self.limit,
            "remaining": self.remaining,
            "retry_after_ms": self.retry_after_ms(),
            "reset_after_ms": self.reset_after_ms(),
            "rule": self.rule.as_deref(),
            "results": results,
            "headers": headers,
        })
    }

    /// The rules that denied this request (non-shadow), in policy order.
    pub fn denying_rules(&self) -> impl Iterator<Item = &RuleResult> {
        self.results.iter().filter(|r| !r.shadow && !r.allowed)
    }

    /// The headline rule's result (`None` when no non-shadow rule applied).
    pub fn headline(&self) -> Option<&RuleResult> {
        let name = self.rule?;
        self.results.iter().find(|r| r.rule == name)
    }

    /// An `application/problem+json` body (RFC 9457) for a denial, naming the
    /// violated rules; `None` when the request is allowed. Identical bytes in
    /// every language. A [degraded](Decision::degraded) denial (the failure
    /// policy's, Redis unreachable) says so: its `detail` names the failure
    /// policy instead of an exceeded limit, and it has `"degraded": true`.
    pub fn problem_json(&self) -> Option<String> {
        if self.allowed {
            return None;
        }
        let rules: Vec<&str> = self.denying_rules().map(|r| &*r.rule).collect();
        let body = if self.degraded {
            serde_json::json!({
                "type": "about:blank",
                "title": "Too Many Requests",
                "status": 429,
                "detail": format!("rate limit backend unavailable; denied by the failure policy of: {}", rules.join(", ")),
                "violated_rules": rules,
                "retry_after": ceil_secs(self.retry_after).max(1),
                "degraded": true,
            })
        } else {
            serde_json::json!({
                "type": "about:blank",
                "title": "Too Many Requests",
                "status": 429,
                "detail": format!("rate limit exceeded: {}", rules.join(", ")),
                "violated_rules": rules,
                "retry_after": ceil_secs(self.retry_after).max(1),
            })
        };
        Some(body.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_are_interned_and_read_like_str() {
        let a = RuleName::new("per-ip");
        let b: RuleName = String::from("per-ip").into();
        assert!(std::ptr::eq(a.as_str(), b.as_str()));
        assert_eq!(a, "per-ip");
        assert_eq!(format!("{a:?} {a}"), "\"per-ip\" per-ip");
        assert_eq!(serde_json::to_string(&a).unwrap(), "\"per-ip\"");
        assert_ne!(a, RuleName::new("per-key"));
    }

    fn r(name: &str, allowed: bool, remaining: u64, retry_ms: u64, reset_ms: u64) -> RuleResult {
        RuleResult {
            rule: name.into(),
            index: 0,
            allowed,
            shadow: false,
            limit: 10,
            remaining,
            retry_after: Duration::from_millis(retry_ms),
            reset_after: Duration::from_millis(reset_ms),
            window: Duration::from_secs(60),
        }
    }

    #[test]
    fn most_restrictive_when_allowed() {
        let d = Decision::from_results(vec![r("a", true, 5, 0, 900), r("b", true, 3, 0, 1000), r("c", true, 3, 0, 500)], false);
        assert!(d.allowed);
        assert_eq!(d.rule.as_deref(), Some("c"));
        let d = Decision::from_results(vec![r("a", true, 3, 0, 500), r("b", true, 3, 0, 500)], false);
        assert_eq!(d.rule.as_deref(), Some("a"));
    }

    #[test]
    fn most_restrictive_when_denied() {
        let d = Decision::from_results(vec![r("a", true, 0, 0, 10), r("b", false, 0, 2000, 3000), r("c", false, 0, 2500, 2600)], false);
        assert!(!d.allowed);
        assert_eq!(d.rule.as_deref(), Some("c"));
        assert_eq!(d.retry_after, Duration::from_millis(2500));
        let h = d.headers();
        assert!(h.contains(&("Retry-After", "3".to_string())));
    }

    #[test]
    fn shadow_never_denies() {
        let mut s = r("s", false, 0, 9000, 9000);
        s.shadow = true;
        let d = Decision::from_results(vec![r("a", true, 4, 0, 100), s], false);
        assert!(d.allowed);
        assert_eq!(d.rule.as_deref(), Some("a"));
        assert!(!d.headers().iter().any(|(_, v)| v.contains("\"s\"")));
    }

    #[test]
    fn header_bytes() {
        let d = Decision::from_results(vec![r("a", true, 4, 0, 1500), r("b", true, 9, 0, 100)], false);
        let h = d.headers_with(HeaderOptions { legacy: true });
        let expect = vec![
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "4"),
            ("RateLimit-Reset", "2"),
            ("RateLimit-Policy", "\"a\";q=10;w=60, \"b\";q=10;w=60"),
            ("RateLimit", "\"a\";r=4;t=2, \"b\";r=9;t=1"),
            ("X-RateLimit-Limit", "10"),
            ("X-RateLimit-Remaining", "4"),
            ("X-RateLimit-Reset", "2"),
        ];
        let got: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(got, expect);
        assert!(Decision::unlimited().headers().is_empty());
    }

    #[test]
    fn degraded_decisions_claim_no_count() {
        // What the failure policy answers: a full quota never read, or a denial.
        let allow = Decision::from_results(vec![r("a", true, 10, 0, 0), r("b", true, 10, 0, 0)], true);
        let got = allow.headers_with(HeaderOptions { legacy: true });
        let got: Vec<(&str, &str)> = got.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(
            got,
            vec![
                ("RateLimit-Limit", "10"),
                ("RateLimit-Policy", "\"a\";q=10;w=60, \"b\";q=10;w=60"),
                ("X-RateLimit-Limit", "10"),
            ]
        );
        assert_eq!(allow.problem_json(), None);
        let deny = Decision::from_results(vec![r("a", false, 0, 1000, 0)], true);
        let got = deny.headers();
        let got: Vec<(&str, &str)> = got.iter().map(|(k, v)| (*k, v.as_str())).collect();
        assert_eq!(got, vec![("RateLimit-Limit", "10"), ("RateLimit-Policy", "\"a\";q=10;w=60"), ("Retry-After", "1")]);
        let body: serde_json::Value = serde_json::from_str(&deny.problem_json().unwrap()).unwrap();
        assert_eq!(body["degraded"], true);
        assert_eq!(body["retry_after"], 1);
        assert_eq!(body["violated_rules"], serde_json::json!(["a"]));
        // A decision read from Redis has no such field.
        let counted = Decision::from_results(vec![r("a", false, 0, 1000, 0)], false);
        assert!(!counted.problem_json().unwrap().contains("degraded"));
    }
}

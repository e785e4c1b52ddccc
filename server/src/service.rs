//! What a request becomes: the descriptors of a `RateLimitRequest` mapped
//! onto the attributes of the rules in force and checked in one stacked,
//! all-or-nothing call of the core's [`Limiter`], and the decision turned
//! back into the RLS answer. Nothing is decided here that the core does not
//! decide, except envoyproxy/ratelimit's descriptor matching (which limit a
//! descriptor reaches), `unlimited` and `requests_per_unit: 0`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use smallvec::SmallVec;
use throttlegate::{CheckItem, Decision, ErrorKind, Limiter, RuleResult};

use crate::rls::{code, DescriptorStatus, HeaderValue, RateLimit, RateLimitRequest, RateLimitResponse};
use crate::rules::{unit_of_window, Format, Limit, Rules};

/// Why a request was refused before any check: a message naming what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

/// A failed check: bad input, or the backend's failure (with `on_backend_error = "error"`).
#[derive(Debug)]
pub enum CheckError {
    /// The request is malformed (gRPC `INVALID_ARGUMENT`, HTTP 400).
    BadRequest(String),
    /// The backend failed (gRPC `UNAVAILABLE`, HTTP 503).
    Unavailable(String),
    /// Anything else the core reported (gRPC `INTERNAL`, HTTP 500).
    Internal(String),
}

impl From<throttlegate::Error> for CheckError {
    fn from(e: throttlegate::Error) -> CheckError {
        match e.kind() {
            ErrorKind::InvalidArgument => CheckError::BadRequest(e.message().to_string()),
            k if k.is_backend_failure() => CheckError::Unavailable(e.to_string()),
            ErrorKind::Closed => CheckError::Unavailable(e.to_string()),
            _ => CheckError::Internal(e.to_string()),
        }
    }
}

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 1024;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 64;
/// The longest key or value of an entry, and the longest domain, in bytes.
pub const MAX_VALUE_LEN: usize = 4096;
/// Per-domain request counts are kept for at most this many domains (the
/// rules' own, then the first others seen); the rest count as `other`.
const MAX_COUNTED_DOMAINS: usize = 256;

/// The server's state: the limiter, the rules in force, and counters.
pub struct State {
    /// The limiter (its policy is the rules' policy).
    pub limiter: Limiter,
    rules: RwLock<Arc<Rules>>,
    /// The rules file or directory, for reloads.
    pub path: PathBuf,
    /// Whether answers carry `RateLimit`, `RateLimit-Policy` and `Retry-After` in `response_headers_to_add`.
    pub response_headers: bool,
    /// Requests per domain: read-locked to count (an atomic add), write-locked to add a domain.
    domains: RwLock<BTreeMap<String, AtomicU64>>,
    other_domains: AtomicU64,
}

/// The attributes of one item of the check, kept inline.
struct Pairs<'a>(SmallVec<[(&'a str, &'a str); 4]>);

impl throttlegate::Attributes for Pairs<'_> {
    fn get_attr(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
    }
}

/// One descriptor, as the check sees it (borrowing from the rules in force).
struct Planned<'r> {
    /// The rule it reaches and the attribute value it gives, for a YAML limit.
    rule: Option<&'r str>,
    /// The YAML limit's name (for `current_limit.name` and `replaces`).
    name: Option<&'r str>,
    replaces: &'r [String],
    unlimited: bool,
    /// `requests_per_unit: 0`, with its unit.
    zero: Option<i32>,
    /// 0: peek.
    cost: u64,
}

impl State {
    /// A state around `limiter`, whose policy is `rules.policy`.
    pub fn new(limiter: Limiter, rules: Rules, path: PathBuf, response_headers: bool) -> State {
        State {
            limiter,
            rules: RwLock::new(Arc::new(rules)),
            path,
            response_headers,
            domains: RwLock::new(BTreeMap::new()),
            other_domains: AtomicU64::new(0),
        }
    }

    /// The rules in force.
    pub fn rules(&self) -> Arc<Rules> {
        self.rules.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Read the rules again and put them in force (the limiter's reload: a
    /// rule that keeps its name, key and algorithm keeps its state). A file
    /// that does not read or validate is refused and the rules in force stay.
    pub fn reload(&self) -> throttlegate::Result<throttlegate::PolicyDiff> {
        let rules = Rules::load(&self.path)?;
        let mut slot = self.rules.write().unwrap_or_else(|e| e.into_inner());
        let diff = self.limiter.reload(rules.policy.clone())?;
        *slot = Arc::new(rules);
        Ok(diff)
    }

    fn count_domain(&self, domain: &str) {
        if let Some(n) = self.domains.read().unwrap_or_else(|e| e.into_inner()).get(domain) {
            n.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut d = self.domains.write().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = d.get(domain) {
            n.fetch_add(1, Ordering::Relaxed);
        } else if d.len() < MAX_COUNTED_DOMAINS {
            d.insert(domain.to_string(), AtomicU64::new(1));
        } else {
            self.other_domains.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Requests per domain (the first [`MAX_COUNTED_DOMAINS`] seen) and the others' count.
    pub fn domain_counts(&self) -> (BTreeMap<String, u64>, u64) {
        let d = self.domains.read().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, n)| (k.clone(), n.load(Ordering::Relaxed))).collect();
        (d, self.other_domains.load(Ordering::Relaxed))
    }

    /// Check the descriptors of one `RateLimitRequest` (gRPC and `POST /json`).
    pub async fn should_rate_limit(&self, req: &RateLimitRequest) -> Result<RateLimitResponse, CheckError> {
        if req.domain.is_empty() {
            return Err(CheckError::BadRequest("domain: must not be empty".into()));
        }
        if req.domain.len() > MAX_VALUE_LEN {
            return Err(CheckError::BadRequest(format!("domain: longer than {MAX_VALUE_LEN} bytes")));
        }
        if req.descriptors.is_empty() {
            return Err(CheckError::BadRequest("descriptors: must not be empty".into()));
        }
        if req.descriptors.len() > MAX_DESCRIPTORS {
            return Err(CheckError::BadRequest(format!(
                "descriptors: {} descriptors, at most {MAX_DESCRIPTORS}",
                req.descriptors.len()
            )));
        }
        let rules = self.rules();
        self.count_domain(&req.domain);
        let request_cost = u64::from(req.hits_addend.max(1));
        let mut planned: SmallVec<[_; 4]> = SmallVec::with_capacity(req.descriptors.len());
        for (i, d) in req.descriptors.iter().enumerate() {
            if d.limit.is_some() {
                return Err(CheckError::BadRequest(format!(
                    "descriptors[{i}].limit: a limit sent with the request is not supported; set it in the rules"
                )));
            }
            if d.entries.len() > MAX_ENTRIES {
                return Err(CheckError::BadRequest(format!("descriptors[{i}].entries: at most {MAX_ENTRIES}")));
            }
            let mut entries: SmallVec<[(&str, &str); 4]> = SmallVec::with_capacity(d.entries.len());
            for (j, e) in d.entries.iter().enumerate() {
                if e.key.is_empty() {
                    return Err(CheckError::BadRequest(format!("descriptors[{i}].entries[{j}].key: must not be empty")));
                }
                if e.key.len() > MAX_VALUE_LEN || e.value.len() > MAX_VALUE_LEN {
                    return Err(CheckError::BadRequest(format!(
                        "descriptors[{i}].entries[{j}]: key or value longer than {MAX_VALUE_LEN} bytes"
                    )));
                }
                entries.push((e.key.as_str(), e.value.as_str()));
            }
            let cost = d.hits_addend.unwrap_or(request_cost);
            let mut p = Planned {
                rule: None,
                name: None,
                replaces: &[],
                unlimited: false,
                zero: None,
                cost,
            };
            let mut value = None;
            if rules.format == Format::Envoy {
                if let Some(m) = rules.domains.get(&req.domain).and_then(|l| l.matches(&entries)) {
                    match m.limit {
                        Limit::Rule { rule, name, replaces } => {
                            p.rule = Some(rule);
                            p.name = name.as_deref();
                            p.replaces = replaces;
                            value = Some(m.value);
                        }
                        Limit::Unlimited => p.unlimited = true,
                        Limit::Zero { name, replaces, unit } => {
                            p.zero = Some(*unit);
                            p.name = name.as_deref();
                            p.replaces = replaces;
                        }
                    }
                }
            }
            planned.push((p, value, entries));
        }
        // `replaces`: a limit named by another matched limit's `replaces` is dropped.
        if planned.iter().any(|(p, _, _)| !p.replaces.is_empty()) {
            let replaced: Vec<&str> = planned.iter().flat_map(|(p, _, _)| p.replaces.iter().map(String::as_str)).collect();
            for (p, value, _) in planned.iter_mut() {
                if p.name.is_some_and(|n| replaced.contains(&n)) {
                    p.rule = None;
                    p.zero = None;
                    *value = None;
                }
            }
        }
        // A limit of 0 reached by a counted descriptor denies the request:
        // nothing is counted, and every other descriptor is reported at cost 0.
        let blocked = planned.iter().any(|(p, _, _)| p.zero.is_some() && p.cost > 0);
        // The items of the one check, and the item each descriptor is reported from.
        let mut items: SmallVec<[CheckItem<Pairs<'_>>; 4]> = SmallVec::new();
        let mut item_of: SmallVec<[Option<usize>; 4]> = smallvec::smallvec![None; planned.len()];
        match rules.format {
            // Each descriptor that reaches a limit: that limit's rule, valued
            // by the descriptor, at the descriptor's own cost.
            Format::Envoy => {
                for (i, (p, value, _)) in planned.iter().enumerate() {
                    if let (Some(rule), Some(v)) = (p.rule, value) {
                        item_of[i] = Some(items.len());
                        items.push(CheckItem { attributes: Pairs(smallvec::smallvec![(rule, v.as_str())]), cost: if blocked { 0 } else { p.cost } });
                    }
                }
            }
            // The descriptors of a native policy are one set of attributes (a
            // rule's key may read several of them), at one cost; those of
            // hits_addend 0 another, at cost 0.
            Format::Native => {
                let mut check: SmallVec<[(&str, &str); 4]> = SmallVec::new();
                let mut peek: SmallVec<[(&str, &str); 4]> = SmallVec::new();
                let mut cost = None;
                for (i, (p, _, entries)) in planned.iter().enumerate() {
                    let target = if p.cost == 0 { &mut peek } else { &mut check };
                    let pairs = entries.iter().copied().chain((!entries.is_empty()).then_some(("domain", req.domain.as_str())));
                    for (name, v) in pairs {
                        match target.iter().find(|(k, _)| *k == name) {
                            Some((_, old)) if *old != v => {
                                return Err(CheckError::BadRequest(format!(
                                    "descriptors[{i}]: the attribute \"{name}\" is given another value by an earlier descriptor; a native policy reads a request's descriptors as one set of attributes"
                                )))
                            }
                            Some(_) => {}
                            None => target.push((name, v)),
                        }
                    }
                    if p.cost > 0 {
                        match cost {
                            None => cost = Some(p.cost),
                            Some(c) if c != p.cost => {
                                return Err(CheckError::BadRequest(format!(
                                    "descriptors[{i}].hits_addend: {} differs from an earlier descriptor's {c}; a native policy reads a request's descriptors as one set of attributes, at one cost (YAML limits take each its own)",
                                    p.cost
                                )))
                            }
                            Some(_) => {}
                        }
                    }
                }
                // An empty set is no item (a rule keyed on nothing would apply to it).
                let counted = !check.is_empty();
                if counted {
                    items.push(CheckItem { attributes: Pairs(check), cost: cost.unwrap_or(request_cost) });
                }
                if !peek.is_empty() {
                    items.push(CheckItem { attributes: Pairs(peek), cost: 0 });
                }
                for (i, (p, _, entries)) in planned.iter().enumerate() {
                    if !entries.is_empty() {
                        item_of[i] = Some(if p.cost > 0 || !counted { 0 } else { 1 });
                    }
                }
            }
        }
        // The one check: one script run, all or nothing.
        // The items are read before the check's future is made, and not held across its await.
        let check = (!items.is_empty()).then(|| self.limiter.check_items(&items));
        drop(items);
        let checked = match check {
            None => None,
            Some(check) => match check.await {
                Ok(c) => Some(c),
                // The core names the item; the client knows its descriptors
                // (a native policy's items are sets of them).
                Err(e) if e.kind() == ErrorKind::InvalidArgument => {
                    let m = e.message();
                    let named = m.strip_prefix("items[").and_then(|rest| rest.split_once(']')).and_then(|(n, tail)| {
                        let item: usize = n.parse().ok()?;
                        match rules.format {
                            Format::Envoy => {
                                let d = item_of.iter().position(|&x| x == Some(item))?;
                                Some(format!("descriptors[{d}]{tail}"))
                            }
                            Format::Native => Some(format!("descriptors{tail}")),
                        }
                    });
                    return Err(CheckError::BadRequest(named.unwrap_or_else(|| m.replace("the items reaching", "the descriptors reaching"))));
                }
                Err(e) => return Err(e.into()),
            },
        };
        let mut resp = RateLimitResponse { overall_code: code::OK, ..Default::default() };
        if blocked || checked.as_ref().is_some_and(|d| !d.decision.allowed) {
            resp.overall_code = code::OVER_LIMIT;
        }
        let policy_rules = rules.policy.rules();
        for (i, (p, _, entries)) in planned.iter().enumerate() {
            // The decision for a descriptor that reached the check; its results.
            let (decision, reached): (Option<&Decision>, &[usize]) = match (&checked, item_of[i]) {
                (Some(c), Some(item)) => (Some(&c.decision), &c.items[item]),
                _ => (None, &[]),
            };
            let status = if p.unlimited {
                DescriptorStatus { code: code::OK, limit_remaining: u32::MAX, ..Default::default() }
            } else if let Some(unit) = p.zero {
                let over = p.cost > 0;
                DescriptorStatus {
                    code: if over { code::OVER_LIMIT } else { code::OK },
                    current_limit: Some(RateLimit { name: p.name.unwrap_or_default().to_string(), requests_per_unit: 0, unit }),
                    limit_remaining: 0,
                    duration_until_reset: Some(prost_types::Duration { seconds: unit_seconds(unit) as i64, nanos: 0 }),
                }
            } else {
                let results: Vec<&RuleResult> = match (decision, rules.format) {
                    (Some(d), Format::Envoy) => reached.iter().filter_map(|&at| d.results.get(at)).collect(),
                    (Some(d), Format::Native) => reached
                        .iter()
                        .filter_map(|&at| d.results.get(at))
                        .filter(|r| {
                            policy_rules.get(r.index).is_some_and(|rule| {
                                placeholders(&rule.key).any(|a| entries.iter().any(|(k, _)| *k == a))
                            })
                        })
                        .collect(),
                    _ => vec![],
                };
                // The YAML's limits are named by their `name` only, as envoyproxy/ratelimit's are
                // (Envoy puts it in X-RateLimit-Limit); a native rule by its own name.
                let name = match rules.format {
                    Format::Envoy => Some(p.name.unwrap_or("")),
                    Format::Native => None,
                };
                status_of(decision, &results, name)
            };
            if status.code == code::OVER_LIMIT {
                resp.overall_code = code::OVER_LIMIT;
            }
            resp.statuses.push(status);
        }
        if self.response_headers {
            if let Some(d) = checked.as_ref().map(|c| &c.decision) {
                for (k, v) in d.headers_with(self.limiter.header_options()) {
                    if matches!(k, "RateLimit" | "RateLimit-Policy" | "Retry-After") {
                        resp.response_headers_to_add.push(HeaderValue { key: k.to_string(), value: v, raw_value: vec![] });
                    }
                }
            }
            if blocked && !resp.response_headers_to_add.iter().any(|h| h.key == "Retry-After") {
                let wait = planned.iter().filter_map(|(p, _, _)| p.zero).map(unit_seconds).max().unwrap_or(1);
                resp.response_headers_to_add.push(HeaderValue { key: "Retry-After".into(), value: wait.to_string(), raw_value: vec![] });
            }
        }
        Ok(resp)
    }
}

fn unit_seconds(unit: i32) -> u64 {
    crate::rules::UNITS.iter().find(|u| u.2 == unit).map_or(1, |u| u.1)
}

/// The attribute names a key template names (`{name}`).
pub fn placeholders(template: &str) -> impl Iterator<Item = &str> {
    template.split('{').skip(1).filter_map(|s| s.split_once('}').map(|(name, _)| name))
}

/// A descriptor's status from the results of the rules it reached: the
/// most restrictive of them (a denying one first, then the fewest remaining).
fn status_of(decision: Option<&Decision>, results: &[&RuleResult], name: Option<&str>) -> DescriptorStatus {
    let enforced: Vec<&&RuleResult> = results.iter().filter(|r| !r.shadow).collect();
    let pick = enforced
        .iter()
        .filter(|r| !r.allowed)
        .max_by_key(|r| r.retry_after)
        .or_else(|| enforced.iter().min_by_key(|r| (r.remaining, r.reset_after)))
        .copied()
        .or_else(|| results.first());
    match pick {
        Some(r) => {
            let over = !r.allowed && !r.shadow;
            let wait = if over { r.retry_after } else { r.reset_after };
            let remaining = r.remaining;
            DescriptorStatus {
                code: if over { code::OVER_LIMIT } else { code::OK },
                current_limit: Some(RateLimit {
                    name: name.unwrap_or(r.rule.as_str()).to_string(),
                    requests_per_unit: u32::try_from(r.limit).unwrap_or(u32::MAX),
                    unit: unit_of_window(r.window),
                }),
                limit_remaining: u32::try_from(remaining).unwrap_or(u32::MAX),
                duration_until_reset: Some(duration(wait)),
            }
        }
        // A degraded decision (the backend failed, `on_backend_error`) has no results.
        None => DescriptorStatus {
            code: if decision.is_some_and(|d| d.degraded && !d.allowed) { code::OVER_LIMIT } else { code::OK },
            ..Default::default()
        },
    }
}

fn duration(d: Duration) -> prost_types::Duration {
    // Whole seconds, rounded up, as RateLimit-Reset and Envoy's X-RateLimit-Reset read them.
    prost_types::Duration { seconds: throttlegate::ceil_secs(d) as i64, nanos: 0 }
}

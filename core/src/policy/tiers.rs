//! Limits chosen per request and penalties: a rule's `tiers` (its limit
//! picked by an attribute), `overrides` (limits set at run time for one key,
//! stored in the backend) and `block` (a denial that holds for a while,
//! escalating for repeat offenders). Parsed, validated and written back here;
//! the plan module compiles them, and the check script (`lua/extensions.lua`)
//! and the embedded backend apply them.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::duration::{format_duration, parse_duration};
use crate::key::validate_name;
use crate::policy::{type_name, Algorithm, Rule, MAX_LIMIT, MAX_QUOTA_LIMIT, MAX_REFILL_RATE, MAX_WINDOW, MIN_REFILL_RATE};

/// Largest `block_factor` accepted.
pub const MAX_BLOCK_FACTOR: f64 = 1000.0;

/// The limit of one tier: a count for every algorithm but the token bucket,
/// whose tiers give a capacity and a refill rate.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TierLimit {
    /// `limit` units (sliding windows, fixed windows, quotas).
    Limit(u64),
    /// A token bucket's `capacity` and `refill_rate` (tokens per second).
    Bucket {
        /// Size of the bucket.
        capacity: u64,
        /// Tokens added per second.
        refill_rate: f64,
    },
}

/// A rule's limit chosen by the value of one attribute, e.g.
/// `tiers = { attribute = "plan", free = 100, pro = 1000, default = 10 }`.
///
/// A request whose attribute is absent, or has a value that is not listed,
/// gets the `default` tier; without a `default`, the rule does not apply to
/// it (as with `match`). The names `attribute` and `default` are reserved.
#[derive(Debug, Clone, PartialEq)]
pub struct Tiers {
    /// The attribute whose value picks the tier.
    pub attribute: String,
    /// Attribute value -> limit.
    pub limits: BTreeMap<String, TierLimit>,
    /// The limit for every other value (and an absent attribute); `None`:
    /// the rule does not apply to those requests.
    pub default: Option<TierLimit>,
}

impl Tiers {
    /// Tiers picked by `attribute`, with no tier yet.
    pub fn new(attribute: impl Into<String>) -> Tiers {
        Tiers { attribute: attribute.into(), limits: BTreeMap::new(), default: None }
    }

    /// Add the tier for `value`.
    pub fn tier(mut self, value: impl Into<String>, limit: TierLimit) -> Tiers {
        self.limits.insert(value.into(), limit);
        self
    }

    /// Set the default tier.
    pub fn default_tier(mut self, limit: TierLimit) -> Tiers {
        self.default = Some(limit);
        self
    }

    /// The limit that stands in the rule's algorithm: the default tier, or
    /// the first tier in value order.
    pub(crate) fn placeholder(&self) -> Option<TierLimit> {
        self.default.or_else(|| self.limits.values().next().copied())
    }
}

/// A penalty: once the rule denies a key, every check on that key is denied
/// for `duration`; a key blocked again within `period` after its previous
/// block ended is blocked `factor` times as long as the previous time, up to
/// `max`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Block {
    /// How long the first block lasts (`block`).
    pub duration: Duration,
    /// How much longer each repeat block lasts (`block_factor`, default 1).
    pub factor: f64,
    /// The longest block (`block_max`, default `block`).
    pub max: Duration,
    /// How long after a block ends the next one counts as a repeat
    /// (`block_period`, default `block_max`).
    pub period: Duration,
}

impl Block {
    /// A block of `duration`, without escalation.
    pub fn new(duration: Duration) -> Block {
        Block { duration, factor: 1.0, max: duration, period: duration }
    }

    /// Escalate: each repeat lasts `factor` times the previous, up to `max`
    /// (repeats counted within `max` of a block's end).
    pub fn escalating(duration: Duration, factor: f64, max: Duration) -> Block {
        Block { duration, factor, max, period: max }
    }

    /// Count repeats within `period` of a block's end instead.
    pub fn period(mut self, period: Duration) -> Block {
        self.period = period;
        self
    }
}

/// The algorithm with its limit replaced by `limit` (its window and other
/// parameters kept); `None` when the kinds do not fit.
pub(crate) fn with_limit(algorithm: Algorithm, limit: TierLimit) -> Option<Algorithm> {
    Some(match (algorithm, limit) {
        (Algorithm::TokenBucket { .. }, TierLimit::Bucket { capacity, refill_rate }) => {
            Algorithm::TokenBucket { capacity, refill_rate }
        }
        (Algorithm::TokenBucket { .. }, TierLimit::Limit(_)) | (_, TierLimit::Bucket { .. }) => return None,
        (Algorithm::SlidingWindowLog { window, .. }, TierLimit::Limit(limit)) => {
            Algorithm::SlidingWindowLog { limit, window }
        }
        (Algorithm::SlidingWindow { window, precision, .. }, TierLimit::Limit(limit)) => {
            Algorithm::SlidingWindow { limit, window, precision }
        }
        (Algorithm::FixedWindow { window, .. }, TierLimit::Limit(limit)) => Algorithm::FixedWindow { limit, window },
        (Algorithm::Quota { period, utc_offset_minutes, .. }, TierLimit::Limit(limit)) => {
            Algorithm::Quota { limit, period, utc_offset_minutes }
        }
        (Algorithm::Concurrency { lease, .. }, TierLimit::Limit(limit)) => Algorithm::Concurrency { limit, lease },
    })
}

/// The largest limit an override or tier may give this algorithm.
pub(crate) fn max_limit(algorithm: &Algorithm) -> u64 {
    match algorithm {
        Algorithm::Quota { .. } => MAX_QUOTA_LIMIT,
        _ => MAX_LIMIT,
    }
}

fn check_tier(algorithm: Algorithm, at: &str, limit: TierLimit) -> Result<(), String> {
    match with_limit(algorithm, limit) {
        None if matches!(algorithm, Algorithm::TokenBucket { .. }) => Err(format!(
            "{at}: a token bucket's tier is {{ capacity = ..., refill_rate = ... }}, not a single number"
        )),
        None => Err(format!("{at}: expected a positive integer limit, got an object")),
        Some(Algorithm::TokenBucket { capacity, refill_rate }) => {
            if capacity == 0 || capacity > MAX_LIMIT {
                return Err(format!("{at}: capacity: must be between 1 and {MAX_LIMIT}, not {capacity}"));
            }
            if !refill_rate.is_finite() || !(MIN_REFILL_RATE..=MAX_REFILL_RATE).contains(&refill_rate) {
                return Err(format!(
                    "{at}: refill_rate: must be between {MIN_REFILL_RATE} and {MAX_REFILL_RATE} tokens per second, not {refill_rate}"
                ));
            }
            Ok(())
        }
        Some(a) => {
            let (limit, max) = (a.limit(), max_limit(&a));
            if limit == 0 || limit > max {
                return Err(format!("{at}: limit: must be between 1 and {max}, not {limit}"));
            }
            Ok(())
        }
    }
}

fn check_duration(d: Duration, at: &str) -> Result<(), String> {
    if d < Duration::from_millis(1) {
        return Err(format!("{at}: must be at least 1ms"));
    }
    if d > MAX_WINDOW {
        return Err(format!("{at}: must be at most 366d"));
    }
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("{at}: must be a whole number of milliseconds"));
    }
    Ok(())
}

/// Validate a rule's tiers and block (the error completes the rule's path).
pub(crate) fn validate(rule: &Rule) -> Result<(), String> {
    if let Some(t) = &rule.tiers {
        validate_name(&t.attribute).map_err(|m| format!("tiers: attribute: name {m}"))?;
        if t.limits.is_empty() && t.default.is_none() {
            return Err("tiers: needs at least one tier besides `attribute`".into());
        }
        for (value, limit) in &t.limits {
            check_tier(rule.algorithm, &format!("tiers.{value}"), *limit)?;
        }
        if let Some(d) = t.default {
            check_tier(rule.algorithm, "tiers.default", d)?;
        }
    }
    if let Some(b) = &rule.block {
        check_duration(b.duration, "block")?;
        check_duration(b.max, "block_max")?;
        check_duration(b.period, "block_period")?;
        if !b.factor.is_finite() || !(1.0..=MAX_BLOCK_FACTOR).contains(&b.factor) {
            return Err(format!("block_factor: must be between 1 and {MAX_BLOCK_FACTOR}, not {}", b.factor));
        }
        if b.max < b.duration {
            return Err(format!(
                "block_max: must be at least block ({}), not {}",
                format_duration(b.duration),
                format_duration(b.max)
            ));
        }
    }
    Ok(())
}

// ---- the file format ---------------------------------------------------------

fn count(v: &Value, at: &str) -> Result<u64, String> {
    match v {
        Value::Number(n) => match n.as_u64() {
            Some(x) => Ok(x),
            None => match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f >= 0.0 && f <= u64::MAX as f64 => Ok(f as u64),
                _ => Err(format!("{at}: must be a positive integer, got {n}")),
            },
        },
        other => Err(format!("{at}: expected a positive integer limit, got {}", type_name(other))),
    }
}

fn number(v: &Value, at: &str) -> Result<f64, String> {
    v.as_f64().ok_or_else(|| format!("{at}: expected a number, got {}", type_name(v)))
}

fn duration(v: &Value, at: &str) -> Result<Duration, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .map(Duration::from_millis)
            .ok_or_else(|| format!("{at}: expected whole milliseconds or a string like \"15m\", got {n}")),
        Value::String(s) => parse_duration(s).map_err(|m| format!("{at}: {m}")),
        other => Err(format!("{at}: expected a duration like \"15m\", got {}", type_name(other))),
    }
}

fn tier_limit(v: &Value, at: &str, bucket: bool) -> Result<TierLimit, String> {
    if !bucket {
        return count(v, at).map(TierLimit::Limit);
    }
    let obj = v.as_object().ok_or_else(|| {
        format!(
            "{at}: a token bucket's tier is {{ capacity = ..., refill_rate = ... }}, got {}",
            type_name(v)
        )
    })?;
    for f in obj.keys() {
        if f != "capacity" && f != "refill_rate" {
            return Err(format!("{at}: unknown field `{f}`; expected one of: capacity, refill_rate"));
        }
    }
    let capacity = obj.get("capacity").ok_or_else(|| format!("{at}: capacity: missing"))?;
    let rate = obj.get("refill_rate").ok_or_else(|| format!("{at}: refill_rate: missing"))?;
    Ok(TierLimit::Bucket {
        capacity: count(capacity, &format!("{at}: capacity"))?,
        refill_rate: number(rate, &format!("{at}: refill_rate"))?,
    })
}

/// Parse a rule's `tiers` (for `algorithm`, a token bucket or not).
pub(crate) fn parse_tiers(v: &Value, bucket: bool) -> Result<Tiers, String> {
    let obj = v.as_object().ok_or_else(|| {
        format!(
            "tiers: expected an object like {{ attribute = \"plan\", free = 100, default = 10 }}, got {}",
            type_name(v)
        )
    })?;
    let attribute = match obj.get("attribute") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(format!("tiers.attribute: expected a string, got {}", type_name(other))),
        None => return Err("tiers: attribute: missing; name the attribute whose value picks the tier".into()),
    };
    let mut tiers = Tiers::new(attribute);
    for (name, value) in obj {
        match name.as_str() {
            "attribute" => {}
            "default" => tiers.default = Some(tier_limit(value, "tiers.default", bucket)?),
            _ => {
                let limit = tier_limit(value, &format!("tiers.{name}"), bucket)?;
                tiers.limits.insert(name.clone(), limit);
            }
        }
    }
    if tiers.limits.is_empty() && tiers.default.is_none() {
        return Err("tiers: needs at least one tier besides `attribute`".into());
    }
    Ok(tiers)
}

/// The limit fields a tiered rule must leave out (the tiers give them).
pub(crate) fn tiered_fields(bucket: bool) -> &'static [&'static str] {
    if bucket {
        &["capacity", "refill_rate"]
    } else {
        &["limit"]
    }
}

/// Parse `overrides`, `block`, `block_factor`, `block_max` and
/// `block_period` into `rule` (its `tiers` are parsed before the algorithm).
pub(crate) fn parse_into(rule: &mut Rule, obj: &Map<String, Value>) -> Result<(), String> {
    if let Some(v) = obj.get("overrides") {
        rule.overrides = v
            .as_bool()
            .ok_or_else(|| format!("overrides: expected true or false, got {}", type_name(v)))?;
    }
    let block = obj.get("block").map(|v| duration(v, "block")).transpose()?;
    let factor = obj.get("block_factor").map(|v| number(v, "block_factor")).transpose()?;
    let max = obj.get("block_max").map(|v| duration(v, "block_max")).transpose()?;
    let period = obj.get("block_period").map(|v| duration(v, "block_period")).transpose()?;
    let Some(block) = block else {
        for (f, given) in [("block_factor", factor.is_some()), ("block_max", max.is_some()), ("block_period", period.is_some())] {
            if given {
                return Err(format!("{f}: needs `block` (how long a denied key stays blocked)"));
            }
        }
        return Ok(());
    };
    let factor = factor.unwrap_or(1.0);
    let max = match max {
        Some(m) => m,
        None if factor > 1.0 => {
            return Err("block_max: required when block_factor is above 1 (the longest block)".into())
        }
        None => block,
    };
    rule.block = Some(Block { duration: block, factor, max, period: period.unwrap_or(max) });
    Ok(())
}

fn tier_value(limit: TierLimit) -> Value {
    match limit {
        TierLimit::Limit(n) => Value::from(n),
        TierLimit::Bucket { capacity, refill_rate } => {
            let mut m = Map::new();
            m.insert("capacity".into(), Value::from(capacity));
            m.insert("refill_rate".into(), Value::from(refill_rate));
            Value::Object(m)
        }
    }
}

/// Write a rule's tiers, overrides and block into its file-format object
/// (removing the limit fields a tiered rule leaves out).
pub(crate) fn write_into(rule: &Rule, m: &mut Map<String, Value>) {
    if let Some(t) = &rule.tiers {
        for f in tiered_fields(matches!(rule.algorithm, Algorithm::TokenBucket { .. })) {
            m.remove(*f);
        }
        let mut o = Map::new();
        o.insert("attribute".into(), Value::from(t.attribute.clone()));
        for (k, v) in &t.limits {
            o.insert(k.clone(), tier_value(*v));
        }
        if let Some(d) = t.default {
            o.insert("default".into(), tier_value(d));
        }
        m.insert("tiers".into(), Value::Object(o));
    }
    if rule.overrides {
        m.insert("overrides".into(), Value::from(true));
    }
    if let Some(b) = &rule.block {
        m.insert("block".into(), Value::from(format_duration(b.duration)));
        m.insert("block_factor".into(), Value::from(b.factor));
        m.insert("block_max".into(), Value::from(format_duration(b.max)));
        m.insert("block_period".into(), Value::from(format_duration(b.period)));
    }
}

/// One override, as listed by `Limiter::overrides`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Override {
    /// The rule it belongs to.
    pub rule: String,
    /// The attributes of the rule's key it was set for.
    pub attributes: BTreeMap<String, String>,
    /// The limit (a token bucket's capacity) that replaces the rule's.
    pub limit: u64,
}

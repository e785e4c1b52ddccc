//! `reserve` and `reserve_for`: units of a rule taken from the backend
//! ahead of use and spent in process (see docs/concepts/reserve.md).
//!
//! Every algorithm that counts units takes it (fixed window, quota, sliding
//! window of counters, sliding-window log, token bucket): the backend counts
//! a reserved unit where the direct path would count its use, or longer
//! (lua/reserve.lua), so the count always covers every unit used, whatever
//! the number of processes. A concurrency rule refuses it at policy load,
//! saying why.

use std::time::Duration;

use serde_json::{Map, Value};

use super::{type_name, Algorithm, Rule};
use crate::duration::{format_duration, parse_duration};

/// The default `reserve_for`.
pub const DEFAULT_RESERVE_FOR: Duration = Duration::from_secs(1);
/// The longest `reserve_for` accepted.
pub const MAX_RESERVE_FOR: Duration = Duration::from_secs(3600);

/// A rule's reservation: up to `units` taken at a time, each reservation
/// spendable for `duration` (and never past the end of the period it was
/// taken in), then given back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reserve {
    /// Up to how many units one limiter holds (`reserve`).
    pub units: u64,
    /// How long a reservation may be spent before its rest is given back (`reserve_for`).
    pub duration: Duration,
}

impl Reserve {
    /// Up to `units` at a time, for the default second.
    pub fn new(units: u64) -> Reserve {
        Reserve { units, duration: DEFAULT_RESERVE_FOR }
    }

    /// The same, spendable for `duration`.
    pub fn for_duration(self, duration: Duration) -> Reserve {
        Reserve { duration, ..self }
    }
}

/// Why an algorithm does not take `reserve`, `None` when it does.
pub(crate) fn refused(algorithm: &Algorithm) -> Option<&'static str> {
    match algorithm {
        Algorithm::FixedWindow { .. }
        | Algorithm::Quota { .. }
        | Algorithm::SlidingWindow { .. }
        | Algorithm::SlidingWindowLog { .. }
        | Algorithm::TokenBucket { .. } => None,
        Algorithm::Concurrency { .. } => Some(
            "not supported by concurrency: slots are held and released, not spent; a reserved slot would be held with no request in it",
        ),
    }
}

/// Validate a rule's reservation (the error completes the rule's path).
pub(crate) fn validate(rule: &Rule) -> Result<(), String> {
    let Some(r) = rule.reserve else { return Ok(()) };
    if let Some(why) = refused(&rule.algorithm) {
        return Err(format!("reserve: {why}"));
    }
    let limit = rule.algorithm.limit();
    if r.units == 0 || (rule.tiers.is_none() && r.units > limit) {
        return Err(format!("reserve: must be between 1 and the rule's limit ({limit}), not {}", r.units));
    }
    if r.duration.is_zero() || r.duration > MAX_RESERVE_FOR {
        return Err(format!(
            "reserve_for: must be between 1ms and {}, not {}",
            format_duration(MAX_RESERVE_FOR),
            format_duration(r.duration)
        ));
    }
    if r.duration.subsec_nanos() % 1_000_000 != 0 {
        return Err("reserve_for: must be a whole number of milliseconds".into());
    }
    let refuse = |what: &str, why: &str| Err(format!("reserve: does not apply with {what} ({why})"));
    if rule.shadow {
        return refuse("shadow", "a shadow rule never denies, so it has nothing to hold back");
    }
    if rule.tiers.is_some() {
        return refuse("tiers", "a reservation is taken for one limit, and a key's tier can change from one request to the next");
    }
    if rule.overrides {
        return refuse("overrides", "an override read at each check could lower the limit below what is already reserved");
    }
    if rule.block.is_some() {
        return refuse("block", "a block is decided by the backend at each check, which a reservation answers without");
    }
    Ok(())
}

fn duration(v: &Value, at: &str) -> Result<Duration, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .map(Duration::from_millis)
            .ok_or_else(|| format!("{at}: expected whole milliseconds or a string like \"1s\", got {n}")),
        Value::String(s) => parse_duration(s).map_err(|m| format!("{at}: {m}")),
        other => Err(format!("{at}: expected a duration like \"1s\", got {}", type_name(other))),
    }
}

/// Parse `reserve` and `reserve_for` into `rule`.
pub(crate) fn parse_into(rule: &mut Rule, obj: &Map<String, Value>) -> Result<(), String> {
    let units = match obj.get("reserve") {
        None => None,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(u) => Some(u),
            None => return Err(format!("reserve: must be a positive integer (units), got {n}")),
        },
        Some(other) => return Err(format!("reserve: expected a positive integer (units), got {}", type_name(other))),
    };
    let dur = obj.get("reserve_for").map(|v| duration(v, "reserve_for")).transpose()?;
    match (units, dur) {
        (None, Some(_)) => Err("reserve_for: needs `reserve` (the units a limiter reserves at a time)".into()),
        (None, None) => Ok(()),
        (Some(units), d) => {
            rule.reserve = Some(Reserve { units, duration: d.unwrap_or(DEFAULT_RESERVE_FOR) });
            Ok(())
        }
    }
}

/// Write a rule's reservation into its file-format object.
pub(crate) fn write_into(rule: &Rule, m: &mut Map<String, Value>) {
    if let Some(r) = rule.reserve {
        m.insert("reserve".into(), Value::from(r.units));
        m.insert("reserve_for".into(), Value::from(format_duration(r.duration)));
    }
}

//! Operator overrides: a limit set at run time for one key of a rule that
//! takes them (`overrides = true`), stored in the backend beside the key and
//! read by the same script invocation (or embedded-store lock) as its checks.
//!
//! On Redis an override is two keys: the one checks read (`<prefix><rule>:#o{<rule key>}`,
//! in the rule key's Cluster slot), holding the limit, and an entry in the
//! rule's index hash `<prefix><rule>#overrides` (field: the rule key; value:
//! the attributes as JSON), which [`Limiter::overrides`] reads to find them.
//! On Redis Cluster the two live in different slots, so no write can keep
//! them in step: the index is only where to look. Listing reads every
//! indexed override key and lists those that exist, with the limit they
//! hold (what checks read), so a key deleted, evicted or changed behind the
//! index, or a clear whose second write failed, never shows a stale entry.
//! Setting writes the index entry before the override and again after it;
//! clearing deletes the override, then the index entry, and puts the entry
//! back when the override exists again by then (a concurrent set): every
//! override that exists stays indexed.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{AttrRef, Generation, Limiter};
use crate::error::{Error, ErrorKind, Result};
use crate::key::Attributes;
use crate::plan::{side_key, CompiledRule, RuleArgs, OVERRIDE_SUFFIX};
use crate::policy::{MAX_REFILL_RATE, MIN_REFILL_RATE};
use crate::runtime;

pub use crate::policy::tiers::Override;

/// The index hash of a rule's overrides.
fn index_key(rule: &CompiledRule) -> String {
    let head = rule.head();
    format!("{}#overrides", &head[..head.len() - 1])
}

/// Check `limit` for `rule`: within the rule's range, and for a bucket a
/// refill rate (scaled alike) within range.
fn validate_limit(rule: &CompiledRule, limit: u64) -> Result<()> {
    let max = rule.ext.map(|e| e.max_override).unwrap_or(crate::policy::MAX_LIMIT);
    if limit == 0 || limit > max {
        return Err(Error::invalid_argument(format!("limit: must be between 1 and {max}, not {limit}")));
    }
    if let RuleArgs::Bucket { capacity, rate, .. } = rule.args {
        let scaled = rate * limit as f64 / capacity as f64;
        if !(MIN_REFILL_RATE..=MAX_REFILL_RATE).contains(&scaled) {
            let (way, bound) = if scaled < MIN_REFILL_RATE { ("below", MIN_REFILL_RATE) } else { ("above", MAX_REFILL_RATE) };
            return Err(Error::invalid_argument(format!(
                "limit: {limit} would scale rule {:?}'s refill rate {way} {bound} tokens per second",
                &*rule.name
            )));
        }
    }
    Ok(())
}

fn entry_of(rule: &str, attributes: &BTreeMap<String, String>, limit: u64) -> Override {
    Override { rule: rule.to_string(), attributes: attributes.clone(), limit }
}

impl Limiter {
    /// The rule (of the policy in force, `g`), its key and override key for
    /// these attributes, and the attributes its key is made of.
    fn override_parts<'g>(&self, g: &'g Generation, rule: &str, attrs: &dyn Attributes) -> Result<(&'g CompiledRule, String, String, BTreeMap<String, String>)> {
        self.ensure_open()?;
        let (r, key, side) = g.rules.override_target(rule, attrs)?;
        let attributes = r
            .key_attributes()
            .into_iter()
            .filter_map(|a| attrs.get_attr(&a).map(|v| (a, v.to_string())))
            .collect();
        Ok((r, key, side, attributes))
    }

    /// Set the limit of one key of `rule` (the key these attributes make) to
    /// `limit`, until cleared: for a token bucket the capacity, with the
    /// refill rate scaled alike. The rule must have `overrides = true`.
    pub async fn set_override<A: Attributes + ?Sized>(&self, rule: &str, attrs: &A, limit: u64) -> Result<()> {
        let g = self.inner.current.load_full();
        let (r, key, side, attributes) = self.override_parts(&g, rule, &AttrRef(attrs))?;
        validate_limit(r, limit)?;
        if let Some(c) = &g.deny_cache {
            c.forget(std::slice::from_ref(&key));
        }
        match (&self.inner.memory, &self.inner.remote) {
            (Some(m), _) => {
                m.put_override(rule, &key, &side, Some(entry_of(rule, &attributes, limit)));
                Ok(())
            }
            (None, Some(remote)) => {
                let value = json!({ "attributes": attributes }).to_string();
                let index = redis::cmd("HSET").arg(index_key(r)).arg(&key).arg(&value).clone();
                remote.query::<()>(&index).await?;
                remote.query::<()>(redis::cmd("SET").arg(&side).arg(limit)).await?;
                // Again: a concurrent clear may have removed the entry meanwhile.
                remote.query::<()>(&index).await?;
                Ok(())
            }
            (None, None) => Err(Error::closed()),
        }
    }

    /// Clear the override of one key of `rule`; returns whether there was one.
    pub async fn clear_override<A: Attributes + ?Sized>(&self, rule: &str, attrs: &A) -> Result<bool> {
        let g = self.inner.current.load_full();
        let (r, key, side, attributes) = self.override_parts(&g, rule, &AttrRef(attrs))?;
        if let Some(c) = &g.deny_cache {
            c.forget(std::slice::from_ref(&key));
        }
        match (&self.inner.memory, &self.inner.remote) {
            (Some(m), _) => {
                Ok(m.put_override(rule, &key, &side, None))
            }
            (None, Some(remote)) => {
                let n: u64 = remote.query(redis::cmd("DEL").arg(&side)).await?;
                remote.query::<u64>(redis::cmd("HDEL").arg(index_key(r)).arg(&key)).await?;
                // A set that ran meanwhile may have written its override after
                // the DEL, and its index entry before the HDEL: put it back.
                // (GET rather than EXISTS: the commands the documented ACL allows.)
                let again: Option<String> = remote.query(redis::cmd("GET").arg(&side)).await?;
                if again.is_some() {
                    let value = json!({ "attributes": attributes }).to_string();
                    remote.query::<()>(redis::cmd("HSET").arg(index_key(r)).arg(&key).arg(value)).await?;
                }
                Ok(n > 0)
            }
            (None, None) => Err(Error::closed()),
        }
    }

    /// The overrides of `rule`, in key order.
    pub async fn overrides(&self, rule: &str) -> Result<Vec<Override>> {
        self.ensure_open()?;
        let g = self.inner.current.load_full();
        let r = g.rules.override_rule(rule)?;
        match (&self.inner.memory, &self.inner.remote) {
            (Some(m), _) => Ok(m.overrides_of(rule)),
            (None, Some(remote)) => {
                let flat: Vec<(String, String)> = remote.query(redis::cmd("HGETALL").arg(index_key(r))).await?;
                let mut sorted = flat;
                sorted.sort();
                // The limits the override keys hold now (each in its key's slot).
                let limits = futures_util::future::join_all(sorted.iter().map(|(key, _)| {
                    let side = side_key(r.head(), key, OVERRIDE_SUFFIX);
                    async move { remote.query::<Option<String>>(redis::cmd("GET").arg(side)).await }
                }))
                .await;
                let mut out = Vec::with_capacity(sorted.len());
                for ((key, value), limit) in sorted.into_iter().zip(limits) {
                    // Indexed, but gone (cleared, deleted or evicted): not an override.
                    let Some(limit) = limit? else { continue };
                    let limit: u64 = limit.parse().map_err(|_| {
                        Error::new(ErrorKind::Backend, format!("override of rule {rule:?} for {key:?}: {limit:?} is not a limit"))
                    })?;
                    let parsed: Value = serde_json::from_str(&value).map_err(|e| {
                        Error::new(ErrorKind::Backend, format!("override index of rule {rule:?}: entry {key:?} is not JSON: {e}"))
                    })?;
                    let attributes = parsed["attributes"]
                        .as_object()
                        .map(|o| o.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string()))).collect())
                        .unwrap_or_default();
                    out.push(entry_of(rule, &attributes, limit));
                }
                Ok(out)
            }
            (None, None) => Err(Error::closed()),
        }
    }

    /// [`Limiter::set_override`] for callers without an event loop.
    pub fn set_override_blocking<A: Attributes + ?Sized>(&self, rule: &str, attrs: &A, limit: u64) -> Result<()> {
        runtime::block_on(self.set_override(rule, attrs, limit))?
    }

    /// [`Limiter::clear_override`] for callers without an event loop.
    pub fn clear_override_blocking<A: Attributes + ?Sized>(&self, rule: &str, attrs: &A) -> Result<bool> {
        runtime::block_on(self.clear_override(rule, attrs))?
    }

    /// [`Limiter::overrides`] for callers without an event loop.
    pub fn overrides_blocking(&self, rule: &str) -> Result<Vec<Override>> {
        runtime::block_on(self.overrides(rule))?
    }
}

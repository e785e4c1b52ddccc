//! The opt-in local memory of denials ("denied until T") that spares a
//! remote backend the checks it would refuse anyway.
//!
//! When the backend denies a check, each non-shadow rule that denied it
//! tells how long a request of that cost must wait (`retry_after`). Until
//! then, every check of at least that cost touching the same key is denied
//! by the backend too: nothing frees units early (a sliding-window log only
//! loses members as they leave the window, which `retry_after` already
//! counts; a bucket only refills at its rate), and other clients can only
//! take more. So the answer can be given here, exactly, without a round trip.
//! The wait is counted from the moment the check was sent, before the backend
//! read its clock, so a remembered denial never outlives the real one.
//!
//! A block (a rule's `block`) denies every cost until it ends, so a blocked
//! key is remembered for cost 1: every check on it is answered here.
//!
//! Two things are not seen: a `reset` made by another process (this
//! limiter's own resets forget the keys), and state lost on the server
//! (eviction, a flush). Until the remembered wait ends, those keys stay
//! denied here. Checks with an explicit call id always go to the backend
//! (a retry of an admitted call must be answered as such).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use crate::decision::{Decision, RuleResult};

const SHARDS: usize = 16;
/// Keys remembered per shard; beyond that, new denials are not remembered
/// until older ones have expired.
const PER_SHARD: usize = 4096;

/// One remembered denial of one rule's key.
#[derive(Debug, Clone)]
struct Denied {
    /// When (limiter clock, microseconds) the check that was denied was sent.
    at_us: i64,
    /// When a request of `cost` may pass again.
    until_us: i64,
    /// The cost that was denied: smaller requests may still pass.
    cost: u64,
    /// The rule's result in that denial.
    result: RuleResult,
}

/// Remembered denials, by key.
pub(crate) struct DenyCache {
    shards: Box<[Mutex<HashMap<String, Denied>>]>,
    hasher: foldhash::quality::RandomState,
}

fn lock(m: &Mutex<HashMap<String, Denied>>) -> MutexGuard<'_, HashMap<String, Denied>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

impl DenyCache {
    pub fn new() -> DenyCache {
        DenyCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: foldhash::quality::RandomState::default(),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<HashMap<String, Denied>> {
        &self.shards[self.hasher.hash_one(key) as usize % SHARDS]
    }

    /// The denial a check of `cost` on these keys gets now, if one of its
    /// non-shadow rules is remembered as denying at least that cost: the
    /// remembered results, their waits counted down. `None`: ask the backend.
    pub fn lookup<'a>(
        &self,
        keys: impl Iterator<Item = (&'a str, bool)>,
        cost: u64,
        now_us: i64,
    ) -> Option<Decision> {
        let mut results: Vec<RuleResult> = Vec::new();
        for (key, shadow) in keys {
            if shadow {
                continue;
            }
            let mut shard = lock(self.shard(key));
            let Some(d) = shard.get(key) else { continue };
            if d.until_us <= now_us {
                shard.remove(key);
                continue;
            }
            if cost < d.cost {
                continue;
            }
            let elapsed = Duration::from_micros((now_us - d.at_us).max(0) as u64);
            let mut r = d.result.clone();
            r.retry_after = Duration::from_micros((d.until_us - now_us) as u64);
            r.reset_after = r.reset_after.saturating_sub(elapsed).max(r.retry_after);
            results.push(r);
        }
        if results.is_empty() {
            None
        } else {
            Some(Decision::from_results(results, false))
        }
    }

    /// Remember the denying rules of a decision the backend gave to a check
    /// of `cost` sent at `sent_us`; `keys[i]` is `d.results[i]`'s key, and
    /// `blocked[i]` whether that rule's denial is a block (which denies
    /// every cost until it ends, so it is remembered for cost 1).
    pub fn remember(&self, keys: &[String], d: &Decision, blocked: &[bool], cost: u64, sent_us: i64) {
        for (i, (key, r)) in keys.iter().zip(&d.results).enumerate() {
            if r.allowed || r.shadow || r.retry_after.is_zero() {
                continue;
            }
            let cost = if blocked.get(i).copied().unwrap_or(false) { 1 } else { cost };
            let until_us = sent_us.saturating_add(micros(r.retry_after));
            let mut shard = lock(self.shard(key));
            if shard.len() >= PER_SHARD && !shard.contains_key(key.as_str()) {
                shard.retain(|_, d| d.until_us > sent_us);
                if shard.len() >= PER_SHARD {
                    continue;
                }
            }
            let entry = Denied {
                at_us: sent_us,
                until_us,
                cost,
                result: r.clone(),
            };
            match shard.get_mut(key.as_str()) {
                // Keep the stronger memory: the one covering smaller costs.
                Some(old) if old.until_us > sent_us && old.cost < cost => {}
                Some(old) => *old = entry,
                None => {
                    shard.insert(key.clone(), entry);
                }
            }
        }
    }

    /// Forget these keys (this limiter reset them).
    pub fn forget(&self, keys: &[String]) {
        for key in keys {
            lock(self.shard(key)).remove(key.as_str());
        }
    }

    /// A cache for a reloaded policy: the denials of the rules `keep` maps
    /// to their new position (rules whose every field is unchanged), none
    /// of the others (a new limit must not be answered with an old denial).
    pub fn carried(&self, keep: impl Fn(&str) -> Option<usize>) -> DenyCache {
        let fresh = DenyCache { hasher: self.hasher.clone(), ..DenyCache::new() };
        for (old, new) in self.shards.iter().zip(fresh.shards.iter()) {
            let mut new = lock(new);
            for (key, d) in lock(old).iter() {
                if let Some(index) = keep(&d.result.rule) {
                    let mut d = d.clone();
                    d.result.index = index;
                    new.insert(key.clone(), d);
                }
            }
        }
        fresh
    }

    /// Forget everything (the limiter was closed).
    pub fn clear(&self) {
        for s in self.shards.iter() {
            lock(s).clear();
        }
    }
}

//! The embedded in-memory backend: the same algorithms and stacking as Redis,
//! in process.
//!
//! Keys live in 64 shards, each behind its own mutex; a check locks only the
//! shards of its own keys, in index order (so two checks never deadlock), and
//! decides all of its rules before writing any. Expired keys are treated as
//! absent, and each shard sweeps them out whenever it has doubled in size
//! since its last sweep, so memory stays bounded under a stream of new keys.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::{Mutex, MutexGuard};

use smallvec::SmallVec;

use super::{Outcomes, SettleOutcome, Settled};
use crate::algo::{fixed_end, quota_end, Bucket, Counters, Leases, Log, Outcome, PeriodCount, TB_IDS};
use crate::error::Result;
use crate::plan::{Mode, Plan, RuleArgs};
use super::script::cost_above;
use crate::policy::tiers::Override;

const SHARDS: usize = 64;
const MIN_SWEEP: usize = 1024;

enum State {
    /// Expired or new: behaves as a missing key.
    Absent,
    Log(Log),
    Bucket(Bucket),
    /// A sliding window of counters.
    Counters(Counters),
    /// A fixed window or a quota.
    Period(PeriodCount),
    /// A concurrency rule's leases.
    Leases(Leases),
    /// An override of one rule's key: its limit.
    Override(u64),
    /// A block of one rule's key (`lua/extensions.lua`): blocked while
    /// `now < until`; its duration counts for escalation while `now < end`.
    Block { until: i64, duration: i64, end: i64 },
}

struct Entry {
    state: State,
    expires_at: i64,
}

/// Deciding a log first drops its entries that have left the window, as
/// `swl_decide` does (a later call on a clock that stepped back then no
/// longer counts them, on either backend).
fn prune_log(shard: &mut Shard, digest: Digest, args: RuleArgs, now: i64) {
    if let RuleArgs::Window { window_us, .. } = args {
        if let Some(Entry { state: State::Log(log), expires_at }) = shard.map.get_mut(&digest) {
            if *expires_at > now {
                log.prune(now, window_us);
            }
        }
    }
}

pub(crate) use crate::digest::Digest;

/// Identity hashing for digests, which are already uniformly spread.
#[derive(Default, Clone, Copy)]
struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) ^ b as u64;
        }
    }
    fn write_u128(&mut self, n: u128) {
        self.0 = n as u64;
    }
}

type DigestState = std::hash::BuildHasherDefault<DigestHasher>;

struct Shard {
    map: HashMap<Digest, Entry, DigestState>,
    sweep_at: usize,
}

impl Shard {
    fn live(&self, key: Digest, now: i64) -> Option<&Entry> {
        self.map.get(&key).filter(|e| e.expires_at > now)
    }

    /// Drop the expired entries when the map has doubled since the last
    /// sweep and is full to its capacity: an expired entry decides as an
    /// absent one, and until the table would grow, keeping it costs nothing
    /// while sweeping scans the whole table (at 100,000 keys of buckets that
    /// are full again between visits, a sweep every 1,024 admissions per
    /// shard was about a fifth of a check).
    fn maybe_sweep(&mut self, now: i64) {
        if self.map.len() >= self.sweep_at {
            self.map.retain(|_, e| e.expires_at > now);
            self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP).max(self.map.capacity());
        }
    }
}

/// The in-memory store behind `memory://`.
pub(crate) struct MemoryBackend {
    shards: Box<[Mutex<Shard>]>,
    /// The overrides set, by rule and key, for listing (checks read the shards).
    index: Mutex<std::collections::BTreeMap<(String, String), Override>>,
}

#[inline]
fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding a shard cannot leave it half-written (every write
    // happens after all decisions), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn id_hash(call_id: &str) -> u64 {
    // Non-zero, stable within the process.
    foldhash::quality::FixedState::with_seed(0x7468_726f_7474_6c65).hash_one(call_id) | 1
}

impl MemoryBackend {
    pub fn new() -> MemoryBackend {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    map: HashMap::with_hasher(DigestState::default()),
                    sweep_at: MIN_SWEEP,
                })
            })
            .collect();
        MemoryBackend {
            shards,
            index: Mutex::new(Default::default()),
        }
    }

    /// The digest a key is stored under ([`crate::digest::KeyDigest`]):
    /// entries are stored under it rather than the string, so a lookup
    /// compares two integers and a new entry allocates no copy of its key.
    pub fn digest(&self, key: &str) -> Digest {
        crate::digest::KeyDigest::of(key)
    }

    fn shard_of(digest: Digest) -> usize {
        ((digest >> 64) as usize) % SHARDS
    }

    /// Decide (and for [`Mode::Check`], apply) one plan at `now`: rule
    /// `rules[i]` on the key with digest `keys[i]`, all or nothing, with
    /// the overrides and blocks of `plan.ext` (as `lua/extensions.lua`).
    /// The only error: a cost above an override's limit, before anything is written.
    pub fn eval(&self, plan: &Plan<'_, Digest>, mode: Mode, now: i64) -> Result<Outcomes> {
        let (digests, rules, cost, call_id) = (&plan.keys[..], &plan.rules[..], plan.cost, plan.call_id);
        if let ([digest], [rule], true, None, None, None) = (digests, rules, plan.ext.is_empty(), call_id, &plan.lease, &plan.costs) {
            return Ok(smallvec::smallvec![self.eval_one(*digest, rule.args, mode, cost, now)]);
        }
        let n = digests.len();
        let idx: SmallVec<[usize; 4]> = digests.iter().map(|&d| Self::shard_of(d)).collect();
        let mut order = idx.clone();
        for e in &plan.ext {
            order.extend(e.override_key.iter().chain(&e.block_key).map(|&d| Self::shard_of(d)));
        }
        if order.len() > 1 {
            order.sort_unstable();
            order.dedup();
        }
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Shard>); 4]> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        let slot = |i: usize| if order.len() == 1 { 0 } else { order.binary_search(&idx[i]).expect("locked shard") };
        let slot_of = |d: Digest| order.binary_search(&Self::shard_of(d)).expect("locked shard");

        // Overrides and blocks, read first (extensions.lua runs before the replay lookup).
        let mut args: SmallVec<[RuleArgs; 4]> = rules.iter().map(|r| r.args).collect();
        let mut ext_state: SmallVec<[ExtRead; 2]> = SmallVec::new();
        for e in &plan.ext {
            let mut limit = 0;
            if let Some(d) = e.override_key {
                let stored = match guards[slot_of(d)].1.live(d, now).map(|x| &x.state) {
                    Some(State::Override(v)) => Some(*v),
                    _ => None,
                };
                let applies = stored.unwrap_or(rules[e.at].limit);
                if plan.cost_at(e.at) > applies {
                    return Err(cost_above(&rules[e.at].name, plan.cost_at(e.at), applies));
                }
                if let Some(v) = stored {
                    args[e.at] = with_override(args[e.at], v);
                    limit = v;
                }
            }
            let (mut until, mut previous) = (None, None);
            if let Some(d) = e.block_key {
                if let Some(State::Block { until: u, duration, end }) =
                    guards[slot_of(d)].1.live(d, now).map(|x| &x.state)
                {
                    if *end > now {
                        previous = Some(*duration);
                    }
                    if *u > now {
                        until = Some(*u);
                    }
                }
            }
            ext_state.push(ExtRead { limit, until, previous });
        }

        let dedupe = call_id.map(id_hash);
        let lease = plan.lease.as_deref().map_or(0, id_hash);
        // A re-sent call is decided at cost 0 (a peek that records nothing).
        let mut replayed = false;
        let mut mode = mode;
        if let Some(id) = dedupe {
            for i in 0..n {
                let seen = match (guards[slot(i)].1.live(digests[i], now).map(|e| &e.state), args[i]) {
                    (Some(State::Log(log)), RuleArgs::Window { window_us, .. }) => log.seen(now, window_us, id),
                    (Some(State::Bucket(b)), RuleArgs::Bucket { .. }) => b.ids.contains(&id),
                    (Some(State::Counters(c)), RuleArgs::Counters { window_us, precision_us, .. }) => {
                        c.seen(now, window_us, precision_us, id)
                    }
                    (Some(State::Period(p)), RuleArgs::Fixed { .. } | RuleArgs::Quota { .. }) => p.seen(now, id),
                    (Some(State::Leases(l)), RuleArgs::Lease { .. }) => l.seen(now, id),
                    _ => false,
                };
                if seen {
                    mode = Mode::Peek;
                    replayed = true;
                    break;
                }
            }
        }

        let mut outcomes = Outcomes::new();
        // A bucket's micro-tokens left, or a period counter's period end.
        let mut lefts: SmallVec<[u64; 4]> = SmallVec::new();
        let mut all_pass = true;
        let cost_at = |i: usize| if replayed { 0 } else { plan.cost_at(i) };
        for i in 0..n {
            prune_log(&mut guards[slot(i)].1, digests[i], args[i], now);
            // A rule of cost 0 among per-rule costs is decided at 1 and never recorded.
            let probe = plan.costs.is_some() && cost_at(i) == 0;
            let state = guards[slot(i)].1.live(digests[i], now).map(|e| &e.state);
            let (mut o, left) = decide_rule(state, args[i], now, if probe { 1 } else { cost_at(i) });
            if probe && o.allowed {
                o.remaining += 1;
            }
            if !o.allowed && !rules[i].args.shadow() {
                all_pass = false;
            }
            outcomes.push(o);
            lefts.push(left);
        }

        // Blocks: in force, or set by this denial (extensions.lua's ext_apply).
        for (e, &ExtRead { limit, until, previous }) in plan.ext.iter().zip(&ext_state) {
            let o = &mut outcomes[e.at];
            o.limit = limit;
            if let Some(u) = until {
                *o = Outcome { allowed: false, remaining: 0, retry_after_us: u - now, reset_after_us: u - now, limit, blocked: true };
            } else if let (Some(b), Some(key), false, Mode::Check) = (e.ext.block, e.block_key, o.allowed, mode) {
                let d = match previous {
                    Some(p) => ((p as f64 * b.factor).floor() as i64).min(b.max_us),
                    None => b.duration_us,
                };
                let u = now + d;
                let shard = &mut guards[slot_of(key)].1;
                shard.map.insert(key, Entry { state: State::Block { until: u, duration: d, end: u + b.period_us }, expires_at: u + b.period_us });
                o.remaining = 0;
                o.retry_after_us = o.retry_after_us.max(d);
                o.reset_after_us = o.reset_after_us.max(d);
                o.blocked = true;
            }
            if o.blocked && !args[e.at].shadow() {
                all_pass = false;
            }
        }

        if !all_pass {
            // Nothing is recorded: a rule that would have admitted still has what it had.
            for (i, o) in outcomes.iter_mut().enumerate().filter(|(_, o)| o.allowed) {
                o.remaining += cost_at(i);
            }
        }
        if mode == Mode::Check && all_pass {
            for i in 0..n {
                let o = outcomes[i];
                // A rule of cost 0 (in a check over several items) records nothing.
                if !o.allowed || cost_at(i) == 0 {
                    continue;
                }
                commit_rule(&mut guards[slot(i)].1, digests[i], args[i], &o, lefts[i], now, cost_at(i), dedupe, lease);
            }
            for (_, g) in guards.iter_mut() {
                g.maybe_sweep(now);
            }
        }
        Ok(outcomes)
    }

    /// [`MemoryBackend::eval`] of the commonest plan, one key without
    /// overrides, blocks or a call id: one shard locked, no lists built.
    #[inline]
    pub(crate) fn eval_one(&self, digest: Digest, args: RuleArgs, mode: Mode, cost: u64, now: i64) -> Outcome {
        use std::collections::hash_map::Entry as Slot;
        let mut shard = lock(&self.shards[Self::shard_of(digest)]);
        // One lookup, whether the key exists or not: a live entry is pruned,
        // decided and written in place; an expired one is decided as absent
        // and written over; a new one is made only when admitted. A bucket
        // that writes nothing takes its waits once the lock is given back:
        // they are arithmetic on the outcome alone.
        let mut waits_later = false;
        let mut o = match shard.map.entry(digest) {
            Slot::Occupied(mut slot) => {
                let entry = slot.get_mut();
                let live = entry.expires_at > now;
                if let (true, State::Log(log), RuleArgs::Window { window_us, .. }) = (live, &mut entry.state, args) {
                    log.prune(now, window_us);
                }
                let (mut o, left) = decide_rule_here::<true>(live.then_some(&entry.state), args, now, cost);
                if let RuleArgs::Bucket { rate, .. } = args {
                    if mode == Mode::Check && o.allowed {
                        Bucket::waits(&mut o, rate);
                    } else {
                        waits_later = true;
                    }
                }
                if mode == Mode::Check && o.allowed {
                    if !live {
                        entry.state = State::Absent;
                    }
                    commit_entry(entry, args, &o, left, now, cost, None, 0);
                }
                o
            }
            Slot::Vacant(slot) => {
                let (o, left) = decide_rule(None, args, now, cost);
                if mode == Mode::Check && o.allowed {
                    let entry = slot.insert(Entry { state: State::Absent, expires_at: now });
                    commit_entry(entry, args, &o, left, now, cost, None, 0);
                }
                o
            }
        };
        if mode == Mode::Check && (o.allowed || args.shadow()) {
            shard.maybe_sweep(now);
        }
        drop(shard);
        if let (true, RuleArgs::Bucket { rate, .. }) = (waits_later, args) {
            Bucket::waits(&mut o, rate);
        }
        o
    }

    /// Store the override `entry` of `key` (stored under `side`) of `rule`,
    /// or clear it (`None`); returns whether one was there. The override
    /// and its listing change under one lock, so they never disagree.
    pub fn put_override(&self, rule: &str, key: &str, side: &str, entry: Option<Override>) -> bool {
        let mut index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        let d = self.digest(side);
        let mut g = lock(&self.shards[Self::shard_of(d)]);
        let at = (rule.to_string(), key.to_string());
        let old = match entry {
            Some(e) => {
                let old = g.map.insert(d, Entry { state: State::Override(e.limit), expires_at: i64::MAX });
                index.insert(at, e);
                old
            }
            None => {
                index.remove(&at);
                g.map.remove(&d)
            }
        };
        matches!(old, Some(Entry { state: State::Override(_), .. }))
    }

    /// The overrides of `rule`, in key order.
    pub fn overrides_of(&self, rule: &str) -> Vec<Override> {
        let index = self.index.lock().unwrap_or_else(|p| p.into_inner());
        index.iter().filter(|((r, _), _)| r == rule).map(|(_, e)| e.clone()).collect()
    }

    /// Settle the check `plan.call_id` (made at cost `plan.cost`) to
    /// `actual` at `now`, atomically over every rule of the plan: mirror of
    /// `lua/settle.lua`. Which rules were settled.
    pub fn settle(&self, plan: &Plan<'_, Digest>, actual: u64, now: i64) -> Settled {
        let Some(call_id) = plan.call_id else { return Settled::from_elem(SettleOutcome::Unchanged, plan.keys.len()) };
        let id = id_hash(call_id);
        let digests = &plan.keys[..];
        let n = digests.len();
        let idx: SmallVec<[usize; 4]> = digests.iter().map(|&d| Self::shard_of(d)).collect();
        let mut order = idx.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Shard>); 4]> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        use SettleOutcome::{PushedOut, Settled as Done, Unchanged};
        let mut out = Settled::new();
        for i in 0..n {
            let rule = plan.rules[i];
            let actual = actual.min(rule.limit);
            let estimate = plan.cost;
            let shard = &mut guards[order.binary_search(&idx[i]).expect("locked shard")].1;
            let Some(entry) = shard.map.get_mut(&digests[i]).filter(|e| e.expires_at > now) else {
                out.push(Unchanged);
                continue;
            };
            let lost = |pushed: bool| if pushed { PushedOut } else { Unchanged };
            let done = match (&mut entry.state, rule.args) {
                (State::Log(log), RuleArgs::Window { window_us, .. }) => {
                    if log.settle(now, id, estimate, actual, window_us) {
                        if log.len() == 0 {
                            entry.state = State::Absent;
                        }
                        Done
                    } else {
                        lost(log.pushed_out(now, id, window_us))
                    }
                }
                (State::Bucket(b), RuleArgs::Bucket { capacity, rate, .. }) => {
                    match b.settle(now, id, estimate, actual, capacity, rate) {
                        Some(full_in) => {
                            entry.expires_at = now + ceil_ms(full_in).max(1) * 1000;
                            Done
                        }
                        None => lost(b.pushed_out(id)),
                    }
                }
                (State::Counters(c), RuleArgs::Counters { window_us, precision_us, .. }) => {
                    match c.settle(now, id, estimate, actual, window_us, precision_us) {
                        Some(left) => {
                            if !left {
                                entry.state = State::Absent;
                            }
                            Done
                        }
                        None => lost(c.pushed_out(now, id, window_us, precision_us)),
                    }
                }
                (State::Period(p), RuleArgs::Fixed { .. } | RuleArgs::Quota { .. }) => {
                    match p.settle(now, id, estimate, actual) {
                        Some(left) => {
                            if !left {
                                entry.state = State::Absent;
                            }
                            Done
                        }
                        None => lost(p.pushed_out(now, id)),
                    }
                }
                _ => Unchanged,
            };
            out.push(done);
        }
        out
    }

    /// Release (`extend_to` `None`) or extend to end at `extend_to` the
    /// lease `lease_id` on these keys of concurrency rules, at `now`:
    /// mirror of `lua/concurrency.lua`'s modes `d` and `e`. Per key, whether
    /// the lease held slots there.
    pub fn lease(&self, keys: &[Digest], lease_id: &str, extend_to: Option<i64>, now: i64) -> super::Held {
        let id = id_hash(lease_id);
        keys.iter()
            .map(|&d| {
                let mut g = lock(&self.shards[Self::shard_of(d)]);
                let Some(entry) = g.map.get_mut(&d).filter(|e| e.expires_at > now) else { return false };
                let State::Leases(l) = &mut entry.state else { return false };
                let done = match extend_to {
                    None => l.release(now, id),
                    Some(end) => l.extend(now, id, end),
                };
                if l.len() == 0 {
                    entry.state = State::Absent;
                } else {
                    entry.expires_at = l.latest();
                }
                done
            })
            .collect()
    }

    /// Drop every entry (the limiter was closed).
    pub fn clear(&self) {
        self.index.lock().unwrap_or_else(|p| p.into_inner()).clear();
        for s in self.shards.iter() {
            let mut g = lock(s);
            g.map = HashMap::with_hasher(DigestState::default());
            g.sweep_at = MIN_SWEEP;
        }
    }

    /// Forget `keys`; returns how many existed.
    pub fn reset(&self, keys: &[String], now: i64) -> u64 {
        let mut n = 0;
        for key in keys {
            let d = self.digest(key);
            let mut g = lock(&self.shards[Self::shard_of(d)]);
            if let Some(e) = g.map.remove(&d) {
                if e.expires_at > now {
                    n += 1;
                }
            }
        }
        n
    }

    /// Entries held, expired ones not yet swept included.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Units stored in sliding-window logs, sub-windows of counters, and
    /// buckets and period counters held (for tests and stats).
    #[allow(dead_code)]
    pub fn log_units(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                lock(s)
                    .map
                    .values()
                    .map(|e| match &e.state {
                        State::Log(l) => l.len(),
                        State::Counters(c) => c.len(),
                        State::Leases(l) => l.len(),
                        State::Bucket(_) | State::Period(_) => 1,
                        State::Absent | State::Override(_) | State::Block { .. } => 0,
                    })
                    .sum::<usize>()
            })
            .sum()
    }
}

/// What a check read of one rule's override and block before deciding.
#[derive(Clone, Copy)]
struct ExtRead {
    /// The override's limit (0: none).
    limit: u64,
    /// The end of the block in force.
    until: Option<i64>,
    /// The previous block's duration, while its record holds (for escalation).
    previous: Option<i64>,
}

/// A rule's arguments under an override of `limit`: the limit replaced; a
/// bucket's capacity replaced and its rate scaled alike (as extensions.lua).
pub(crate) fn with_override(args: RuleArgs, limit: u64) -> RuleArgs {
    match args {
        RuleArgs::Window { window_us, shadow, .. } => RuleArgs::Window { limit, window_us, shadow },
        RuleArgs::Bucket { capacity, rate, shadow } => {
            RuleArgs::Bucket { capacity: limit, rate: rate * limit as f64 / capacity as f64, shadow }
        }
        RuleArgs::Counters { window_us, precision_us, shadow, .. } => {
            RuleArgs::Counters { limit, window_us, precision_us, shadow }
        }
        RuleArgs::Fixed { window_us, shadow, .. } => RuleArgs::Fixed { limit, window_us, shadow },
        RuleArgs::Quota { period, offset_s, shadow, .. } => RuleArgs::Quota { limit, period, offset_s, shadow },
        RuleArgs::Lease { lease_us, shadow, .. } => RuleArgs::Lease { limit, lease_us, shadow },
    }
}

/// One rule's outcome on its key's state (`None`: absent or expired), and
/// the figure its commit needs: a bucket's micro-tokens left, or a period
/// counter's period end.
fn decide_rule(state: Option<&State>, args: RuleArgs, now: i64, cost: u64) -> (Outcome, u64) {
    decide_rule_here::<false>(state, args, now, cost)
}

/// [`decide_rule`] made where it is called: the outcome stays in registers
/// on the way to the caller's commit and answer, rather than being written
/// to memory and read back (which, written field by field and read back in
/// wider loads, waits for the stores to retire).
///
/// With `WAITS_LATER`, a bucket's waits are left for [`Bucket::waits`]
/// (see [`Bucket::decide_needs`]).
#[inline(always)]
fn decide_rule_here<const WAITS_LATER: bool>(state: Option<&State>, args: RuleArgs, now: i64, cost: u64) -> (Outcome, u64) {
    match args {
        RuleArgs::Lease { limit, lease_us, .. } => {
            let o = match state {
                Some(State::Leases(l)) => l.decide(now, cost, limit, lease_us),
                _ => Leases::default().decide(now, cost, limit, lease_us),
            };
            (o, 0)
        }
        RuleArgs::Window { limit, window_us, .. } => {
            let o = match state {
                Some(State::Log(log)) => log.decide(now, cost, limit, window_us),
                _ => Log::default().decide(now, cost, limit, window_us),
            };
            (o, 0)
        }
        RuleArgs::Bucket { capacity, rate, .. } => {
            let state = match state {
                Some(State::Bucket(b)) => Some(b),
                _ => None,
            };
            if WAITS_LATER {
                Bucket::decide_needs(state, now, cost, capacity, rate)
            } else {
                Bucket::decide(state, now, cost, capacity, rate)
            }
        }
        RuleArgs::Counters { limit, window_us, precision_us, .. } => {
            let o = match state {
                Some(State::Counters(c)) => c.decide(now, cost, limit, window_us, precision_us),
                _ => Counters::default().decide(now, cost, limit, window_us, precision_us),
            };
            (o, 0)
        }
        RuleArgs::Fixed { limit, window_us: p, .. } | RuleArgs::Quota { limit, offset_s: p, .. } => {
            let period_end = match args {
                RuleArgs::Quota { period, .. } => quota_end(now, period, p),
                _ => fixed_end(now, p),
            };
            let state = match state {
                Some(State::Period(c)) => Some(c),
                _ => None,
            };
            let (o, end) = PeriodCount::decide(state, now, cost, limit, period_end);
            (o, end as u64)
        }
    }
}

/// Apply an admitted rule's outcome `o` to its key (see [`decide_rule`] for `left`).
#[allow(clippy::too_many_arguments)]
fn commit_rule(shard: &mut Shard, digest: Digest, args: RuleArgs, o: &Outcome, left: u64, now: i64, cost: u64, dedupe: Option<u64>, lease: u64) {
    // Look the key up once; allocate a key only for a new entry.
    let entry = match shard.map.get_mut(&digest) {
        Some(e) => {
            if e.expires_at <= now {
                e.state = State::Absent;
            }
            e
        }
        None => shard.map.entry(digest).or_insert(Entry { state: State::Absent, expires_at: now }),
    };
    commit_entry(entry, args, o, left, now, cost, dedupe, lease);
}

/// [`commit_rule`] on the key's entry (live, or `Absent`), already looked up.
#[allow(clippy::too_many_arguments)]
fn commit_entry(entry: &mut Entry, args: RuleArgs, o: &Outcome, left: u64, now: i64, cost: u64, dedupe: Option<u64>, lease: u64) {
    let expires_at = now + ceil_ms(o.reset_after_us).max(1) * 1000;
    entry.expires_at = expires_at;
    match args {
        RuleArgs::Lease { lease_us, .. } => {
            if !matches!(entry.state, State::Leases(_)) {
                entry.state = State::Leases(Leases::default());
            }
            if let State::Leases(l) = &mut entry.state {
                // Expires exactly when its latest lease ends.
                entry.expires_at = l.commit(now, cost, lease_us, lease);
            }
        }
        RuleArgs::Window { window_us, .. } => {
            if !matches!(entry.state, State::Log(_)) {
                entry.state = State::Log(Log::default());
            }
            if let State::Log(log) = &mut entry.state {
                log.commit(now, cost, window_us, dedupe.unwrap_or(0));
            }
        }
        RuleArgs::Bucket { .. } => {
            if !matches!(entry.state, State::Bucket(_)) {
                entry.state = State::Bucket(Bucket { tokens: 0, last: now, ids: Vec::new() });
            }
            let State::Bucket(bucket) = &mut entry.state else { return };
            bucket.last = bucket.last.max(now);
            bucket.tokens = left as i64;
            if let Some(id) = dedupe {
                bucket.ids.push(id);
                if bucket.ids.len() > TB_IDS {
                    bucket.ids.remove(0);
                }
            }
        }
        RuleArgs::Counters { window_us, precision_us, .. } => {
            if !matches!(entry.state, State::Counters(_)) {
                entry.state = State::Counters(Counters::default());
            }
            if let State::Counters(c) = &mut entry.state {
                c.commit(now, cost, window_us, precision_us, dedupe);
            }
        }
        RuleArgs::Fixed { .. } | RuleArgs::Quota { .. } => {
            let previous = match &mut entry.state {
                State::Period(p) => Some(p),
                _ => None,
            };
            let next = PeriodCount::commit(previous, now, cost, left as i64, dedupe);
            entry.state = State::Period(next);
        }
    }
}

fn ceil_ms(us: i64) -> i64 {
    (us + 999).div_euclid(1000)
}

//! The embedded in-memory backend: the same algorithms and stacking as Redis,
//! in process.
//!
//! Keys live in 64 shards, each behind its own mutex; a check locks only the
//! shards of its own keys, in index order (so two checks never deadlock), and
//! decides all of its rules before writing any. Expired keys are treated as
//! absent, and each shard sweeps them out whenever it has doubled in size
//! since its last sweep, so memory stays bounded under a stream of new keys.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Mutex, MutexGuard};

use smallvec::SmallVec;

use crate::algo::{Bucket, Log, Outcome, TB_IDS};
use crate::backend::{Mode, Plan, RuleArgs, Verdict};

const SHARDS: usize = 64;
const MIN_SWEEP: usize = 1024;

enum State {
    /// Expired or new: behaves as a missing key.
    Absent,
    Log(Log),
    Bucket(Bucket),
}

struct Entry {
    state: State,
    expires_at: i64,
}

struct Shard {
    map: HashMap<String, Entry, foldhash::fast::RandomState>,
    sweep_at: usize,
}

impl Shard {
    fn live(&self, key: &str, now: i64) -> Option<&Entry> {
        self.map.get(key).filter(|e| e.expires_at > now)
    }

    fn maybe_sweep(&mut self, now: i64) {
        if self.map.len() >= self.sweep_at {
            self.map.retain(|_, e| e.expires_at > now);
            self.sweep_at = (self.map.len() * 2).max(MIN_SWEEP);
        }
    }
}

/// The in-memory store behind `memory://`.
pub(crate) struct MemoryBackend {
    shards: Box<[Mutex<Shard>]>,
    hasher: foldhash::fast::RandomState,
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding a shard cannot leave it half-written (every write
    // happens after all decisions), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn id_hash(call_id: &str) -> u64 {
    // Non-zero, stable within the process.
    let mut h = foldhash::quality::FixedState::with_seed(0x7468_726f_7474_6c65).build_hasher();
    call_id.hash(&mut h);
    h.finish() | 1
}

impl MemoryBackend {
    pub fn new() -> MemoryBackend {
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    map: HashMap::with_hasher(foldhash::fast::RandomState::default()),
                    sweep_at: MIN_SWEEP,
                })
            })
            .collect();
        MemoryBackend {
            shards,
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    fn shard_of(&self, key: &str) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }

    /// Decide (and for [`Mode::Check`], apply) one plan at `now`.
    pub fn eval(&self, plan: &Plan, mode: Mode, now: i64) -> Verdict {
        let idx: SmallVec<[usize; 4]> = plan.keys.iter().map(|k| self.shard_of(k)).collect();
        let mut order = idx.clone();
        order.sort_unstable();
        order.dedup();
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Shard>); 4]> =
            order.iter().map(|&i| (i, lock(&self.shards[i]))).collect();
        let slot = |i: usize| order.binary_search(&idx[i]).expect("locked shard");

        let dedupe = plan.call_id.as_deref().map(id_hash);
        let mut cost = plan.cost;
        let mut mode = mode;
        if let Some(id) = dedupe {
            for (i, key) in plan.keys.iter().enumerate() {
                let seen = match guards[slot(i)].1.live(key, now).map(|e| &e.state) {
                    Some(State::Log(log)) => log.seen(id),
                    Some(State::Bucket(b)) => b.ids.contains(&id),
                    Some(State::Absent) | None => false,
                };
                if seen {
                    mode = Mode::Peek;
                    cost = 0;
                    break;
                }
            }
        }

        let mut outcomes: SmallVec<[Outcome; 4]> = SmallVec::new();
        let mut lefts: SmallVec<[u64; 4]> = SmallVec::new();
        let mut all_pass = true;
        for (i, key) in plan.keys.iter().enumerate() {
            let entry = guards[slot(i)].1.live(key, now);
            let (o, left) = match plan.compiled[i].args {
                RuleArgs::Window { limit, window_us, .. } => {
                    let o = match entry.map(|e| &e.state) {
                        Some(State::Log(log)) => log.decide(now, cost, limit, window_us),
                        _ => Log::default().decide(now, cost, limit, window_us),
                    };
                    (o, 0)
                }
                RuleArgs::Bucket { capacity, rate, .. } => {
                    let state = match entry.map(|e| &e.state) {
                        Some(State::Bucket(b)) => Some(b),
                        _ => None,
                    };
                    Bucket::decide(state, now, cost, capacity, rate)
                }
            };
            if !o.allowed && !plan.compiled[i].args.shadow() {
                all_pass = false;
            }
            outcomes.push(o);
            lefts.push(left);
        }

        if mode == Mode::Check && all_pass {
            let stored_id = dedupe.unwrap_or(0);
            for (i, key) in plan.keys.iter().enumerate() {
                let o = outcomes[i];
                if !o.allowed {
                    continue;
                }
                let shard = &mut guards[slot(i)].1;
                let expires_at = now + ceil_ms(o.reset_after_us).max(1) * 1000;
                // Look the key up once; allocate a key only for a new entry.
                let entry = match shard.map.get_mut(key.as_str()) {
                    Some(e) => {
                        if e.expires_at <= now {
                            e.state = State::Absent;
                        }
                        e
                    }
                    None => shard.map.entry(key.clone()).or_insert(Entry {
                        state: State::Absent,
                        expires_at,
                    }),
                };
                entry.expires_at = expires_at;
                match plan.compiled[i].args {
                    RuleArgs::Window { window_us, .. } => {
                        if !matches!(entry.state, State::Log(_)) {
                            entry.state = State::Log(Log::default());
                        }
                        if let State::Log(log) = &mut entry.state {
                            log.commit(now, cost, window_us, stored_id);
                        }
                    }
                    RuleArgs::Bucket { .. } => {
                        if !matches!(entry.state, State::Bucket(_)) {
                            entry.state = State::Bucket(Bucket { tokens: 0, last: now, ids: Vec::new() });
                        }
                        let State::Bucket(bucket) = &mut entry.state else { continue };
                        bucket.last = bucket.last.max(now);
                        bucket.tokens = lefts[i];
                        if let Some(id) = dedupe {
                            bucket.ids.push(id);
                            if bucket.ids.len() > TB_IDS {
                                bucket.ids.remove(0);
                            }
                        }
                    }
                }
            }
            for (_, g) in guards.iter_mut() {
                g.maybe_sweep(now);
            }
        }
        Verdict { outcomes }
    }

    /// Forget `keys`; returns how many existed.
    pub fn reset(&self, keys: &[String], now: i64) -> u64 {
        let mut n = 0;
        for key in keys {
            let mut g = lock(&self.shards[self.shard_of(key)]);
            if let Some(e) = g.map.remove(key.as_str()) {
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

    /// Units stored in sliding-window logs and buckets held (for tests and stats).
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
                        State::Bucket(_) => 1,
                        State::Absent => 0,
                    })
                    .sum::<usize>()
            })
            .sum()
    }
}

fn ceil_ms(us: i64) -> i64 {
    (us + 999).div_euclid(1000)
}

//! The two algorithms in Rust, step for step the same arithmetic as
//! `lua/sliding_window_log.lua` and `lua/token_bucket.lua`, so the embedded
//! backend decides exactly like Redis. Times are integer microseconds.

use std::collections::VecDeque;

/// One rule's answer, in the units the Lua script returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub allowed: bool,
    pub remaining: u64,
    pub retry_after_us: i64,
    pub reset_after_us: i64,
}

/// A sliding-window log: admission times (sorted) and, once any call asked
/// for deduplication, the id of the call behind each (0 for none) in a
/// parallel queue, so a log of calls without ids costs 8 bytes per unit.
///
/// The oldest and newest times are also kept beside the entries, so the
/// usual decision (nothing has left the window) reads no entry at all: with
/// many keys, every entry read is a cache miss.
#[derive(Debug, Default, Clone)]
pub(crate) struct Log {
    times: VecDeque<i64>,
    /// `None`, or one id per entry of `times` (boxed: most logs never have
    /// one, and the log sits in the hash table's entry, which stays small).
    #[allow(clippy::box_collection)] // 8 bytes in the entry instead of 32
    ids: Option<Box<VecDeque<u64>>>,
    /// The oldest entry's time (meaningless while the log is empty).
    first: i64,
    /// The newest entry's time (meaningless while the log is empty).
    newest: i64,
}

impl Log {
    fn first_in_window(&self, floor: i64) -> usize {
        if self.times.is_empty() || self.first > floor {
            return 0;
        }
        // Commits drop expired entries, so usually none or a few lead the
        // log: look at the front first, and search only a long expired run.
        for (i, &ts) in self.times.iter().take(8).enumerate() {
            if ts > floor {
                return i;
            }
        }
        self.times.partition_point(|&ts| ts <= floor)
    }

    /// Mirror of `swl_decide`.
    pub fn decide(&self, now: i64, cost: u64, limit: u64, window: i64) -> Outcome {
        let floor = now - window;
        let start = self.first_in_window(floor);
        let count = (self.times.len() - start) as u64;
        let newest_reset = self.newest + window - now;
        if count + cost <= limit {
            let mut reset = if cost > 0 { window } else { 0 };
            if count > 0 {
                reset = reset.max(newest_reset);
            }
            return Outcome {
                allowed: true,
                remaining: limit - count - cost,
                retry_after_us: 0,
                reset_after_us: reset,
            };
        }
        let need = (count + cost - limit) as usize;
        let nth = self.times[start + need - 1];
        Outcome {
            allowed: false,
            remaining: limit - count,
            retry_after_us: nth + window - now,
            reset_after_us: if count > 0 { newest_reset } else { 0 },
        }
    }

    /// Mirror of the replay lookup for logs (`seen` in `lua/replay.lua`).
    pub fn seen(&self, id: u64) -> bool {
        self.ids.as_ref().is_some_and(|ids| ids.contains(&id))
    }

    /// Mirror of `swl_commit` (with the pruning `swl_decide` does first);
    /// `id` 0 records no id.
    pub fn commit(&mut self, now: i64, cost: u64, window: i64, id: u64) {
        let floor = now - window;
        if !self.times.is_empty() && self.first <= floor {
            while matches!(self.times.front(), Some(&ts) if ts <= floor) {
                self.times.pop_front();
                if let Some(ids) = &mut self.ids {
                    ids.pop_front();
                }
            }
            if let Some(&ts) = self.times.front() {
                self.first = ts;
            }
        }
        if cost == 0 {
            return;
        }
        if id != 0 && self.ids.is_none() {
            self.ids = Some(Box::new(std::iter::repeat_n(0, self.times.len()).collect()));
        }
        if self.times.is_empty() {
            self.first = now;
            self.newest = now;
        }
        let n = cost as usize;
        if now >= self.newest {
            // The usual case: the newest admission so far goes at the end.
            self.times.extend(std::iter::repeat_n(now, n));
            if let Some(ids) = &mut self.ids {
                ids.extend(std::iter::repeat_n(id, n));
            }
            self.newest = now;
        } else {
            // A clock that stepped back: keep the entries sorted.
            let at = self.times.partition_point(|&ts| ts <= now);
            for _ in 0..n {
                self.times.insert(at, now);
                if let Some(ids) = &mut self.ids {
                    ids.insert(at, id);
                }
            }
            self.first = self.first.min(now);
        }
    }

    /// Units stored (for memory accounting).
    pub fn len(&self) -> usize {
        self.times.len()
    }
}

const MICRO: u64 = 1_000_000;

/// Mirror of `tb_wait`: microseconds until `need` micro-tokens are refilled.
fn tb_wait(need: u64, rate: f64) -> i64 {
    if need == 0 {
        return 0;
    }
    let need_f = need as f64;
    let mut wait = (need_f / rate).ceil();
    if (wait * rate).floor() < need_f {
        wait += 1.0;
    }
    wait as i64
}

/// How many recent call ids a bucket remembers (`TB_IDS` in the Lua).
pub(crate) const TB_IDS: usize = 64;

/// A token bucket: micro-tokens, the time of the last admission, and the ids
/// of the last [`TB_IDS`] admitted calls that asked for deduplication.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    pub tokens: u64,
    pub last: i64,
    pub ids: Vec<u64>,
}

impl Bucket {
    /// Mirror of `tb_decide`; the second value is the micro-tokens left after
    /// the request (for `commit`).
    pub fn decide(
        state: Option<&Bucket>,
        now: i64,
        cost: u64,
        capacity: u64,
        rate: f64,
    ) -> (Outcome, u64) {
        let full = capacity * MICRO;
        let mut tokens = full;
        if let Some(b) = state {
            tokens = b.tokens;
            if now > b.last {
                let refill = ((now - b.last) as f64 * rate).floor();
                if refill >= (full - tokens) as f64 {
                    tokens = full;
                } else {
                    tokens += refill as u64;
                }
            }
        }
        let want = cost * MICRO;
        if tokens >= want {
            let left = tokens - want;
            (
                Outcome {
                    allowed: true,
                    remaining: left / MICRO,
                    retry_after_us: 0,
                    reset_after_us: tb_wait(full - left, rate),
                },
                left,
            )
        } else {
            (
                Outcome {
                    allowed: false,
                    remaining: tokens / MICRO,
                    retry_after_us: tb_wait(want - tokens, rate),
                    reset_after_us: tb_wait(full - tokens, rate),
                },
                tokens,
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_boundaries() {
        let mut log = Log::default();
        let w = 1_000_000;
        for i in 0..3 {
            let o = log.decide(i, 1, 3, w);
            assert!(o.allowed);
            log.commit(i, 1, w, 0);
        }
        let o = log.decide(10, 1, 3, w);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_us, w - 10);
        let o = log.decide(10, 2, 3, w);
        assert_eq!(o.retry_after_us, 1 + w - 10);
        assert!(log.decide(w, 1, 3, w).allowed);
    }

    #[test]
    fn log_ids_start_late_and_clock_steps_back() {
        let mut log = Log::default();
        let w = 1_000;
        log.commit(100, 2, w, 0);
        assert!(!log.seen(7));
        log.commit(200, 1, w, 7);
        assert!(log.seen(7));
        // A clock that stepped back: the entry goes in order, the newest stays.
        log.commit(150, 1, w, 9);
        assert!(log.seen(9));
        assert_eq!(log.times, [100, 100, 150, 200]);
        assert_eq!(*log.ids.as_deref().unwrap(), [0, 0, 9, 7]);
        assert_eq!((log.first, log.newest), (100, 200));
        // The two oldest leave the window; the decision sees the other two.
        let o = log.decide(1_100, 1, 3, w);
        assert_eq!((o.allowed, o.remaining, o.reset_after_us), (true, 0, w));
        log.commit(1_100, 1, w, 0);
        assert_eq!(log.times, [150, 200, 1_100]);
        assert_eq!(*log.ids.as_deref().unwrap(), [9, 7, 0]);
        assert_eq!((log.first, log.newest), (150, 1_100));
        let o = log.decide(1_100, 1, 3, w);
        assert_eq!((o.allowed, o.retry_after_us, o.reset_after_us), (false, 50, w));
    }

    #[test]
    fn bucket_waits_are_exact() {
        let (o, left) = Bucket::decide(None, 0, 10, 10, 3.0);
        assert!(o.allowed);
        assert_eq!(left, 0);
        let b = Bucket { tokens: left, last: 0, ids: Vec::new() };
        let (o, _) = Bucket::decide(Some(&b), 0, 1, 10, 3.0);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_us, 333_334);
        let (o, _) = Bucket::decide(Some(&b), 333_334, 1, 10, 3.0);
        assert!(o.allowed);
        let (o, _) = Bucket::decide(Some(&b), 333_333, 1, 10, 3.0);
        assert!(!o.allowed);
    }
}

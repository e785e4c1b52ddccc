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

/// A sliding-window log: admission times (sorted) with the id of the call
/// that admitted them (0 when the call asked for no deduplication).
#[derive(Debug, Default, Clone)]
pub(crate) struct Log {
    entries: VecDeque<(i64, u64)>,
}

impl Log {
    fn first_in_window(&self, floor: i64) -> usize {
        // Commits drop expired entries, so usually none or a few lead the
        // log: look at the front first, and search only a long expired run.
        for (i, &(ts, _)) in self.entries.iter().take(8).enumerate() {
            if ts > floor {
                return i;
            }
        }
        self.entries.partition_point(|&(ts, _)| ts <= floor)
    }

    /// Mirror of `swl_decide`.
    pub fn decide(&self, now: i64, cost: u64, limit: u64, window: i64) -> Outcome {
        let floor = now - window;
        let start = self.first_in_window(floor);
        let count = (self.entries.len() - start) as u64;
        let newest_reset = || self.entries.back().map(|&(ts, _)| ts + window - now);
        if count + cost <= limit {
            let mut reset = if cost > 0 { window } else { 0 };
            if count > 0 {
                reset = reset.max(newest_reset().unwrap_or(0));
            }
            return Outcome {
                allowed: true,
                remaining: limit - count - cost,
                retry_after_us: 0,
                reset_after_us: reset,
            };
        }
        let need = (count + cost - limit) as usize;
        let nth = self.entries[start + need - 1].0;
        Outcome {
            allowed: false,
            remaining: limit - count,
            retry_after_us: nth + window - now,
            reset_after_us: newest_reset().unwrap_or(0),
        }
    }

    /// Mirror of `swl_seen`.
    pub fn seen(&self, id: u64) -> bool {
        self.entries.iter().any(|&(_, i)| i == id)
    }

    /// Mirror of `swl_commit`.
    pub fn commit(&mut self, now: i64, cost: u64, window: i64, id: u64) {
        let floor = now - window;
        while matches!(self.entries.front(), Some(&(ts, _)) if ts <= floor) {
            self.entries.pop_front();
        }
        let at = self.entries.partition_point(|&(ts, _)| ts <= now);
        if at == self.entries.len() {
            self.entries.extend(std::iter::repeat_n((now, id), cost as usize));
        } else {
            for _ in 0..cost {
                self.entries.insert(at, (now, id));
            }
        }
    }

    /// Units stored (for memory accounting).
    pub fn len(&self) -> usize {
        self.entries.len()
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

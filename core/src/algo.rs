//! The algorithms in Rust, step for step the same arithmetic as
//! `lua/sliding_window_log.lua`, `lua/token_bucket.lua`,
//! `lua/sliding_window.lua` and `lua/period_counter.lua`, so the embedded
//! backend decides exactly like Redis. Times are integer microseconds.

use std::collections::VecDeque;

use crate::policy::Period;

/// One rule's answer, in the units the Lua script returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Outcome {
    pub allowed: bool,
    pub remaining: u64,
    pub retry_after_us: i64,
    pub reset_after_us: i64,
    /// The limit an override set for this key (0: the rule's own applied).
    pub limit: u64,
    /// Denied by a block (set now or earlier) rather than the algorithm alone.
    pub blocked: bool,
}

/// The form a settled call's id keeps in a list of recent ids: every id
/// is odd (`id_hash`), its settled form even, so it matches no call any
/// more and still tells a second settle that the call was settled (the
/// `"<tag>!"` of `lua/settle.lua`).
pub(crate) fn settled_id(id: u64) -> u64 {
    id ^ 1
}

/// Mirror of `lost` in `lua/settle.lua`, for a call not found among
/// `ids`: pushed out when no entry is its settled form and 64 of them are
/// live (all newer calls').
fn pushed_out<T: Copy>(ids: &[T], id: u64, of: impl Fn(T) -> u64, live: impl Fn(T) -> bool) -> bool {
    let settled = settled_id(id);
    !ids.iter().any(|&e| of(e) == settled) && ids.iter().filter(|&&e| live(e)).count() >= TB_IDS
}

/// How many recent call ids a sliding-window log remembers (as many as a
/// bucket; the header of `lua/sliding_window_log.lua`).
pub(crate) const LOG_IDS: usize = TB_IDS;

/// A sliding-window log: admission times (sorted, one per unit) and the ids
/// of the last [`LOG_IDS`] admitted calls that asked for deduplication, with
/// their times (boxed and absent until one does: most logs never have one),
/// so a log of calls without ids costs 8 bytes per unit.
///
/// The oldest and newest times are also kept beside the entries, so the
/// usual decision (nothing has left the window) reads no entry at all: with
/// many keys, every entry read is a cache miss.
#[derive(Debug, Default, Clone)]
pub(crate) struct Log {
    times: VecDeque<i64>,
    /// (time, call id) of recent admissions with an id, oldest first.
    #[allow(clippy::box_collection)] // 8 bytes in the entry instead of 24
    ids: Option<Box<Vec<(i64, u64)>>>,
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
                limit: 0,
                blocked: false,
            };
        }
        let need = (count + cost - limit) as usize;
        let nth = self.times[start + need - 1];
        Outcome {
            allowed: false,
            remaining: limit.saturating_sub(count),
            retry_after_us: nth + window - now,
            reset_after_us: if count > 0 { newest_reset } else { 0 },
            limit: 0,
            blocked: false,
        }
    }

    /// The time of call `id` among the recent ids while its check still
    /// counts (`log_check_time` in `lua/replay.lua`).
    fn check_time(&self, now: i64, window: i64, id: u64) -> Option<(usize, i64)> {
        let ids = self.ids.as_ref()?;
        ids.iter().enumerate().find(|&(_, &(t, i))| i == id && t + window > now).map(|(at, &(t, _))| (at, t))
    }

    /// Mirror of the replay lookup for logs (`seen` in `lua/replay.lua`):
    /// `id` is among the recent ids and its check still counts.
    pub fn seen(&self, now: i64, window: i64, id: u64) -> bool {
        self.check_time(now, window, id).is_some()
    }

    /// Mirror of the pruning `swl_decide` does first: the entries that have
    /// left the window go.
    pub fn prune(&mut self, now: i64, window: i64) {
        let floor = now - window;
        if !self.times.is_empty() && self.first <= floor {
            while matches!(self.times.front(), Some(&ts) if ts <= floor) {
                self.times.pop_front();
            }
            if let Some(&ts) = self.times.front() {
                self.first = ts;
            }
        }
    }

    /// Mirror of `swl_commit` (with the pruning `swl_decide` does first);
    /// `id` 0 records no id. An id joins the recent ids, which lose those
    /// whose check no longer counts and keep the newest [`LOG_IDS`].
    pub fn commit(&mut self, now: i64, cost: u64, window: i64, id: u64) {
        self.prune(now, window);
        if cost == 0 {
            return;
        }
        if id != 0 {
            let ids = self.ids.get_or_insert_with(Default::default);
            ids.retain(|&(t, _)| t + window > now);
            ids.push((now, id));
            if ids.len() > LOG_IDS {
                ids.remove(0);
            }
        }
        if self.times.is_empty() {
            self.first = now;
            self.newest = now;
        }
        let n = cost as usize;
        if now >= self.newest {
            // The usual case: the newest admission so far goes at the end.
            self.times.extend(std::iter::repeat_n(now, n));
            self.newest = now;
        } else {
            // A clock that stepped back: keep the entries sorted.
            let at = self.times.partition_point(|&ts| ts <= now);
            for _ in 0..n {
                self.times.insert(at, now);
            }
            self.first = self.first.min(now);
        }
    }

    /// Units stored (for memory accounting).
    pub fn len(&self) -> usize {
        self.times.len()
    }

    /// Mirror of `settle_log` (`lua/settle.lua`): when call `id` is among
    /// the recent ids, its check still counts and its units are still
    /// stored, the check holds `actual` units instead of `estimate` (units
    /// removed or added at the check's time) and the id is marked settled, so
    /// a second settle finds nothing. False when the call is not found.
    pub fn settle(&mut self, now: i64, id: u64, estimate: u64, actual: u64, window: i64) -> bool {
        let Some((at, t)) = self.check_time(now, window, id) else { return false };
        let start = self.times.partition_point(|&ts| ts < t);
        let end = self.times.partition_point(|&ts| ts <= t);
        if ((end - start) as u64) < estimate {
            // Its units have left (dropped by a call with a later time), or
            // `estimate` is not the check's cost.
            return false;
        }
        if let Some(ids) = self.ids.as_mut() {
            ids[at].1 = settled_id(id);
        }
        if actual < estimate {
            self.times.drain(end - (estimate - actual) as usize..end);
        } else {
            for _ in estimate..actual {
                self.times.insert(end, t);
            }
        }
        if let (Some(&first), Some(&newest)) = (self.times.front(), self.times.back()) {
            self.first = first;
            self.newest = newest;
        }
        true
    }

    /// For a call [`Log::settle`] did not find: whether it may have been
    /// pushed out of the recent ids (`lost` in `lua/settle.lua`).
    pub fn pushed_out(&self, now: i64, id: u64, window: i64) -> bool {
        self.ids.as_ref().is_some_and(|ids| pushed_out(ids, id, |(_, i)| i, |(t, _)| t + window > now))
    }
}

const MICRO: u64 = 1_000_000;

/// `x.floor()`, without the library call that `f64::floor` is on the
/// baseline x86-64 target (no SSE4.1): for `0 <= x < 2^63` truncating is
/// flooring, and exact (every double that large is an integer).
#[inline]
fn floor_f64(x: f64) -> f64 {
    if (0.0..9.0e18).contains(&x) {
        (x as i64) as f64
    } else {
        x.floor()
    }
}

/// `x.ceil()`, as [`floor_f64`].
#[inline]
fn ceil_f64(x: f64) -> f64 {
    if (0.0..9.0e18).contains(&x) {
        let t = (x as i64) as f64;
        if t < x {
            t + 1.0
        } else {
            t
        }
    } else {
        x.ceil()
    }
}

/// Mirror of `tb_wait`: microseconds until `need` micro-tokens are refilled,
/// `w = ceil(need / rate)`, plus one when `floor(w * rate) < need`, in
/// doubles as the Lua computes it.
///
/// Computed with fewer dependent steps, to the same bit: `floor(x) < n` is
/// `x < n` for an integer `n`, so the product is compared as it is; and
/// below 4 * 10^15 (126 years of microseconds, under 2^52) the ceiling is
/// taken on the integer, where adding one is exact. Anything else takes the steps as
/// written ([`tb_wait_as_written`]).
#[inline]
pub(crate) fn tb_wait(need: u64, rate: f64) -> i64 {
    if need == 0 {
        return 0;
    }
    let need_f = micro_f64(need);
    let q = need_f / rate;
    if (0.0..4.0e15).contains(&q) {
        let t = q as i64;
        let w = t + ((t as f64) < q) as i64;
        return w + ((w as f64) * rate < need_f) as i64;
    }
    tb_wait_as_written(need_f, rate)
}

/// [`tb_wait`] with `inv = 1 / rate` computed beforehand (off the chain of
/// steps that waits for the bucket's state): the quotient is taken as
/// `need * inv`, which is within 3 ulp of `need / rate`, so wherever it is
/// further than 8 ulp (2^-49 of itself) from an integer the two have the
/// same ceiling. Nearer one, the division decides.
#[inline]
pub(crate) fn tb_wait_inv(need: u64, rate: f64, inv: f64) -> i64 {
    if need == 0 {
        return 0;
    }
    let need_f = micro_f64(need);
    let q = need_f * inv;
    if (0.0..4.0e15).contains(&q) {
        let t = q as i64;
        let frac = q - t as f64;
        let tol = q * (1.0 / (1u64 << 49) as f64);
        if frac > tol && frac < 1.0 - tol {
            let w = t + 1;
            return w + ((w as f64) * rate < need_f) as i64;
        }
    }
    tb_wait(need, rate)
}

/// `need` as a double: below 2^63 (every count of micro-tokens), a signed
/// conversion gives the same double in fewer instructions than an unsigned one.
#[inline]
fn micro_f64(need: u64) -> f64 {
    if need <= i64::MAX as u64 {
        need as i64 as f64
    } else {
        need as f64
    }
}

/// [`tb_wait`] step by step, as `lua/token_bucket.lua` writes it.
#[cold]
fn tb_wait_as_written(need_f: f64, rate: f64) -> i64 {
    let mut wait = ceil_f64(need_f / rate);
    if floor_f64(wait * rate) < need_f {
        wait += 1.0;
    }
    wait as i64
}

/// How many recent call ids a bucket remembers (`TB_IDS` in the Lua).
pub(crate) const TB_IDS: usize = 64;

/// A token bucket: micro-tokens, the time of the last admission, and the ids
/// of the last [`TB_IDS`] admitted calls that asked for deduplication. The
/// micro-tokens go below zero after a settle's debit, and refill from there.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    pub tokens: i64,
    pub last: i64,
    pub ids: Vec<u64>,
}

impl Bucket {
    /// Mirror of `tb_decide`; the second value is the micro-tokens left after
    /// the request (for `commit`).
    #[inline]
    pub fn decide(
        state: Option<&Bucket>,
        now: i64,
        cost: u64,
        capacity: u64,
        rate: f64,
    ) -> (Outcome, u64) {
        let (mut o, left) = Bucket::decide_needs(state, now, cost, capacity, rate);
        Bucket::waits(&mut o, rate);
        (o, left)
    }

    /// [`Bucket::decide`] with its waits left for [`Bucket::waits`]: the
    /// outcome's `retry_after_us` and `reset_after_us` hold the micro-tokens
    /// each waits for. The waits are a function of those alone, so a check
    /// may take them once it no longer holds the state's lock.
    #[inline]
    pub fn decide_needs(
        state: Option<&Bucket>,
        now: i64,
        cost: u64,
        capacity: u64,
        rate: f64,
    ) -> (Outcome, u64) {
        let full = (capacity * MICRO) as i64;
        let mut tokens = full;
        if let Some(b) = state {
            tokens = b.tokens;
            if now > b.last {
                // `refill = floor(elapsed * rate)`; `floor(x) >= n` is
                // `x >= n` for an integer `n`, and below that bound (and
                // above zero) the floor is the truncation.
                let refill = (now - b.last) as f64 * rate;
                if refill >= (full - tokens) as f64 {
                    tokens = full;
                } else {
                    tokens += refill as i64;
                }
            }
        }
        let want = (cost * MICRO) as i64;
        if tokens >= want {
            let left = tokens - want;
            (
                Outcome {
                    allowed: true,
                    remaining: left as u64 / MICRO,
                    retry_after_us: 0,
                    reset_after_us: full - left,
                    limit: 0,
                    blocked: false,
                },
                left as u64,
            )
        } else {
            (
                Outcome {
                    allowed: false,
                    remaining: tokens.max(0) as u64 / MICRO,
                    retry_after_us: want - tokens,
                    reset_after_us: full - tokens,
                    limit: 0,
                    blocked: false,
                },
                tokens.max(0) as u64,
            )
        }
    }

    /// The waits of an outcome of [`Bucket::decide_needs`], in place.
    #[inline]
    pub fn waits(o: &mut Outcome, rate: f64) {
        let inv = 1.0 / rate;
        o.retry_after_us = tb_wait_inv(o.retry_after_us as u64, rate, inv);
        o.reset_after_us = tb_wait_inv(o.reset_after_us as u64, rate, inv);
    }

    /// Mirror of `settle_bucket` (`lua/settle.lua`): when call `id` is among
    /// the recent ids, it is marked settled and the bucket gets `estimate -
    /// actual` tokens back (capped at the capacity; a negative difference is
    /// a debit, which may take it below zero). Returns the time the bucket
    /// is full again, counted from now, or `None` when the call is not found.
    pub fn settle(&mut self, now: i64, id: u64, estimate: u64, actual: u64, capacity: u64, rate: f64) -> Option<i64> {
        let at = self.ids.iter().position(|&i| i == id)?;
        self.ids[at] = settled_id(id);
        let full = (capacity * MICRO) as i64;
        self.tokens = (self.tokens + (estimate as i64 - actual as i64) * MICRO as i64).min(full);
        Some(self.last + tb_wait((full - self.tokens) as u64, rate) - now)
    }

    /// For a call [`Bucket::settle`] did not find: whether it may have been
    /// pushed out of the recent ids.
    pub fn pushed_out(&self, id: u64) -> bool {
        pushed_out(&self.ids, id, |i| i, |_| true)
    }
}

/// Floor division for a positive divisor (`floor_div` in `lua/args.lua`).
pub(crate) fn floor_div(a: i64, b: i64) -> i64 {
    a.div_euclid(b)
}

/// How many recent call ids a sliding window of counters or a period
/// counter remembers (as many as a bucket).
pub(crate) const COUNTER_IDS: usize = TB_IDS;

/// A sliding window of counters: the units admitted per sub-window of
/// `precision` microseconds (sub-window `j` spans `[j * precision, (j + 1) *
/// precision)`), and the ids of recent calls that asked for deduplication
/// with the sub-window they were admitted in. A unit of sub-window `j` counts
/// while `now < (j + 1) * precision + window`: that is, for the sub-windows
/// `j >= floor((now - window) / precision)`. Mirror of `lua/sliding_window.lua`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Counters {
    /// (sub-window, units), ascending by sub-window.
    subs: Vec<(i64, u64)>,
    /// (sub-window, call id) of recent admissions with an id, oldest first.
    ids: Vec<(i64, u64)>,
}

impl Counters {
    /// Mirror of `sw_decide`.
    pub fn decide(&self, now: i64, cost: u64, limit: u64, window: i64, precision: i64) -> Outcome {
        let first = floor_div(now - window, precision);
        let release = |j: i64| (j + 1) * precision + window - now;
        let mut count = 0u64;
        let mut newest: Option<i64> = None;
        for &(j, c) in self.subs.iter().filter(|(j, _)| *j >= first) {
            count += c;
            newest = Some(j);
        }
        if count + cost <= limit {
            let mut top = newest;
            if cost > 0 {
                let current = floor_div(now, precision);
                top = Some(top.map_or(current, |n| n.max(current)));
            }
            return Outcome {
                allowed: true,
                remaining: limit - count - cost,
                retry_after_us: 0,
                reset_after_us: top.map_or(0, release),
                limit: 0,
                blocked: false,
            };
        }
        // Denied: wait until the oldest sub-windows holding `need` units have left.
        let need = count + cost - limit;
        let mut held = 0;
        let mut retry = 0;
        for &(j, c) in self.subs.iter().filter(|(j, _)| *j >= first) {
            held += c;
            if held >= need {
                retry = release(j);
                break;
            }
        }
        Outcome {
            allowed: false,
            remaining: limit.saturating_sub(count),
            retry_after_us: retry,
            reset_after_us: newest.map_or(0, release),
            limit: 0,
            blocked: false,
        }
    }

    /// Mirror of `seen` for counters: `id` was admitted in a sub-window that
    /// still counts.
    pub fn seen(&self, now: i64, window: i64, precision: i64, id: u64) -> bool {
        let first = floor_div(now - window, precision);
        self.ids.iter().any(|&(j, i)| i == id && j >= first)
    }

    /// Mirror of `sw_commit` (with the pruning `sw_decide` does first):
    /// `cost` units in the current sub-window; `id` (a call that asked for
    /// deduplication) joins the recent ids, which lose those whose
    /// sub-window has left and keep the newest [`COUNTER_IDS`].
    pub fn commit(&mut self, now: i64, cost: u64, window: i64, precision: i64, id: Option<u64>) {
        let first = floor_div(now - window, precision);
        self.subs.retain(|(j, _)| *j >= first);
        if cost == 0 {
            return;
        }
        let current = floor_div(now, precision);
        match self.subs.binary_search_by_key(&current, |&(j, _)| j) {
            Ok(at) => self.subs[at].1 += cost,
            Err(at) => self.subs.insert(at, (current, cost)),
        }
        if let Some(id) = id {
            self.ids.retain(|(j, _)| *j >= first);
            self.ids.push((current, id));
            if self.ids.len() > COUNTER_IDS {
                self.ids.remove(0);
            }
        }
    }

    /// Sub-windows stored (for memory accounting).
    pub fn len(&self) -> usize {
        self.subs.len()
    }

    /// Mirror of `settle_counters` (`lua/settle.lua`): when call `id` was
    /// admitted in a sub-window that still counts, it is marked settled
    /// and that sub-window gets `actual - estimate` more units (at most its
    /// units fewer). `None` when the call is not found, else whether any
    /// unit is left.
    pub fn settle(&mut self, now: i64, id: u64, estimate: u64, actual: u64, window: i64, precision: i64) -> Option<bool> {
        let first = floor_div(now - window, precision);
        let at = self.ids.iter().position(|&(j, i)| i == id && j >= first)?;
        let j = self.ids[at].0;
        self.ids[at].1 = settled_id(id);
        let delta = actual as i64 - estimate as i64;
        match self.subs.binary_search_by_key(&j, |&(s, _)| s) {
            Ok(at) => {
                let units = self.subs[at].1 as i64 + delta.max(-(self.subs[at].1 as i64));
                if units == 0 {
                    self.subs.remove(at);
                } else {
                    self.subs[at].1 = units as u64;
                }
            }
            Err(at) if delta > 0 => self.subs.insert(at, (j, delta as u64)),
            Err(_) => {}
        }
        Some(self.subs.iter().any(|&(_, c)| c > 0))
    }

    /// For a call [`Counters::settle`] did not find: whether it may have
    /// been pushed out of the recent ids.
    pub fn pushed_out(&self, now: i64, id: u64, window: i64, precision: i64) -> bool {
        let first = floor_div(now - window, precision);
        pushed_out(&self.ids, id, |(_, i)| i, |(j, _)| j >= first)
    }
}

/// The end (exclusive, microseconds) of the epoch-aligned fixed window of
/// `window` microseconds that holds `now` (`fw_end` in the Lua).
pub(crate) fn fixed_end(now: i64, window: i64) -> i64 {
    (floor_div(now, window) + 1) * window
}

const HOUR_US: i64 = 3_600_000_000;
const DAY_US: i64 = 86_400_000_000;

/// Days since 1970-01-01 -> (year, month 1-12), proleptic Gregorian
/// (H. Hinnant's `civil_from_days`; `civil` in the Lua).
fn civil_from_days(days: i64) -> (i64, i64) {
    let z = days + 719_468;
    let era = floor_div(z, 146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400;
    (if m <= 2 { y + 1 } else { y }, m)
}

/// (year, month 1-12) -> days since 1970-01-01 of that month's first day
/// (`days_from_civil`; `month_start` in the Lua).
fn month_start(year: i64, month: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = floor_div(y, 400);
    let yoe = y - era * 400;
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The end (exclusive, microseconds since the epoch, UTC) of the calendar
/// `period` that holds `now`, read at `offset_s` seconds east of UTC
/// (`q_end` in the Lua). Weeks start on Monday (1970-01-05 was one).
pub(crate) fn quota_end(now: i64, period: Period, offset_s: i64) -> i64 {
    let offset = offset_s * 1_000_000;
    let local = now + offset;
    let end = match period {
        Period::Hour => (floor_div(local, HOUR_US) + 1) * HOUR_US,
        Period::Day => (floor_div(local, DAY_US) + 1) * DAY_US,
        Period::Week => {
            let day = floor_div(local, DAY_US);
            ((floor_div(day + 3, 7) + 1) * 7 - 3) * DAY_US
        }
        Period::Month => {
            let (y, m) = civil_from_days(floor_div(local, DAY_US));
            let (y, m) = if m == 12 { (y + 1, 1) } else { (y, m + 1) };
            month_start(y, m) * DAY_US
        }
    };
    end - offset
}

/// One counter per period (fixed windows and quotas): the end of the period
/// it counts, the units admitted in it, and the ids of its recent calls that
/// asked for deduplication. Mirror of `lua/period_counter.lua`.
#[derive(Debug, Clone)]
pub(crate) struct PeriodCount {
    pub end: i64,
    pub count: u64,
    pub ids: Vec<u64>,
}

impl PeriodCount {
    /// Mirror of `pc_decide`: the stored count holds while its period runs
    /// (`end > now`); a stored period that ends later than the current one
    /// (a clock that stepped back) stays the period, so no period opens
    /// twice. The second value is the end of the period decided in.
    pub fn decide(state: Option<&PeriodCount>, now: i64, cost: u64, limit: u64, period_end: i64) -> (Outcome, i64) {
        let (count, end) = match state {
            Some(s) if s.end > now => (s.count, s.end.max(period_end)),
            _ => (0, period_end),
        };
        if count + cost <= limit {
            let reset = if count + cost > 0 { end - now } else { 0 };
            return (
                Outcome { allowed: true, remaining: limit - count - cost, retry_after_us: 0, reset_after_us: reset, limit: 0, blocked: false },
                end,
            );
        }
        (
            Outcome {
                allowed: false,
                remaining: limit.saturating_sub(count),
                retry_after_us: end - now,
                reset_after_us: end - now,
                limit: 0,
                blocked: false,
            },
            end,
        )
    }

    /// Mirror of `seen` for period counters.
    pub fn seen(&self, now: i64, id: u64) -> bool {
        self.end > now && self.ids.contains(&id)
    }

    /// Mirror of `settle_period` (`lua/settle.lua`): when call `id` is among
    /// the ids of the period that still runs, it is marked settled and the period
    /// gets `actual - estimate` more units (down to zero). `None` when the
    /// call is not found, else whether any unit is left.
    pub fn settle(&mut self, now: i64, id: u64, estimate: u64, actual: u64) -> Option<bool> {
        if self.end <= now {
            return None;
        }
        let at = self.ids.iter().position(|&i| i == id)?;
        self.ids[at] = settled_id(id);
        let units = self.count as i64 + actual as i64 - estimate as i64;
        self.count = units.max(0) as u64;
        Some(units > 0)
    }

    /// For a call [`PeriodCount::settle`] did not find: whether it may have
    /// been pushed out of the recent ids of the period that still runs.
    pub fn pushed_out(&self, now: i64, id: u64) -> bool {
        self.end > now && pushed_out(&self.ids, id, |i| i, |_| true)
    }

    /// Mirror of `pc_commit`: `cost` more units in the period ending at
    /// `end`; a period that has ended starts over, with no ids.
    pub fn commit(state: Option<&mut PeriodCount>, now: i64, cost: u64, end: i64, id: Option<u64>) -> PeriodCount {
        let mut next = match state {
            Some(s) if s.end > now => std::mem::replace(s, PeriodCount { end: 0, count: 0, ids: Vec::new() }),
            _ => PeriodCount { end, count: 0, ids: Vec::new() },
        };
        next.end = end;
        next.count += cost;
        if let Some(id) = id {
            next.ids.push(id);
            if next.ids.len() > COUNTER_IDS {
                next.ids.remove(0);
            }
        }
        next
    }
}

/// Slots held under leases (a concurrency rule's key): per lease its end
/// (microseconds), its id's hash and its slots. A lease counts while
/// `now < end`. At most `limit` slots are ever held, so memory is bounded
/// by the limit. Mirror of `lua/concurrency.lua`, whose sorted set holds one
/// member per slot scored by its lease's end.
#[derive(Debug, Default, Clone)]
pub(crate) struct Leases {
    held: Vec<(i64, u64, u64)>,
}

impl Leases {
    /// Mirror of `cc_decide`: the slots held now, and for a denial the wait
    /// until enough of them end (the `need`-th slot by end, counting one per
    /// slot, `need = held + cost - limit`). `reset_after` is the time until
    /// the latest lease held ends (this check's included when it takes
    /// slots), 0 when none is held.
    pub fn decide(&self, now: i64, cost: u64, limit: u64, lease: i64) -> Outcome {
        let count: u64 = self.held.iter().filter(|l| l.0 > now).map(|l| l.2).sum();
        let latest = self.held.iter().filter(|l| l.0 > now).map(|l| l.0).max();
        if count + cost <= limit {
            let mut reset = latest.map_or(0, |e| e - now);
            if cost > 0 {
                reset = reset.max(lease);
            }
            return Outcome { allowed: true, remaining: limit - count - cost, retry_after_us: 0, reset_after_us: reset, limit: 0, blocked: false };
        }
        let need = count + cost - limit;
        let mut live: Vec<(i64, u64)> = self.held.iter().filter(|l| l.0 > now).map(|l| (l.0, l.2)).collect();
        live.sort_unstable();
        let mut acc = 0;
        let mut retry = 0;
        for (end, slots) in live {
            acc += slots;
            if acc >= need {
                retry = end - now;
                break;
            }
        }
        Outcome {
            allowed: false,
            remaining: limit.saturating_sub(count),
            retry_after_us: retry,
            reset_after_us: latest.map_or(0, |e| e - now),
            limit: 0,
            blocked: false,
        }
    }

    /// Lease `id` holds slots now.
    pub fn seen(&self, now: i64, id: u64) -> bool {
        self.held.iter().any(|l| l.1 == id && l.0 > now)
    }

    /// Mirror of `cc_commit`: the expired leases go, lease `id` takes `cost`
    /// slots until `now + lease`. The end of the latest lease held.
    pub fn commit(&mut self, now: i64, cost: u64, lease: i64, id: u64) -> i64 {
        self.held.retain(|l| l.0 > now);
        let end = now + lease;
        match self.held.iter_mut().find(|l| l.1 == id) {
            Some(l) => {
                l.0 = end;
                l.2 += cost;
            }
            None => self.held.push((end, id, cost)),
        }
        self.latest()
    }

    /// Mirror of `cc_release`: lease `id` gives its slots back; true when
    /// it held slots (an expired lease frees nothing). Expired leases go.
    pub fn release(&mut self, now: i64, id: u64) -> bool {
        let held = self.seen(now, id);
        self.held.retain(|l| l.0 > now && l.1 != id);
        held
    }

    /// Mirror of `cc_extend`: lease `id`, while it holds slots, now ends at
    /// `end`; never brings back an expired one. Expired leases go.
    pub fn extend(&mut self, now: i64, id: u64, end: i64) -> bool {
        self.held.retain(|l| l.0 > now);
        match self.held.iter_mut().find(|l| l.1 == id) {
            Some(l) => {
                l.0 = end;
                true
            }
            None => false,
        }
    }

    /// The end of the latest lease held (0 when none).
    pub fn latest(&self) -> i64 {
        self.held.iter().map(|l| l.0).max().unwrap_or(0)
    }

    /// Leases stored (for memory accounting).
    pub fn len(&self) -> usize {
        self.held.len()
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
        assert!(!log.seen(100, w, 7));
        log.commit(200, 1, w, 7);
        assert!(log.seen(200, w, 7));
        // A clock that stepped back: the entry goes in order, the newest stays.
        log.commit(150, 1, w, 9);
        assert!(log.seen(150, w, 9));
        assert_eq!(log.times, [100, 100, 150, 200]);
        assert_eq!(*log.ids.as_deref().unwrap(), [(200, 7), (150, 9)]);
        assert_eq!((log.first, log.newest), (100, 200));
        // The two oldest leave the window; the decision sees the other two.
        let o = log.decide(1_100, 1, 3, w);
        assert_eq!((o.allowed, o.remaining, o.reset_after_us), (true, 0, w));
        log.commit(1_100, 1, w, 0);
        assert_eq!(log.times, [150, 200, 1_100]);
        assert_eq!((log.first, log.newest), (150, 1_100));
        let o = log.decide(1_100, 1, 3, w);
        assert_eq!((o.allowed, o.retry_after_us, o.reset_after_us), (false, 50, w));
        // An id is remembered while its check counts.
        assert!(log.seen(1_149, w, 9) && !log.seen(1_150, w, 9));
    }

    #[test]
    fn log_remembers_the_last_64_ids_and_settles_once() {
        let mut log = Log::default();
        let w = 1_000_000;
        for id in 1..=65u64 {
            log.commit(id as i64, 1, w, id);
        }
        assert!(!log.seen(100, w, 1), "the oldest id left the 64");
        assert!(log.seen(100, w, 2) && log.seen(100, w, 65));
        // Settle call 65 (cost 1) up to 4, then once more: nothing.
        assert!(log.settle(100, 65, 1, 4, w));
        assert_eq!(log.len(), 68);
        assert!(!log.settle(100, 65, 4, 1, w));
        // A refund to zero takes the check's units away.
        log.commit(300, 3, w, 99);
        assert!(log.settle(400, 99, 3, 0, w));
        assert_eq!((log.len(), log.newest), (68, 65));
    }

    #[test]
    fn bucket_waits_are_exact() {
        let (o, left) = Bucket::decide(None, 0, 10, 10, 3.0);
        assert!(o.allowed);
        assert_eq!(left, 0);
        let b = Bucket { tokens: left as i64, last: 0, ids: Vec::new() };
        let (o, _) = Bucket::decide(Some(&b), 0, 1, 10, 3.0);
        assert!(!o.allowed);
        assert_eq!(o.retry_after_us, 333_334);
        let (o, _) = Bucket::decide(Some(&b), 333_334, 1, 10, 3.0);
        assert!(o.allowed);
        let (o, _) = Bucket::decide(Some(&b), 333_333, 1, 10, 3.0);
        assert!(!o.allowed);
    }

    /// `tb_wait` and the refill as `lua/token_bucket.lua` writes them, step
    /// by step: what the shorter forms must equal to the bit.
    fn tb_wait_lua(need: u64, rate: f64) -> i64 {
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

    fn refilled_lua(tokens: i64, elapsed: i64, full: i64, rate: f64) -> i64 {
        let refill = (elapsed as f64 * rate).floor();
        if refill >= (full - tokens) as f64 {
            full
        } else {
            tokens + refill as i64
        }
    }

    #[test]
    fn bucket_arithmetic_is_the_luas_to_the_bit() {
        // xorshift64*: a fixed sequence, so a failure repeats.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        let mut rates = vec![3.0, 1_000_000.0 / 60.0, 1000.0 / 60.0, 100_000.0, 1.0 / 3600.0, 0.1, 7.0, 1e-9, 1e9];
        for _ in 0..200 {
            // Rates from 1e-6 to 1e7 tokens per second, any mantissa.
            let e = (next() % 14) as i32 - 6;
            rates.push(10f64.powi(e) * (1.0 + (next() >> 11) as f64 / (1u64 << 53) as f64 * 9.0));
        }
        let mut checked = 0u64;
        for &rate in &rates {
            for i in 0..5_000u64 {
                // Needs of every size, and needs right at a multiple of the
                // rate (where the ceiling and the correction decide).
                let need = match i % 4 {
                    0 => next() % 1_000_000_000,
                    1 => next() >> (next() % 64),
                    2 => {
                        let k = (next() % 100_000_000) as f64;
                        ((k * rate).floor() as u64).saturating_add(next() % 3).saturating_sub(1)
                    }
                    _ => next() % 4_000_000,
                };
                assert_eq!(tb_wait(need, rate), tb_wait_lua(need, rate), "need {need} rate {rate:e}");
                assert_eq!(tb_wait_inv(need, rate, 1.0 / rate), tb_wait_lua(need, rate), "need {need} rate {rate:e}");
                let full = (1 + next() % 10_000_000) as i64 * 1_000_000;
                let tokens = full - (next() % (full as u64 * 2)) as i64;
                let elapsed = (next() >> (next() % 64)) as i64 & i64::MAX;
                let b = Bucket { tokens, last: 0, ids: Vec::new() };
                let (o, left) = Bucket::decide(Some(&b), elapsed.max(1), 1, (full / 1_000_000) as u64, rate);
                let now = refilled_lua(tokens, elapsed.max(1), full, rate);
                assert_eq!(o.allowed, now >= 1_000_000, "tokens {tokens} elapsed {elapsed} rate {rate:e}");
                let expect = if o.allowed { now - 1_000_000 } else { now.max(0) };
                assert_eq!(left as i64, expect, "tokens {tokens} elapsed {elapsed} rate {rate:e}");
                checked += 1;
            }
        }
        assert!(checked > 1_000_000);
    }

    #[test]
    fn counters_count_until_the_sub_window_ends_plus_the_window() {
        let (w, p) = (1_000, 100);
        let mut c = Counters::default();
        c.commit(150, 2, w, p, None); // sub-window 1: [100, 200), counts until 1200
        assert!(!c.decide(1_199, 1, 2, w, p).allowed);
        assert_eq!(c.decide(1_100, 1, 2, w, p).retry_after_us, 100);
        assert!(c.decide(1_200, 1, 2, w, p).allowed);
        let o = c.decide(150, 0, 2, w, p);
        assert_eq!((o.remaining, o.reset_after_us), (0, 1_050));
    }

    #[test]
    fn calendar_periods() {
        // 2024-02-29T12:00:00Z, a leap day.
        let leap = 1_709_208_000_000_000;
        let day = 86_400_000_000;
        assert_eq!(quota_end(leap, Period::Month, 0), 1_709_251_200_000_000); // 2024-03-01
        assert_eq!(quota_end(leap, Period::Day, 0), 1_709_251_200_000_000);
        assert_eq!(quota_end(leap, Period::Hour, 0), leap + 3_600_000_000);
        // Thursday 2024-02-29: the week ends on Monday 2024-03-04.
        assert_eq!(quota_end(leap, Period::Week, 0), 1_709_251_200_000_000 + 3 * day);
        // At +14:00 it is already 2024-03-01T02:00 local: the month ends at
        // 2024-04-01T00:00+14:00.
        assert_eq!(quota_end(leap, Period::Month, 14 * 3600), 1_711_929_600_000_000 - 14 * 3_600_000_000);
        // December rolls over into the next year.
        assert_eq!(quota_end(1_735_603_200_000_000, Period::Month, 0), 1_735_689_600_000_000);
        assert_eq!(fixed_end(1_999, 1_000), 2_000);
        assert_eq!(fixed_end(2_000, 1_000), 3_000);
    }
}

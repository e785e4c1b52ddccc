//! Reservations (a rule's `reserve`, docs/concepts/reserve.md): units of a
//! fixed window, quota, sliding window (counters or log) or token bucket
//! taken from Redis ahead of use, in the same script run as a check
//! (`lua/reserve.lua`, mode `r`), and spent in process.
//!
//! A reservation is spendable only until the time the script gave it (the
//! end of the period or sub-window it was counted in, the stamp of a log's
//! reserved entry, the moment a bucket could refill to its capacity), judged
//! on the local clock from the moment its trip was sent (never later than the
//! server's reading), and for at most `reserve_for`; then its rest is given
//! back (mode `g`) while the backend can still take it, or dropped. So every
//! unit admitted is counted by the backend where the direct path would count
//! it, or longer, whatever the number of processes: never over the limit.
//!
//! One limiter alone decides exactly as the direct path: a reserved rule's
//! `remaining` is the backend's remaining at the last trip (all outstanding
//! reservations counted as used) plus this limiter's unspent units, and a
//! reserved rule that needs a trip gives its leftover back in the same run
//! before the check is decided.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use smallvec::SmallVec;

use super::{Generation, Inner, Limiter};
use crate::backend::script::{command, ext_refs, parse_reply, Header, CHECK_SCRIPT};
use crate::backend::Connection;
use crate::clock::Clock;
use crate::decision::{Decision, RuleName, RuleResult};
use crate::error::{Error, Result};
use crate::plan::{CompiledRule, Mode, Plan, PlanExt, RuleArgs};

/// How often the limiter looks for reservations to give back.
const SWEEP_EVERY: Duration = Duration::from_millis(50);

/// Counters of reservations since the limiter was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReserveStats {
    /// Checks that needed the backend for a reserved rule (each one script run).
    pub trips: u64,
    /// Checks answered from reservations alone, with no round trip.
    pub local: u64,
    /// Units reserved from the backend.
    pub reserved: u64,
    /// Units given back to the backend (unspent after `reserve_for`, on `close`,
    /// or as the leftover of a reservation that could not pay a request).
    pub returned: u64,
    /// Unspent units dropped at the end of their period (nothing counts them any more).
    pub dropped: u64,
}

/// What the backend's count of a reserved rule is, for answering and giving back.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// A fixed window or quota (tag: the period's end).
    Period,
    /// A sliding window of counters (tag: the sub-window).
    Counters,
    /// A sliding-window log (tag: the reserved entry's time).
    Log { window_us: i64 },
    /// A token bucket (tag: the reservation's id).
    Bucket { capacity: u64, rate: f64 },
}

impl Kind {
    fn of(rule: &CompiledRule) -> Kind {
        match rule.args {
            RuleArgs::Counters { .. } => Kind::Counters,
            RuleArgs::Window { window_us, .. } => Kind::Log { window_us },
            RuleArgs::Bucket { capacity, rate, .. } => Kind::Bucket { capacity, rate },
            _ => Kind::Period,
        }
    }
}

/// One key's reservation.
#[derive(Debug, Clone)]
struct Held {
    /// Units left to spend.
    units: u64,
    /// The backend's remaining at the last trip (reservations counted as used).
    seen: u64,
    /// Spendable until then (local clock, never later than the server's).
    spend_end: i64,
    /// When the rule's count resets, as the trip answered (local clock).
    reset_end: i64,
    /// When the rest is given back (local clock).
    expires: i64,
    /// Until when the backend can take units back (local clock).
    give_until: i64,
    /// The reservation's tag, as the script gave it (see lua/reserve.lua).
    tag: i64,
    /// When the trip was sent (local clock) and the server's time of it.
    sent: i64,
    server_t0: i64,
    /// A bucket's micro-tokens left after the grant.
    left: i64,
    /// A log's checks paid from it: server time (estimated, never earlier
    /// than the real one) and cost.
    spends: Vec<(i64, u64)>,
    kind: Kind,
    /// The rule's name (for its metrics), limit and script arguments.
    rule: RuleName,
    limit: u64,
    args: [String; 3],
}

impl Held {
    fn live(&self, now: i64) -> bool {
        now < self.expires && now < self.spend_end
    }

    /// Whether giving back is worth a trip.
    fn worth_giving(&self, now: i64) -> bool {
        (self.units > 0 || !self.spends.is_empty()) && now < self.give_until
    }

    /// The give-back item "<units>:<tag>[:<spends>]" (lua/reserve.lua).
    fn give_item(&self) -> String {
        if self.spends.is_empty() {
            format!("{}:{}", self.units, self.tag)
        } else {
            let spends: Vec<String> = self.spends.iter().map(|(t, c)| format!("{t}/{c}")).collect();
            format!("{}:{}:{}", self.units, self.tag, spends.join(";"))
        }
    }

    /// Whether a bucket's reservation is still listed in the bucket and
    /// spendable: giving it back, even with nothing left, takes it off the
    /// list, so the next reservation's spend time counts it no more.
    fn listed(&self, now: i64) -> bool {
        matches!(self.kind, Kind::Bucket { .. }) && now < self.spend_end
    }

    /// What a check paid from it needs to answer, and to pay back.
    fn paid(&self) -> Paid {
        Paid {
            units: self.units,
            seen: self.seen,
            reset_end: self.reset_end,
            sent: self.sent,
            left: self.left,
            tag: self.tag,
            last_spend: self.spends.last().copied(),
            kind: self.kind,
            limit: self.limit,
        }
    }

    /// The server time of a check paid from it at local time `now`.
    fn server_time(&self, now: i64) -> i64 {
        self.server_t0 + (now - self.sent).max(0)
    }
}

/// A reservation as a check paid from it saw it (see [`Held`]).
#[derive(Debug, Clone, Copy)]
struct Paid {
    units: u64,
    seen: u64,
    reset_end: i64,
    sent: i64,
    left: i64,
    tag: i64,
    /// A log's spend of this check.
    last_spend: Option<(i64, u64)>,
    kind: Kind,
    limit: u64,
}

/// What the local phase of a check leaves for the trip: per plan rule, the
/// reservation that paid it, and the leftover a reserved rule sent to the
/// backend gives back first; and the reservations no longer spendable.
struct Local {
    now: i64,
    paid: SmallVec<[Option<Paid>; 4]>,
    credit: SmallVec<[Option<String>; 4]>,
    expired: Vec<Return>,
}

/// Units to give back: key, script arguments, give-back item, units, rule.
type Return = (String, [String; 3], String, u64, RuleName);

fn to_return(key: &str, h: &Held) -> Return {
    (key.to_string(), h.args.clone(), h.give_item(), h.units, h.rule)
}

/// What a reservation counter counts (in [`ReserveStats`], and per rule in the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReserveCount {
    /// A check or peek on the rule that needed the backend.
    Trips,
    /// A check on the rule answered from its reservation.
    Local,
    /// Units reserved.
    Reserved,
    /// Units given back.
    Returned,
    /// Units dropped unspent.
    Dropped,
}

/// Count `n` for `rule`: in the limiter's totals and its per-rule metrics.
fn note(inner: &Inner, rule: RuleName, what: ReserveCount, n: u64) {
    if n == 0 {
        return;
    }
    let r = &inner.reserves;
    match what {
        // Counted per check in the totals (see `Limiter::reserved`).
        ReserveCount::Trips | ReserveCount::Local => {}
        ReserveCount::Reserved => bump(&r.reserved, n),
        ReserveCount::Returned => bump(&r.returned, n),
        ReserveCount::Dropped => bump(&r.dropped, n),
    }
    if let Some(m) = &inner.current.load().metrics {
        m.reserve_count(rule, what, n);
    }
}

/// Give `items` back and count what came back and what did not.
async fn give_back_noted(inner: &Inner, remote: &Connection, now: Option<i64>, items: &[Return]) {
    match give_back(remote, now, items).await {
        Ok(given) => {
            for (item, n) in items.iter().zip(given) {
                note(inner, item.4, ReserveCount::Returned, n);
                note(inner, item.4, ReserveCount::Dropped, item.3.saturating_sub(n));
            }
        }
        Err(_) => {
            for item in items {
                note(inner, item.4, ReserveCount::Dropped, item.3);
            }
        }
    }
}

/// The reservations of one limiter, by key.
#[derive(Default)]
pub(super) struct Reserves {
    held: Mutex<HashMap<String, Held>>,
    /// The fork generation the reservations belong to: a forked child starts
    /// with none (the parent's are the parent's to spend).
    generation: AtomicU64,
    sweeping: AtomicBool,
    trips: AtomicU64,
    local: AtomicU64,
    reserved: AtomicU64,
    returned: AtomicU64,
    dropped: AtomicU64,
}

fn bump(a: &AtomicU64, n: u64) {
    a.fetch_add(n, Ordering::Relaxed);
}

impl Reserves {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        let mut map = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let generation = crate::runtime::fork_generation();
        if self.generation.swap(generation, Ordering::Relaxed) != generation {
            map.clear();
            self.sweeping.store(false, Ordering::Relaxed);
        }
        map
    }

    /// The counters.
    pub fn read(&self) -> ReserveStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ReserveStats {
            trips: get(&self.trips),
            local: get(&self.local),
            reserved: get(&self.reserved),
            returned: get(&self.returned),
            dropped: get(&self.dropped),
        }
    }

    /// Take out what is no longer spendable at `now` (all of it when `all`):
    /// what can still be given back, and the rest (units dropped, by rule).
    fn take_expired(&self, now: i64, all: bool) -> (Vec<Return>, Vec<(RuleName, u64)>) {
        let (mut back, mut dropped) = (Vec::new(), Vec::new());
        let mut map = self.map();
        map.retain(|key, h| {
            if !all && h.live(now) {
                return true;
            }
            if h.worth_giving(now) {
                back.push(to_return(key, h));
            } else {
                dropped.push((h.rule, h.units));
            }
            false
        });
        (back, dropped)
    }

    /// Forget the reservations of these keys (a reset deleted their counts).
    pub fn forget(&self, keys: &[String]) {
        let mut map = self.map();
        for k in keys {
            map.remove(k);
        }
    }
}

/// The check script's hash.
fn sha() -> &'static str {
    static SHA: OnceLock<String> = OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(CHECK_SCRIPT).get_hash().to_string())
}

/// Whether the server answered that it does not have the script.
fn is_noscript(e: &Error) -> bool {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(r) = s.downcast_ref::<redis::RedisError>() {
            return crate::backend::script::is_noscript(r);
        }
        source = s.source();
    }
    false
}

/// Run a command of the check script (EVALSHA, then EVAL when the server
/// does not have it).
async fn run_script(remote: &Connection, build: impl Fn(Option<&str>) -> redis::Cmd) -> Result<Vec<i64>> {
    match remote.query::<Vec<i64>>(&build(Some(sha()))).await {
        Err(e) if is_noscript(&e) => remote.query(&build(None)).await,
        other => other,
    }
}

/// Give units back (mode `g`); returns how many the backend took back, per item.
async fn give_back(remote: &Connection, now: Option<i64>, items: &[Return]) -> Result<Vec<u64>> {
    let mut given = Vec::with_capacity(items.len());
    for (key, args, item, _, _) in items {
        let reply = run_script(remote, |sha| {
            let mut cmd = match sha {
                Some(s) => {
                    let mut c = redis::cmd("EVALSHA");
                    c.arg(s);
                    c
                }
                None => {
                    let mut c = redis::cmd("EVAL");
                    c.arg(CHECK_SCRIPT);
                    c
                }
            };
            cmd.arg(1).arg(key).arg("g");
            match now {
                Some(t) => cmd.arg(t),
                None => cmd.arg(""),
            };
            cmd.arg("-").arg(0).arg(&args[..]).arg("").arg(item);
            cmd
        })
        .await?;
        given.push(reply.get(2).copied().unwrap_or(0).max(0) as u64);
    }
    Ok(given)
}

/// Whether any applicable rule of the plan is reserved.
pub(super) fn has_reserved(plan: &Plan<'_, String>) -> bool {
    plan.rules.iter().any(|r| r.reserve.is_some())
}

/// A rule answered from its reservation: allowed, with what the direct path
/// would answer as far as this limiter knows (see docs/concepts/reserve.md).
fn local_result(rule: &CompiledRule, h: &Paid, now: i64) -> RuleResult {
    let (remaining, reset_us) = match h.kind {
        Kind::Period | Kind::Counters => (h.seen + h.units, (h.reset_end - now).max(0)),
        Kind::Log { window_us } => (h.seen + h.units, window_us),
        Kind::Bucket { capacity, rate } => {
            // The tokens refill from the trip on, never clipped while a
            // reservation is spendable (lua/reserve.lua).
            let full = capacity as i64 * 1_000_000;
            let refilled = ((now - h.sent).max(0) as f64 * rate).floor() as i64;
            let tokens = (h.left + refilled).min(full - h.units as i64 * 1_000_000).max(0);
            let with_ours = tokens + h.units as i64 * 1_000_000;
            ((tokens / 1_000_000) as u64 + h.units, crate::algo::tb_wait((full - with_ours).max(0) as u64, rate))
        }
    };
    RuleResult {
        rule: rule.name,
        index: rule.index,
        allowed: true,
        shadow: rule.shadow,
        limit: h.limit,
        remaining,
        retry_after: Duration::ZERO,
        reset_after: Duration::from_micros(reset_us.max(0) as u64),
        window: rule.window,
    }
}

impl Limiter {
    /// The reservation counters (see [`ReserveStats`]).
    pub fn reserve_stats(&self) -> ReserveStats {
        self.inner.reserves.read()
    }

    /// The local phase of a check or peek whose plan has a reserved rule:
    /// each reserved rule paid from its reservation when it can be, the
    /// leftovers too small for this request set aside to be given back in
    /// the trip, and the reservations no longer spendable taken out.
    fn pay_locally(&self, plan: &Plan<'_, String>, mode: Mode) -> Result<Local> {
        let Some(remote) = &self.inner.remote else {
            return Err(Error::closed());
        };
        if remote.name() == "cluster" {
            let slot = crate::backend::cluster::slot(&plan.keys[0]);
            if plan.keys.iter().any(|k| crate::backend::cluster::slot(k) != slot) {
                return Err(Error::invalid_argument(
                    "reserve: on Redis Cluster, the keys of a check with a reserved rule must share one slot (a reservation is taken in one script run); give the rules' keys a common {hash tag}, or check the reserved rule on its own",
                ));
            }
        }
        let now = self.local_now();
        let cost = plan.cost;
        let mut local = Local { now, paid: SmallVec::new(), credit: SmallVec::new(), expired: Vec::new() };
        let mut map = self.inner.reserves.map();
        for (key, rule) in plan.keys.iter().zip(&plan.rules) {
            let mut pay = None;
            let mut give = None;
            if rule.reserve.is_some() {
                if let Some(h) = map.get_mut(key) {
                    if !h.live(now) {
                        let h = map.remove(key).expect("present");
                        if h.worth_giving(now) {
                            local.expired.push(to_return(key, &h));
                        } else {
                            note(&self.inner, h.rule, ReserveCount::Dropped, h.units);
                        }
                    } else if mode == Mode::Peek {
                        pay = Some(h.paid());
                    } else if h.units >= cost {
                        h.units -= cost;
                        if let Kind::Log { .. } = h.kind {
                            let t = h.server_time(now);
                            h.spends.push((t, cost));
                        }
                        pay = Some(h.paid());
                    } else {
                        // Too little left for this request: given back in the trip
                        // (a bucket's spent reservation too, to leave its list).
                        let h = map.remove(key).expect("present");
                        if h.worth_giving(now) || h.listed(now) {
                            note(&self.inner, h.rule, ReserveCount::Returned, h.units);
                            give = Some(h.give_item());
                        } else {
                            note(&self.inner, h.rule, ReserveCount::Dropped, h.units);
                        }
                    }
                }
            }
            local.paid.push(pay);
            local.credit.push(give);
        }
        Ok(local)
    }

    /// The answer of a check every rule of which was paid from reservations: no trip.
    fn answer_locally(&self, g: &Generation, plan: &Plan<'_, String>, local: &Local) -> Decision {
        let results: crate::decision::RuleResults = plan
            .rules
            .iter()
            .zip(&local.paid)
            .map(|(rule, h)| local_result(rule, h.as_ref().expect("paid"), local.now))
            .collect();
        let d = Decision::from_results(results, false);
        bump(&self.inner.reserves.local, 1);
        for rule in &plan.rules {
            note(&self.inner, rule.name, ReserveCount::Local, 1);
        }
        self.count(g, &d, false);
        d
    }

    /// [`Limiter::reserved`] on the calling thread: answered there when the
    /// reservations pay for it, else the rest on the runtime.
    pub(super) fn reserved_blocking(&self, g: &Generation, plan: Plan<'_, String>, mode: Mode) -> Result<Decision> {
        let local = self.pay_locally(&plan, mode)?;
        if mode == Mode::Check && local.expired.is_empty() && local.paid.iter().all(Option::is_some) {
            return Ok(self.answer_locally(g, &plan, &local));
        }
        crate::runtime::block_on(Box::pin(self.reserved_after(g, plan, mode, local)))?
    }

    /// A check or peek whose plan has a reserved rule, on a network backend.
    pub(super) async fn reserved(&self, g: &Generation, plan: Plan<'_, String>, mode: Mode) -> Result<Decision> {
        let local = self.pay_locally(&plan, mode)?;
        if mode == Mode::Check && local.expired.is_empty() && local.paid.iter().all(Option::is_some) {
            return Ok(self.answer_locally(g, &plan, &local));
        }
        Box::pin(self.reserved_after(g, plan, mode, local)).await
    }

    /// What follows the local phase: give back what expired, then answer
    /// locally, or make the trip.
    async fn reserved_after(&self, g: &Generation, plan: Plan<'_, String>, mode: Mode, local: Local) -> Result<Decision> {
        let Some(remote) = &self.inner.remote else {
            return Err(Error::closed());
        };
        let Local { now, paid, credit, expired } = local;
        let clock_now = match &self.inner.clock {
            Clock::Backend => None,
            _ => Some(now),
        };
        let r = &self.inner.reserves;
        let cost = plan.cost;
        if !expired.is_empty() {
            give_back_noted(&self.inner, remote, clock_now, &expired).await;
        }
        // A check every rule of which is paid from reservations: no trip.
        if mode == Mode::Check && paid.iter().all(Option::is_some) {
            let local = Local { now, paid, credit, expired: Vec::new() };
            return Ok(self.answer_locally(g, &plan, &local));
        }
        // The trip: every rule of a peek, else the rules not paid locally.
        let sent: SmallVec<[usize; 4]> =
            (0..plan.rules.len()).filter(|&i| mode == Mode::Peek || paid[i].is_none()).collect();
        let keys: SmallVec<[String; 4]> = sent.iter().map(|&i| plan.keys[i].clone()).collect();
        let rules: SmallVec<[&CompiledRule; 4]> = sent.iter().map(|&i| plan.rules[i]).collect();
        let ext: Vec<PlanExt<String>> = plan
            .ext
            .iter()
            .filter_map(|e| sent.iter().position(|&i| i == e.at).map(|at| PlanExt { at, ..e.clone() }))
            .collect();
        let sub = Plan { keys, rules, cost, costs: None, call_id: None, ext, lease: plan.lease.clone() };
        let spec: String = match mode {
            Mode::Peek => String::new(),
            Mode::Check => sent
                .iter()
                .map(|&i| match (plan.rules[i].reserve, &credit[i]) {
                    (Some(res), Some(item)) => {
                        format!("{}/{}:{item}", res.units, res.duration.as_micros())
                    }
                    (Some(res), None) => format!("{}/{}", res.units, res.duration.as_micros()),
                    (None, _) => "0".into(),
                })
                .collect::<Vec<_>>()
                .join(","),
        };
        let refs = ext_refs(&sub);
        // A stacked concurrency rule takes its slots under the plan's lease id.
        let call_id = plan.lease.as_deref().unwrap_or("-");
        let header = Header {
            mode: if mode == Mode::Peek { "p" } else { "r" },
            now: clock_now,
            call_id,
            cost,
            costs: None,
            deadline: None,
            terse: false,
        };
        bump(&r.trips, 1);
        for rule in sub.rules.iter().filter(|r| r.reserve.is_some()) {
            note(&self.inner, rule.name, ReserveCount::Trips, 1);
        }
        let answer = run_script(remote, |sha| {
            let mut cmd = command(sha, &sub.keys, &sub.rules, &refs, header);
            if mode == Mode::Check {
                if refs.is_empty() {
                    cmd.arg("");
                }
                cmd.arg(&spec);
            }
            cmd
        })
        .await;
        let n = sub.keys.len();
        let parsed = answer.and_then(|reply| {
            let tail = if mode == Mode::Check { 4 * n } else { 0 };
            if reply.len() < 2 + tail {
                return Err(Error::new(
                    crate::error::ErrorKind::Backend,
                    "the check script returned too few values for a reservation",
                ));
            }
            let outcomes = parse_reply(&reply[..reply.len() - tail], n, &refs)?;
            Ok((reply[0], outcomes, reply[reply.len() - tail..].to_vec()))
        });
        let (server_now, outcomes, granted) = match parsed {
            Ok(p) => p,
            Err(e) => {
                self.unpay(&plan, &paid, cost, mode);
                if e.kind() == crate::error::ErrorKind::Timeout {
                    super::Counters::bump(&self.inner.counters.timeouts);
                }
                if e.kind().is_backend_failure() {
                    self.inner.outage.failed(&e);
                    return self.degrade(g, &plan, e);
                }
                return Err(e);
            }
        };
        self.inner.outage.succeeded();
        let trip_allowed = outcomes.iter().zip(&sub.rules).all(|(o, r)| o.allowed || r.shadow);
        let mut superseded = Vec::new();
        let mut results: crate::decision::RuleResults = Default::default();
        {
            let mut map = r.map();
            for (i, rule) in plan.rules.iter().enumerate() {
                let Some(at) = sent.iter().position(|&s| s == i) else {
                    let h = paid[i].as_ref().expect("paid");
                    results.push(local_result(rule, h, now));
                    continue;
                };
                let o = &outcomes[at];
                let mut res = crate::plan::result(rule, o);
                if let Some(reserve) = rule.reserve {
                    let value = |k: usize| granted.get(4 * at + k).copied().unwrap_or(0);
                    let g_units = value(0).max(0) as u64;
                    let reset_us = o.reset_after_us.max(0);
                    match mode {
                        Mode::Check => {
                            if g_units > 0 {
                                note(&self.inner, rule.name, ReserveCount::Reserved, g_units);
                                let kind = Kind::of(rule);
                                let spend_us = value(1).max(0);
                                let for_us = reserve.duration.as_micros() as i64;
                                let fresh = Held {
                                    units: g_units,
                                    seen: o.remaining,
                                    spend_end: now + spend_us,
                                    reset_end: now + reset_us,
                                    expires: now + for_us,
                                    give_until: match kind {
                                        Kind::Period => now + spend_us,
                                        Kind::Counters => now + reset_us,
                                        Kind::Log { window_us } => now + for_us + window_us,
                                        Kind::Bucket { .. } => i64::MAX,
                                    },
                                    tag: value(2),
                                    sent: now,
                                    server_t0: server_now,
                                    left: value(3),
                                    spends: Vec::new(),
                                    kind,
                                    rule: rule.name,
                                    limit: rule.limit,
                                    args: rule.script_args.clone(),
                                };
                                // Another check of this limiter reserved the same key
                                // meanwhile: the same counter adds up, another is given back.
                                let held = match map.remove(&plan.keys[i]) {
                                    Some(old)
                                        if old.tag == fresh.tag
                                            && matches!(old.kind, Kind::Period | Kind::Counters) =>
                                    {
                                        Held { units: old.units + fresh.units, ..fresh }
                                    }
                                    Some(old) => {
                                        if old.worth_giving(now) {
                                            superseded.push(to_return(&plan.keys[i], &old));
                                        } else {
                                            note(&self.inner, old.rule, ReserveCount::Dropped, old.units);
                                        }
                                        fresh
                                    }
                                    None => fresh,
                                };
                                res.remaining = o.remaining + held.units;
                                map.insert(plan.keys[i].clone(), held);
                            }
                        }
                        Mode::Peek => {
                            // The decision a check would get: the backend's units and ours.
                            if let Some(h) = &paid[i] {
                                let avail = if o.allowed { o.remaining + cost } else { o.remaining } + h.units;
                                res.allowed = cost <= avail;
                                res.remaining = if res.allowed { avail - cost } else { avail };
                                if res.allowed {
                                    res.retry_after = Duration::ZERO;
                                }
                                // A log's newest entry is this limiter's own reservation,
                                // stamped ahead: the direct path's newest is not after now.
                                if let Kind::Log { window_us } = h.kind {
                                    if res.allowed && cost > 0 && o.reset_after_us == h.tag + window_us - server_now {
                                        res.reset_after = Duration::from_micros(window_us as u64);
                                    }
                                }
                            }
                        }
                    }
                }
                results.push(res);
            }
        }
        if mode == Mode::Check && !trip_allowed {
            self.unpay(&plan, &paid, cost, mode);
            // Nothing was spent: the rules paid locally show what they still hold.
            for (i, res) in results.iter_mut().enumerate() {
                if let Some(h) = &paid[i] {
                    if !sent.contains(&i) {
                        let mut h = *h;
                        h.units += cost;
                        *res = local_result(plan.rules[i], &h, now);
                    }
                }
            }
        }
        if trip_allowed && mode == Mode::Check {
            for (i, rule) in plan.rules.iter().enumerate() {
                if paid[i].is_some() && !sent.contains(&i) {
                    note(&self.inner, rule.name, ReserveCount::Local, 1);
                }
            }
        }
        if !superseded.is_empty() {
            give_back_noted(&self.inner, remote, clock_now, &superseded).await;
        }
        if self.inner.reserves.sweeping.swap(true, Ordering::Relaxed) {
            // A sweeper runs already.
        } else {
            self.sweep_in_background();
        }
        let mut d = Decision::from_results(results, false);
        if mode == Mode::Check {
            self.lease_ticket(&mut d, g, &plan.rules, plan.lease.as_deref(), || plan.keys.to_vec());
        }
        self.count(g, &d, false);
        Ok(d)
    }

    /// Give the units paid locally back to their reservations (the request
    /// did not go through).
    fn unpay(&self, plan: &Plan<'_, String>, paid: &[Option<Paid>], cost: u64, mode: Mode) {
        if mode != Mode::Check {
            return;
        }
        let mut map = self.inner.reserves.map();
        for (key, paid) in plan.keys.iter().zip(paid) {
            if let Some(p) = paid {
                if let Some(h) = map.get_mut(key) {
                    if h.tag != p.tag {
                        continue;
                    }
                    h.units += cost;
                    if let Some(spend) = p.last_spend {
                        if let Some(at) = h.spends.iter().rposition(|s| *s == spend) {
                            h.spends.remove(at);
                        }
                    }
                }
            }
        }
    }

    /// Give back what is no longer spendable, every [`SWEEP_EVERY`], for as
    /// long as the limiter lives and is open (so an idle process does not
    /// sit on units others need).
    fn sweep_in_background(&self) {
        let Ok(rt) = crate::runtime::runtime() else {
            self.inner.reserves.sweeping.store(false, Ordering::Relaxed);
            return;
        };
        let weak: Weak<Inner> = Arc::downgrade(&self.inner);
        rt.spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(inner) = weak.upgrade() else { return };
                let l = Limiter { inner };
                if l.is_closed() {
                    return;
                }
                l.return_expired(false).await;
            }
        });
    }

    /// Give back the reservations no longer spendable (all of them when `all`).
    pub(super) async fn return_expired(&self, all: bool) {
        return_expired(&self.inner, all).await
    }

    /// On close: give every reservation back (see [`return_all`]).
    pub(super) fn return_all(&self) {
        return_all(&self.inner)
    }
}

/// "Now" on the limiter's clock (as [`Limiter::local_now`]).
fn inner_now(inner: &Inner) -> i64 {
    match &inner.clock {
        Clock::Manual(c) => c.now_us(),
        Clock::System => crate::clock::system_now_us(),
        Clock::Backend => inner.epoch_us + crate::clock::monotonic_us() - inner.started_us,
    }
}

/// Give back the reservations of `inner` no longer spendable (all of them when `all`).
async fn return_expired(inner: &Inner, all: bool) {
    let now = inner_now(inner);
    let (items, dropped) = inner.reserves.take_expired(now, all);
    for (rule, n) in dropped {
        note(inner, rule, ReserveCount::Dropped, n);
    }
    if items.is_empty() {
        return;
    }
    let Some(remote) = &inner.remote else { return };
    let clock_now = match &inner.clock {
        Clock::Backend => None,
        _ => Some(now),
    };
    give_back_noted(inner, remote, clock_now, &items).await;
}

/// Give every reservation of `inner` back, waiting for the backend at most
/// its timeout (on a thread of its own when called inside an async
/// runtime, where it may not block): on close, and when the last handle of
/// a limiter is dropped.
pub(super) fn return_all(inner: &Inner) {
    if inner.remote.is_none() || inner.reserves.map().is_empty() {
        return;
    }
    if tokio::runtime::Handle::try_current().is_err() {
        let _ = crate::runtime::block_on(return_expired(inner, true));
    } else {
        std::thread::scope(|s| {
            s.spawn(|| {
                let _ = crate::runtime::block_on(return_expired(inner, true));
            });
        });
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.closed.load(Ordering::SeqCst) {
            return_all(self);
        }
    }
}

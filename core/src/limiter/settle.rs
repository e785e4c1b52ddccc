//! Costs known only after the response ([`Limiter::settle`]) and waiting
//! instead of refusing ([`Limiter::acquire`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{AttrRef, CheckOptions, Generation, Limiter};
use crate::backend::{SettleOutcome, Settled};
use crate::decision::{ceil_millis, Decision, SettleTicket};
use crate::error::{Error, ErrorKind, Result};
use crate::key::Attributes;
use crate::plan::Plan;
use crate::policy::MAX_QUOTA_LIMIT;
use crate::runtime;

/// The waiters of [`Limiter::acquire`], one queue per set of keys: a fair
/// (first come, first served) lock that the head of the queue holds while
/// it waits for its turn.
#[derive(Default)]
pub(super) struct Waiters(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl Waiters {
    /// Join the queue of these keys (made when nobody waits on them).
    fn join<'w>(&'w self, keys: &[String]) -> Place<'w> {
        let name = keys.join("\n");
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let queue = map.entry(name.clone()).or_default().clone();
        Place { waiters: self, name, queue }
    }
}

/// A place in a queue of [`Waiters`]; leaving it (also when an acquire is
/// cancelled) forgets a queue that nobody else holds or waits on.
struct Place<'w> {
    waiters: &'w Waiters,
    name: String,
    queue: Arc<tokio::sync::Mutex<()>>,
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.0.lock().unwrap_or_else(|p| p.into_inner());
        // The map's reference and ours: nobody else waits.
        if Arc::strong_count(&self.queue) == 2 {
            map.remove(&self.name);
        }
    }
}

/// The `timeout` of an acquire as a front end read it: a number in its
/// unit, or text such as `"250ms"`; checked here so that every language
/// words its errors the same.
pub fn acquire_timeout(value: crate::options::OptionValue, unit: crate::options::DurationUnit) -> Result<Duration> {
    value.duration("timeout", unit)
}

/// The `actual_cost` of a settle as a front end read it: a whole number
/// (its bounds are checked by the settle itself).
pub fn actual_cost(value: crate::options::OptionValue) -> Result<u64> {
    match value {
        crate::options::OptionValue::Number(n) => {
            if n.fract() != 0.0 || !n.is_finite() || n < 0.0 || n >= u64::MAX as f64 {
                return Err(Error::invalid_argument(format!(
                    "actual_cost: expected a whole number of at least 0, got {n}"
                )));
            }
            Ok(n as u64)
        }
        other => Err(other.expected("actual_cost", "a whole number")),
    }
}

/// `actual_cost` of a settle: from 0 (the call cost nothing) to 10^15.
fn check_actual(actual: u64) -> Result<()> {
    if actual > MAX_QUOTA_LIMIT {
        return Err(Error::invalid_argument(format!(
            "actual_cost: must be between 0 and {MAX_QUOTA_LIMIT}, not {actual}"
        )));
    }
    Ok(())
}

/// The plan of a ticket's check, on the policy in force `g`: the rules (or
/// tiers) it consumed from, those a reload removed or moved left out.
fn ticket_plan<'g>(g: &'g Generation, ticket: &'g SettleTicket) -> Plan<'g, String> {
    let (keys, rules) = ticket
        .keys
        .iter()
        .zip(&ticket.rules)
        .filter_map(|(key, &(place, name))| {
            let rule = g.rules.located(place);
            (rule.name == name).then(|| (key.clone(), rule))
        })
        .unzip();
    Plan { keys, rules, cost: ticket.cost, costs: None, call_id: Some(ticket.call_id.as_str()), ext: Default::default(), lease: None }
}

impl Limiter {
    /// A ticket for the admitted check of `d`, when it had a call id and
    /// was decided by the backend: what a later settle needs.
    /// `places` are the planned rules' places ([`crate::plan::Rules::locate`]).
    pub(super) fn ticket(
        &self,
        d: &mut Decision,
        call_id: Option<&str>,
        cost: u64,
        keys: impl FnOnce() -> Vec<String>,
        places: impl FnOnce() -> Vec<(usize, Option<usize>)>,
    ) {
        if let (Some(id), true, false) = (call_id, d.allowed, d.degraded) {
            if !d.results.is_empty() {
                d.settle = Some(Arc::new(SettleTicket {
                    call_id: id.to_string(),
                    cost,
                    keys: keys(),
                    rules: places().into_iter().zip(d.results.iter().map(|r| r.rule)).collect(),
                }));
            }
        }
    }

    /// Settle an admitted check whose real cost is known only now (after the
    /// response): every rule the check consumed from is corrected, atomically
    /// per backend invocation, as if the check had cost `actual_cost`
    /// (capped at each rule's limit or capacity) from the start: the
    /// difference is given back, or the excess taken, even beyond the
    /// limit (the next requests then wait it off). A refund never returns
    /// more than the check took, and only while the check's units still count;
    /// a second settle of the same call id changes nothing. Returns the
    /// number of rules settled (0 for a denied or degraded decision, for a
    /// check already settled, or when no rule applied). When newer checks
    /// with call ids have pushed the call id out of a key's last 64, that
    /// rule cannot be settled: an [`ErrorKind::InvalidArgument`] error names
    /// the call id and those rules (the others are settled all the same).
    ///
    /// The check must have been made with a call id
    /// ([`CheckOptions::call_id`]): the backend records it, and the settle
    /// finds the check by it. Per algorithm, see docs/concepts/settle.md.
    pub async fn settle(&self, decision: &Decision, actual_cost: u64) -> Result<u32> {
        self.ensure_open()?;
        check_actual(actual_cost)?;
        let Some(ticket) = self.decision_ticket(decision)? else { return Ok(0) };
        let g = self.inner.current.load_full();
        let plan = ticket_plan(&g, ticket);
        self.settle_plan(&g, plan, actual_cost).await
    }

    /// [`Limiter::settle`] by call id, without the decision (for a settle
    /// made elsewhere than the check): the check's attributes, call id and
    /// cost (`estimated_cost`), and the real cost.
    pub async fn settle_call<A: Attributes + ?Sized>(
        &self,
        attrs: &A,
        call_id: &str,
        estimated_cost: u64,
        actual_cost: u64,
    ) -> Result<u32> {
        self.ensure_open()?;
        check_actual(actual_cost)?;
        let g = self.inner.current.load_full();
        let plan = g.rules.plan(&AttrRef(attrs), estimated_cost, Some(call_id), str::to_string)?;
        self.settle_plan(&g, plan, actual_cost).await
    }

    /// [`Limiter::settle`] for callers without an event loop.
    pub fn settle_blocking(&self, decision: &Decision, actual_cost: u64) -> Result<u32> {
        if self.inner.memory.is_some() || self.is_closed() {
            return self.settle_in_process(decision, actual_cost);
        }
        runtime::block_on(self.settle(decision, actual_cost))?
    }

    /// [`Limiter::settle_call`] for callers without an event loop.
    pub fn settle_call_blocking<A: Attributes + ?Sized>(
        &self,
        attrs: &A,
        call_id: &str,
        estimated_cost: u64,
        actual_cost: u64,
    ) -> Result<u32> {
        if self.inner.memory.is_some() || self.is_closed() {
            self.ensure_open()?;
            check_actual(actual_cost)?;
            let g = self.inner.current.load_full();
            let plan = g.rules.plan(&AttrRef(attrs), estimated_cost, Some(call_id), str::to_string)?;
            return self.settle_in_memory(&g, &plan, actual_cost);
        }
        runtime::block_on(self.settle_call(attrs, call_id, estimated_cost, actual_cost))?
    }

    /// A settle's plan decided by the embedded backend, in place.
    fn settle_in_memory(&self, g: &Generation, plan: &Plan<'_, String>, actual: u64) -> Result<u32> {
        let Some(memory) = &self.inner.memory else { return Err(Error::closed()) };
        let digests = Plan {
            keys: plan.keys.iter().map(|k| memory.digest(k)).collect(),
            rules: plan.rules.clone(),
            cost: plan.cost,
            costs: None,
            call_id: plan.call_id,
            ext: Default::default(),
            lease: None,
        };
        let settled = memory.settle(&digests, actual, self.local_now());
        self.count_settled(g, plan, &settled, actual);
        answer(plan, &settled)
    }

    /// Count a settle's corrections in the totals and, when metrics are
    /// on, per rule (in the counters of the policy `g` the plan was made
    /// on). A rule settled to
    /// `actual` (capped at its limit, as the backends cap it) gave back
    /// what the check's cost exceeded it by, or took what it exceeded the cost by.
    fn count_settled(&self, g: &Generation, plan: &Plan<'_, String>, settled: &[SettleOutcome], actual: u64) {
        let (mut rules, mut refunded, mut debited) = (0u32, 0u64, 0u64);
        for (rule, _) in plan.rules.iter().zip(settled).filter(|(_, &done)| done == SettleOutcome::Settled) {
            let actual = actual.min(rule.limit);
            let (back, taken) = (plan.cost.saturating_sub(actual), actual.saturating_sub(plan.cost));
            rules += 1;
            refunded += back;
            debited += taken;
            if let Some(m) = &g.metrics {
                m.settled(rule.index, back, taken);
            }
        }
        if rules > 0 {
            let c = &self.inner.counters;
            super::Counters::bump(&c.settled);
            c.refunded.fetch_add(refunded, std::sync::atomic::Ordering::Relaxed);
            c.debited.fetch_add(debited, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// [`Limiter::settle`] answered in place on the embedded backend.
    fn settle_in_process(&self, decision: &Decision, actual_cost: u64) -> Result<u32> {
        self.ensure_open()?;
        check_actual(actual_cost)?;
        let Some(ticket) = self.decision_ticket(decision)? else { return Ok(0) };
        let g = self.inner.current.load_full();
        let plan = ticket_plan(&g, ticket);
        self.settle_in_memory(&g, &plan, actual_cost)
    }

    /// The decision's ticket; `None` when there is nothing to settle, an
    /// error for an admitted decision whose check had no call id.
    fn decision_ticket<'d>(&self, decision: &'d Decision) -> Result<Option<&'d SettleTicket>> {
        match &decision.settle {
            Some(t) => Ok(Some(t)),
            None if decision.allowed && !decision.degraded && !decision.results.is_empty() => {
                Err(Error::invalid_argument(
                    "settle: the decision's check had no call_id; give the check a call_id to settle it later",
                ))
            }
            None => Ok(None),
        }
    }

    async fn settle_plan(&self, g: &Generation, plan: Plan<'_, String>, actual: u64) -> Result<u32> {
        if plan.keys.is_empty() {
            return Ok(0);
        }
        let settled = match (&self.inner.memory, &self.inner.remote) {
            (Some(_), _) => return self.settle_in_memory(g, &plan, actual),
            (None, Some(remote)) => {
                let now = match &self.inner.clock {
                    crate::clock::Clock::Backend => None,
                    _ => Some(self.local_now()),
                };
                let call_id = plan.call_id.expect("a settle has a call id");
                match remote.settle(&plan, call_id, actual, now).await {
                    Ok(s) => s,
                    Err(e) => {
                        if e.kind() == ErrorKind::Timeout {
                            super::Counters::bump(&self.inner.counters.timeouts);
                        }
                        return Err(e);
                    }
                }
            }
            (None, None) => return Err(Error::closed()),
        };
        self.count_settled(g, &plan, &settled, actual);
        answer(&plan, &settled)
    }

    /// Wait until a check of `cost` is admitted, at most `timeout`: returns
    /// the admitting decision, or fails with [`ErrorKind::Timeout`] (at once
    /// when the wait the backend asks for is longer than the time left).
    ///
    /// It never polls: a denied check waits exactly the `retry_after` it was
    /// told, then checks again. Concurrent waiters of this limiter on the
    /// same keys queue in arrival order: only the head of the queue checks,
    /// so they are admitted first come, first served, and each costs one
    /// check plus one per wait it is the head for.
    pub async fn acquire<A: Attributes + Sync + ?Sized>(&self, attrs: &A, cost: u64, timeout: Duration) -> Result<Decision> {
        self.acquire_with(attrs, &CheckOptions { cost, call_id: None }, timeout).await
    }

    /// [`Limiter::acquire`] with options (a call id, given to every check it makes).
    pub async fn acquire_with<A: Attributes + Sync + ?Sized>(
        &self,
        attrs: &A,
        options: &CheckOptions,
        timeout: Duration,
    ) -> Result<Decision> {
        let deadline = tokio::time::Instant::now() + timeout;
        let keys = self.keys(attrs);
        if keys.is_empty() || self.is_closed() {
            return self.check_with(attrs, options).await;
        }
        let place = self.inner.waiters.join(&keys);
        let answer = async {
            let Ok(_turn) = tokio::time::timeout_at(deadline, place.queue.lock()).await else {
                return Err(not_admitted(timeout, None));
            };
            loop {
                let d = self.check_with(attrs, options).await?;
                if d.allowed {
                    return Ok(d);
                }
                let wait = d.retry_after.max(Duration::from_micros(1));
                if tokio::time::Instant::now() + wait > deadline {
                    return Err(not_admitted(timeout, Some(&d)));
                }
                tokio::time::sleep(wait).await;
            }
        }
        .await;
        drop(place);
        answer
    }

    /// [`Limiter::acquire_with`] for callers without an event loop: blocks
    /// the calling thread while it waits.
    pub fn acquire_blocking<A: Attributes + Sync + ?Sized>(
        &self,
        attrs: &A,
        options: &CheckOptions,
        timeout: Duration,
    ) -> Result<Decision> {
        runtime::block_on(self.acquire_with(attrs, options, timeout))?
    }
}

/// The answer of a settle: the number of rules settled, or an error naming
/// the call id and the rules where it is no longer found among the key's
/// recent ids (pushed out by newer checks with call ids), so that its real
/// cost is never silently left unapplied there.
fn answer(plan: &Plan<'_, String>, settled: &Settled) -> Result<u32> {
    let done = settled.iter().filter(|&&s| s == SettleOutcome::Settled).count();
    let lost: Vec<String> = plan
        .rules
        .iter()
        .zip(settled)
        .filter(|(_, &s)| s == SettleOutcome::PushedOut)
        .map(|(r, _)| format!("{:?}", &*r.name))
        .collect();
    if lost.is_empty() {
        return Ok(done as u32);
    }
    Err(Error::invalid_argument(format!(
        "settle: call_id {:?} is no longer among the last 64 call ids recorded on the key of rule {}: \
         newer checks with call ids pushed it out, so its real cost was not applied there \
         (settled on {done} other rule{}); settle sooner, or give the key fewer checks with call ids between a check and its settle",
        plan.call_id.unwrap_or_default(),
        lost.join(", "),
        if done == 1 { "" } else { "s" },
    )))
}

/// The [`ErrorKind::Timeout`] of an acquire not admitted in time.
fn not_admitted(timeout: Duration, denied: Option<&Decision>) -> Error {
    let why = match denied.and_then(|d| d.rule.map(|r| (r, d.retry_after))) {
        Some((rule, wait)) => format!("; rule {:?} asks to wait {} ms more", &*rule, ceil_millis(wait)),
        None => String::new(),
    };
    Error::new(ErrorKind::Timeout, format!("acquire: not admitted within {} ms{why}", timeout.as_millis()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Policy, Rule};

    fn waiting(l: &Limiter) -> usize {
        l.inner.waiters.0.lock().unwrap().len()
    }

    #[tokio::test]
    async fn a_cancelled_or_finished_acquire_leaves_no_queue_behind() {
        let l = Limiter::in_memory(Policy::new(vec![Rule::sliding_window_log("w", "k:{k}", 1, Duration::from_secs(60))]).unwrap());
        let a = [("k", "x")];
        assert!(l.acquire(&a, 1, Duration::ZERO).await.unwrap().allowed);
        assert_eq!(waiting(&l), 0);
        // Denied for a minute: fails at once, and leaves nothing.
        let e = l.acquire(&a, 1, Duration::from_secs(1)).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert_eq!(e.message(), "acquire: not admitted within 1000 ms; rule \"w\" asks to wait 60000 ms more");
        assert_eq!(waiting(&l), 0);
        // Cancelled while it waits its turn behind another waiter.
        let head = tokio::spawn({
            let l = l.clone();
            async move { l.acquire(&[("k", "x")], 1, Duration::from_secs(120)).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(waiting(&l), 1);
        let second = tokio::time::timeout(Duration::from_millis(20), l.acquire(&a, 1, Duration::from_secs(120))).await;
        assert!(second.is_err(), "still queued behind the head");
        head.abort();
        let _ = head.await;
        assert_eq!(waiting(&l), 0);
    }
}

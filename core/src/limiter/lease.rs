//! The slots of concurrency rules: given back ([`Limiter::release`]) or
//! held longer ([`Limiter::extend`]) by lease id.

use std::sync::Arc;
use std::time::Duration;

use super::{AttrRef, Generation, Limiter};
use crate::clock::Clock;
use crate::decision::{Decision, LeaseTicket};
use crate::duration::format_duration;
use crate::error::{Error, ErrorKind, Result};
use crate::key::Attributes;
use crate::plan::CompiledRule;
use crate::policy::MAX_WINDOW;
use crate::runtime;

/// The `duration` of an extend as a front end read it: a number in its
/// unit, or text such as `"30s"`; its bounds are checked by the extend.
pub fn extend_duration(value: crate::options::OptionValue, unit: crate::options::DurationUnit) -> Result<Duration> {
    value.duration("duration", unit)
}

/// A new lease id as the limiter makes one (32 hex digits, 128 random
/// bits), for a front end that cannot carry a decision's generated lease id
/// (e.g. across a numeric record): give it as the check's call id, and the
/// lease is known by it ([`Limiter::release_call`]).
pub fn new_lease_id() -> String {
    runtime::random_lease_id()
}

/// An extend's `duration`: from 1 ms to 366 days.
fn check_duration(d: Duration) -> Result<i64> {
    if d < Duration::from_millis(1) || d > MAX_WINDOW {
        return Err(Error::invalid_argument(format!(
            "duration: must be between 1ms and 366d, not {}",
            if d.is_zero() { "0".to_string() } else { format_duration(d) }
        )));
    }
    Ok(d.as_micros() as i64)
}

/// What a release or an extend acts on: the keys of concurrency rules and
/// their rules (in the policy in force), and the lease id.
struct Leased<'g> {
    keys: Vec<String>,
    rules: Vec<&'g CompiledRule>,
    lease_id: String,
}

impl Limiter {
    /// True when a rule of the policy in force is a concurrency rule (its
    /// admitted checks hold slots until released).
    pub fn has_concurrency_rules(&self) -> bool {
        self.inner.current.load().policy.rules().iter().any(|r| matches!(r.algorithm, crate::policy::Algorithm::Concurrency { .. }))
    }

    /// Give the decision a lease ticket when it is an admitted check (not
    /// degraded) that took slots of a concurrency rule under `lease`.
    pub(super) fn lease_ticket(
        &self,
        d: &mut Decision,
        g: &Generation,
        rules: &[&CompiledRule],
        lease: Option<&str>,
        keys: impl FnOnce() -> Vec<String>,
    ) {
        let Some(lease) = lease else { return };
        if !d.allowed || d.degraded {
            return;
        }
        // The concurrency rules that admitted (a shadow rule that denied took nothing).
        let took: Vec<usize> = rules
            .iter()
            .zip(&d.results)
            .enumerate()
            .filter(|(_, (r, res))| r.is_lease() && res.allowed)
            .map(|(i, _)| i)
            .collect();
        if took.is_empty() {
            return;
        }
        let all = keys();
        d.lease = Some(Arc::new(LeaseTicket {
            lease_id: lease.to_string(),
            keys: took.iter().map(|&i| all[i].clone()).collect(),
            rules: took.iter().map(|&i| (g.rules.locate(rules[i]), rules[i].name)).collect(),
        }));
    }

    /// The concurrency rules of a decision's ticket still in the policy in force.
    fn ticket_leased<'g>(g: &'g Generation, t: &LeaseTicket) -> Leased<'g> {
        let (keys, rules) = t
            .keys
            .iter()
            .zip(&t.rules)
            .filter_map(|(key, &(place, name))| {
                let rule = g.rules.located(place);
                (rule.name == name && rule.is_lease()).then(|| (key.clone(), rule))
            })
            .unzip();
        Leased { keys, rules, lease_id: t.lease_id.clone() }
    }

    /// The concurrency rules that apply to these attributes, for lease `call_id`.
    fn call_leased<'g>(g: &'g Generation, attrs: &dyn Attributes, call_id: &'g str) -> Result<Leased<'g>> {
        let plan = g.rules.plan(attrs, 1, Some(call_id), str::to_string)?;
        let (keys, rules) = plan.keys.into_iter().zip(plan.rules).filter(|(_, r)| r.is_lease()).unzip();
        Ok(Leased { keys, rules, lease_id: call_id.to_string() })
    }

    /// Give back the slots the check of `decision` holds, on every
    /// concurrency rule it took them from: at once, without waiting for the
    /// lease to end. Returns the number of rules whose slots this call freed:
    /// 0 for a denied or degraded decision, one without a concurrency rule,
    /// one already released, or one whose lease has ended (a release after
    /// the lease frees nothing: the lease id, not a counter, is removed, so
    /// it never frees another holder's slot). Releasing twice is harmless.
    pub async fn release(&self, decision: &Decision) -> Result<u32> {
        self.ensure_open()?;
        let Some(t) = &decision.lease else { return Ok(0) };
        let g = self.inner.current.load_full();
        self.lease_op(Self::ticket_leased(&g, t), None).await
    }

    /// [`Limiter::release`] by lease id, without the decision: the check's
    /// attributes and its `call_id` (the lease id of a check made with
    /// [`crate::CheckOptions::call_id`]).
    pub async fn release_call<A: Attributes + ?Sized>(&self, attrs: &A, call_id: &str) -> Result<u32> {
        self.ensure_open()?;
        let g = self.inner.current.load_full();
        self.lease_op(Self::call_leased(&g, &AttrRef(attrs), call_id)?, None).await
    }

    /// Hold the slots of `decision`'s check longer: each lease still held
    /// now ends `duration` from now (on the backend's clock: Redis `TIME`).
    /// A lease that has ended or was released is never brought back.
    /// Returns the number of rules whose lease was renewed (0 when none was
    /// held). `duration`: from 1 ms to 366 days.
    pub async fn extend(&self, decision: &Decision, duration: Duration) -> Result<u32> {
        self.ensure_open()?;
        let us = check_duration(duration)?;
        let Some(t) = &decision.lease else { return Ok(0) };
        let g = self.inner.current.load_full();
        self.lease_op(Self::ticket_leased(&g, t), Some(us)).await
    }

    /// [`Limiter::extend`] by lease id, without the decision.
    pub async fn extend_call<A: Attributes + ?Sized>(&self, attrs: &A, call_id: &str, duration: Duration) -> Result<u32> {
        self.ensure_open()?;
        let us = check_duration(duration)?;
        let g = self.inner.current.load_full();
        self.lease_op(Self::call_leased(&g, &AttrRef(attrs), call_id)?, Some(us)).await
    }

    /// [`Limiter::release`] for callers without an event loop.
    pub fn release_blocking(&self, decision: &Decision) -> Result<u32> {
        self.ensure_open()?;
        let Some(t) = &decision.lease else { return Ok(0) };
        let g = self.inner.current.load_full();
        self.lease_op_blocking(Self::ticket_leased(&g, t), None)
    }

    /// [`Limiter::release_call`] for callers without an event loop.
    pub fn release_call_blocking<A: Attributes + ?Sized>(&self, attrs: &A, call_id: &str) -> Result<u32> {
        self.ensure_open()?;
        let g = self.inner.current.load_full();
        self.lease_op_blocking(Self::call_leased(&g, &AttrRef(attrs), call_id)?, None)
    }

    /// [`Limiter::extend`] for callers without an event loop.
    pub fn extend_blocking(&self, decision: &Decision, duration: Duration) -> Result<u32> {
        self.ensure_open()?;
        let us = check_duration(duration)?;
        let Some(t) = &decision.lease else { return Ok(0) };
        let g = self.inner.current.load_full();
        self.lease_op_blocking(Self::ticket_leased(&g, t), Some(us))
    }

    /// [`Limiter::extend_call`] for callers without an event loop.
    pub fn extend_call_blocking<A: Attributes + ?Sized>(&self, attrs: &A, call_id: &str, duration: Duration) -> Result<u32> {
        self.ensure_open()?;
        let us = check_duration(duration)?;
        let g = self.inner.current.load_full();
        self.lease_op_blocking(Self::call_leased(&g, &AttrRef(attrs), call_id)?, Some(us))
    }

    /// A release (`extend_us` `None`) or an extend answered in place on
    /// the embedded backend; `None` for a network backend.
    fn lease_in_process(&self, leased: &Leased<'_>, extend_us: Option<i64>) -> Option<Result<u32>> {
        let memory = self.inner.memory.as_ref()?;
        if leased.keys.is_empty() {
            return Some(Ok(0));
        }
        let now = self.local_now();
        let digests: Vec<_> = leased.keys.iter().map(|k| memory.digest(k)).collect();
        let done = memory.lease(&digests, &leased.lease_id, extend_us.map(|d| now + d), now);
        Some(Ok(done.iter().filter(|&&b| b).count() as u32))
    }

    fn lease_op_blocking(&self, leased: Leased<'_>, extend_us: Option<i64>) -> Result<u32> {
        if let Some(answer) = self.lease_in_process(&leased, extend_us) {
            return answer;
        }
        if leased.keys.is_empty() {
            return Ok(0);
        }
        runtime::block_on(self.lease_op(leased, extend_us))?
    }

    async fn lease_op(&self, leased: Leased<'_>, extend_us: Option<i64>) -> Result<u32> {
        if let Some(answer) = self.lease_in_process(&leased, extend_us) {
            return answer;
        }
        if leased.keys.is_empty() {
            return Ok(0);
        }
        let Some(remote) = &self.inner.remote else { return Err(Error::closed()) };
        let now = match &self.inner.clock {
            Clock::Backend => None,
            _ => Some(self.local_now()),
        };
        match remote.lease(&leased.keys, &leased.rules, &leased.lease_id, extend_us, now).await {
            Ok(done) => Ok(done.iter().filter(|&&b| b).count() as u32),
            Err(e) => {
                if e.kind() == ErrorKind::Timeout {
                    super::Counters::bump(&self.inner.counters.timeouts);
                }
                Err(e)
            }
        }
    }
}

//! The [`Limiter`]: a policy bound to a backend, and the one check path.
//!
//! Every check, whatever the backend and the front end, goes
//! [`Rules::plan`] (validation and keys) -> the embedded store in process,
//! or the deny cache and then the network -> [`decide`] or [`Limiter::degrade`]
//! -> counted. Blocking, batched and in-process entry points are thin
//! shells around that path.

mod builder;
mod current;
mod lease;
mod http;
mod metrics;
mod options;
mod reload;
mod reserve;
mod settle;
mod stats;
mod wire;
pub(crate) mod overrides;

pub use builder::{LimiterBuilder, LimiterOptions};
pub use http::{RouteLimit, ROUTE_LIMIT_KEY};
pub use options::{CheckOption, LimiterOption};
pub use metrics::{LatencyHistogram, Metrics, RuleMetrics, LATENCY_BUCKETS, METRICS_CONTENT_TYPE};
pub use reload::{ReloadStatus, RELOAD_POLL_INTERVAL};
pub use metrics::{CounterSamples, MetricFamily, MetricKind, RuleReserveMetrics, METRIC_FAMILIES, OUTCOMES};
pub use lease::{extend_duration, new_lease_id};
pub use settle::{acquire_timeout, actual_cost};
pub use stats::Stats;
pub use reserve::ReserveStats;
pub use wire::{Wire, WireAddress, WireOutcomes};

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use smallvec::SmallVec;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesOrdered, StreamExt};
use futures_util::FutureExt;

use crate::backend::memory::MemoryBackend;
use crate::backend::{Connection, Outcomes};
use crate::clock::{system_now_us, Clock};
use crate::decision::{Decision, HeaderOptions, RuleName, RuleResult};
use crate::deny_cache::DenyCache;
use crate::error::{Error, ErrorKind, Result};
use crate::key::Attributes;
use crate::plan::{decide, Mode, Plan, Rules};
use crate::policy::{FailureMode, Policy};
use crate::runtime;
use metrics::RuleCounters;
use stats::Counters;

/// How long a degraded denial asks the client to wait.
pub const DEGRADED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Options of one check: its cost and, optionally, an id that makes it idempotent.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Units this request costs (default 1); from 1 to each applicable rule's limit.
    pub cost: u64,
    /// An id for this call, to make a retry of the same request idempotent:
    /// a second call with the same id is answered without counting again.
    /// 1-64 characters from `A-Z a-z 0-9 _ -`. When absent, a random id is used.
    pub call_id: Option<String>,
}

impl Default for CheckOptions {
    /// Cost 1, no call id.
    fn default() -> Self {
        CheckOptions { cost: 1, call_id: None }
    }
}

/// One item of a check over several items ([`Limiter::check_items`]): a
/// request's attributes and what it costs.
#[derive(Debug, Clone)]
pub struct CheckItem<A> {
    /// The attributes the rules' keys and matches read.
    pub attributes: A,
    /// Units it costs on each rule it reaches: 0 decides and reports that
    /// rule without counting anything.
    pub cost: u64,
}

/// The answer to [`Limiter::check_items`].
#[derive(Debug, Clone)]
pub struct ItemsDecision {
    /// The decision of the one all-or-nothing check: one result per key
    /// checked (a rule that two items reach with different keys has two).
    pub decision: Decision,
    /// For each item, in item order, the positions in `decision.results`
    /// of the results of the rules it reached (empty: none applies to it).
    pub items: Vec<Vec<usize>>,
}

/// One call of a batch (see [`Limiter::check_batch`]).
#[derive(Debug, Clone)]
pub struct BatchCall<A> {
    /// The request's attributes.
    pub attributes: A,
    /// Cost and call id (a peek ignores the call id).
    pub options: CheckOptions,
    /// A peek instead of a check.
    pub peek: bool,
}

/// A policy in force: what a check reads, swapped whole by a reload. A
/// check loads it once and finishes on it, whatever a reload does meanwhile.
struct Generation {
    policy: Policy,
    rules: Rules,
    /// Per-rule metrics, unless turned off (kept rules share their cells
    /// with the generation before).
    metrics: Option<RuleCounters>,
    /// Remembered denials, when asked for (network backends only).
    deny_cache: Option<DenyCache>,
}

struct Inner {
    /// The policy in force.
    current: current::Current<Generation>,
    /// The embedded backend's store (emptied by `close`); `None` for a network backend.
    memory: Option<MemoryBackend>,
    /// The network backend; `None` for the embedded one.
    remote: Option<Connection>,
    /// The builder's settings a reloaded policy gets too.
    overrides: reload::Overrides,
    /// Reloads applied and refused.
    reloads: reload::ReloadCounters,
    clock: Clock,
    /// The headers decisions get where a front end makes them per limiter.
    headers: HeaderOptions,
    /// The monotonic clock's reading (`clock::monotonic_us`) when the limiter was built.
    started_us: i64,
    epoch_us: i64,
    closed: AtomicBool,
    counters: Counters,
    /// The queues of `acquire`.
    waiters: settle::Waiters,
    /// The backend's outage in progress, if any (reported to the health sink).
    outage: crate::health::Outage,
    /// Units of reserved rules held in process.
    reserves: reserve::Reserves,
}

/// A rate limiter: a policy bound to a backend (Redis or in-memory).
///
/// Cheap to clone (clones share everything) and safe to use from many tasks
/// and threads at once. The async methods run inside any Tokio runtime with
/// the time driver enabled; the `_blocking` ones, for callers without an
/// event loop, on the core's own runtime ([`crate::runtime`]).
///
/// After `fork()`, a limiter made before it keeps working in the child: on
/// Redis it connects anew on its first call, and the embedded backend's
/// child keeps a copy of the state as it was at the fork (parent and child
/// count separately from then on).
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &self.inner.current.load().policy.rules().len())
            .field("backend", &self.backend_name())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Limiter {
    /// Start building a limiter for `policy`.
    pub fn builder(policy: Policy) -> LimiterBuilder {
        LimiterBuilder::new(policy)
    }

    /// A limiter for `policy` with `options`.
    pub fn with_options(policy: Policy, options: LimiterOptions) -> Result<Limiter> {
        LimiterBuilder::new(policy).options(options).build()
    }

    /// A limiter for `policy` on the embedded in-memory backend.
    pub fn in_memory(policy: Policy) -> Limiter {
        Limiter::builder(policy)
            .build()
            .expect("a validated policy always builds an in-memory limiter")
    }

    /// The policy in force (the last one reloaded), with the builder's
    /// overrides applied.
    pub fn policy(&self) -> Policy {
        self.inner.current.load().policy.clone()
    }

    /// The header options given when the limiter was made
    /// ([`LimiterOptions::legacy_headers`]), for [`Decision::headers_with`].
    pub fn header_options(&self) -> HeaderOptions {
        self.inner.headers
    }

    /// The rule names in policy order: what [`RuleResult::index`] refers to.
    pub fn rule_names(&self) -> Vec<RuleName> {
        self.inner.current.load().rules.names()
    }

    /// `"memory"`, `"redis"` or `"cluster"` (`"closed"` after [`Limiter::close`]).
    pub fn backend_name(&self) -> &'static str {
        match (&self.inner.remote, self.is_closed()) {
            (_, true) => "closed",
            (Some(c), false) => c.name(),
            (None, false) => "memory",
        }
    }

    /// Check a request of cost 1 or more: consume from every applicable rule
    /// if all admit it, nothing otherwise.
    pub async fn check<A: Attributes + ?Sized>(&self, attrs: &A, cost: u64) -> Result<Decision> {
        self.run(&AttrRef(attrs), cost, None, Mode::Check).await
    }

    /// [`Limiter::check`] with options (an explicit call id).
    pub async fn check_with<A: Attributes + ?Sized>(&self, attrs: &A, options: &CheckOptions) -> Result<Decision> {
        self.run(&AttrRef(attrs), options.cost, options.call_id.as_deref(), Mode::Check).await
    }

    /// The decision a check of this cost would get now, without consuming anything.
    pub async fn peek<A: Attributes + ?Sized>(&self, attrs: &A, cost: u64) -> Result<Decision> {
        self.run(&AttrRef(attrs), cost, None, Mode::Peek).await
    }

    /// Check several items in one all-or-nothing check, each rule at the
    /// cost of the item that reaches it: every rule that applies to an item
    /// is checked on the key that item gives it, at that item's cost (a key
    /// that several items reach, at the sum of their costs), and the request
    /// is recorded everywhere if every rule admits it, nowhere otherwise. A
    /// rule reached only at cost 0 is checked without consuming: decided as
    /// a request of cost 1 would be, it reports what is left and denies the
    /// check when nothing is, and records nothing. One script run (one round
    /// trip on one Redis node; on Redis Cluster, one per hash slot, given
    /// back on a denial as for every check).
    ///
    /// A concurrency rule is refused, and so is a rule that reserves units
    /// in process when the items' costs differ ([`ErrorKind::InvalidArgument`]).
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use throttlegate::{CheckItem, Limiter, Policy};
    /// let policy = Policy::from_toml_str(r#"
    ///     [[rules]]
    ///     name = "user"
    ///     key = "{user}"
    ///     algorithm = "fixed_window"
    ///     limit = 5
    ///     window = "1m"
    /// "#).unwrap();
    /// let limiter = Limiter::in_memory(policy);
    /// let items = [
    ///     CheckItem { attributes: [("user", "u1")], cost: 3 },
    ///     CheckItem { attributes: [("user", "u2")], cost: 0 },
    /// ];
    /// let d = limiter.check_items(&items).await.unwrap();
    /// assert!(d.decision.allowed);
    /// assert_eq!(d.decision.results[d.items[0][0]].remaining, 2);
    /// assert_eq!(d.decision.results[d.items[1][0]].remaining, 5);
    /// # });
    /// ```
    pub fn check_items<'a, A: Attributes>(&'a self, items: &[CheckItem<A>]) -> impl Future<Output = Result<ItemsDecision>> + Send + 'a {
        let refs: SmallVec<[(&dyn Attributes, u64); 4]> = items.iter().map(|i| (&i.attributes as &dyn Attributes, i.cost)).collect();
        let planned = if self.is_closed() {
            Err(Err(Error::closed()))
        } else if let Some(memory) = &self.inner.memory {
            let g = self.inner.current.load();
            Err(g.rules.plan_items(&refs, |k| memory.digest(k)).and_then(|(plan, reached)| {
                let d = if plan.keys.is_empty() {
                    Decision::unlimited()
                } else {
                    decide(&plan.rules, &memory.eval(&plan, Mode::Check, self.local_now())?)
                };
                self.count(&g, &d, false);
                Ok(items_decision(d, reached))
            }))
        } else {
            let g = self.inner.current.load_full();
            let plan = g.rules.plan_items(&refs, str::to_string).map(|(p, reached)| {
                let rules: SmallVec<[(usize, Option<usize>); 4]> = p.rules.iter().map(|r| g.rules.locate(r)).collect();
                (p.keys, rules, p.ext, p.cost, p.costs, reached)
            });
            Ok((g, plan))
        };
        // An answer made in process is returned ready: the future of the
        // network path is several kilobytes, moved at every await above.
        let (g, plan) = match planned {
            Err(answer) => return futures_util::future::Either::Left(std::future::ready(answer)),
            Ok(planned) => planned,
        };
        futures_util::future::Either::Right(Box::pin(async move {
            let (keys, rules, ext, cost, costs, reached) = plan?;
            let rules = rules.iter().map(|&at| g.rules.located(at)).collect();
            let plan = Plan { keys, rules, cost, costs, call_id: None, ext, lease: None };
            let d = if reserve::has_reserved(&plan) {
                self.reserved(&g, plan, Mode::Check).await?
            } else {
                self.send(&g, plan, Mode::Check).await?
            };
            Ok(items_decision(d, reached))
        }))
    }

    /// Forget the state of every rule that applies to this request (to
    /// unblock a customer). Returns how many keys existed.
    pub async fn reset<A: Attributes + ?Sized>(&self, attrs: &A) -> Result<u64> {
        self.ensure_open()?;
        let keys = {
            let g = self.inner.current.load();
            let keys = g.rules.reset_keys(&AttrRef(attrs));
            if let Some(c) = &g.deny_cache {
                c.forget(&keys);
            }
            self.inner.reserves.forget(&keys);
            keys
        };
        if keys.is_empty() {
            return Ok(0);
        }
        match (&self.inner.memory, &self.inner.remote) {
            (Some(m), _) => Ok(m.reset(&keys, self.local_now())),
            (None, Some(remote)) => remote.reset(&keys).await,
            (None, None) => Err(Error::closed()),
        }
    }

    /// The keys this request touches, one per applicable rule, in policy order.
    pub fn keys<A: Attributes + ?Sized>(&self, attrs: &A) -> Vec<String> {
        self.inner.current.load().rules.keys(&AttrRef(attrs))
    }

    /// Check that the backend answers (a `PING` for Redis), within the timeout.
    pub async fn ping(&self) -> Result<()> {
        self.ensure_open()?;
        match &self.inner.remote {
            Some(remote) => remote.ping().await,
            None => Ok(()),
        }
    }

    /// True while the backend is in an outage: from a call that failed
    /// (unreachable, too slow, or answering with an error) until the next
    /// call that succeeds. Always false on the embedded backend.
    pub fn is_backend_down(&self) -> bool {
        self.inner.outage.is_down()
    }

    /// The strict start-up check ([`LimiterBuilder::strict`]): connect,
    /// `PING`, and run the check script once on no key, within the timeout;
    /// on the calling thread, or on a thread of its own when the caller is
    /// inside an async runtime (where it may not wait).
    fn probe(&self) -> Result<()> {
        if self.inner.remote.is_none() {
            return Ok(());
        }
        let probe = |l: &Limiter| match &l.inner.remote {
            Some(remote) => runtime::block_on(remote.probe()).and_then(|r| r),
            None => Ok(()),
        };
        let r = if tokio::runtime::Handle::try_current().is_err() {
            probe(self)
        } else {
            let l = self.clone();
            std::thread::spawn(move || probe(&l)).join().unwrap_or_else(|p| Err(Error::from_panic(p.as_ref())))
        };
        r.map_err(|e| {
            Error::new(e.kind(), format!("strict: the backend failed the start-up check: {e}")).set_temporary(e.is_temporary())
        })
    }

    /// [`Limiter::check_with`] for callers without an event loop: answered
    /// in place on the embedded backend, else on the calling thread with the
    /// core's runtime driving the connection.
    pub fn check_blocking<A: Attributes + ?Sized>(&self, attrs: &A, options: &CheckOptions) -> Result<Decision> {
        self.run_blocking(&AttrRef(attrs), options.cost, options.call_id.as_deref(), Mode::Check)
    }

    /// [`Limiter::peek`] for callers without an event loop.
    pub fn peek_blocking<A: Attributes + ?Sized>(&self, attrs: &A, cost: u64) -> Result<Decision> {
        self.run_blocking(&AttrRef(attrs), cost, None, Mode::Peek)
    }

    /// [`Limiter::reset`] for callers without an event loop.
    pub fn reset_blocking<A: Attributes + ?Sized>(&self, attrs: &A) -> Result<u64> {
        runtime::block_on(self.reset(attrs))?
    }

    /// [`Limiter::ping`] for callers without an event loop.
    pub fn ping_blocking(&self) -> Result<()> {
        runtime::block_on(self.ping())?
    }

    /// Decide many calls at once, concurrently (on Redis their commands are
    /// pipelined on the one connection): one answer per call, in call
    /// order. A panic in one call is that call's [`ErrorKind::Internal`]
    /// error. For front ends that gather the calls of one event-loop tick.
    pub async fn check_batch<A: Attributes>(&self, calls: &[BatchCall<A>]) -> Vec<Result<Decision>> {
        calls
            .iter()
            .map(|c| {
                let call = async move {
                    let (cost, id) = (c.options.cost, c.options.call_id.as_deref());
                    let mode = if c.peek { Mode::Peek } else { Mode::Check };
                    self.run(&c.attributes, cost, if c.peek { None } else { id }, mode).await
                };
                std::panic::AssertUnwindSafe(call).catch_unwind().map(caught)
            })
            .collect::<FuturesOrdered<_>>()
            .collect()
            .await
    }

    /// Counters since the limiter was made.
    pub fn stats(&self) -> Stats {
        self.inner.counters.read()
    }

    /// Per-rule metrics since the limiter was made; `None` when they were
    /// turned off ([`LimiterOptions::metrics`]).
    pub fn metrics(&self) -> Option<Metrics> {
        let mut m = self.inner.current.load().metrics.as_ref().map(RuleCounters::read)?;
        let status = self.reload_status();
        (m.reloads, m.reload_errors) = (status.reloads, status.errors);
        Some(m)
    }

    /// [`Limiter::metrics`] as the OpenMetrics text exposition, for a
    /// `/metrics` endpoint ([`METRICS_CONTENT_TYPE`]).
    pub fn metrics_text(&self) -> Option<String> {
        self.metrics().map(|m| m.to_text())
    }

    /// Count a decision in the totals and, when on, per rule (in the
    /// counters of the policy that decided it).
    fn count(&self, g: &Generation, d: &Decision, degraded: bool) {
        self.count_in(stats::stripe(), g, d, degraded);
    }

    /// [`Limiter::count`] in this thread's stripe `s`, already looked up.
    fn count_in(&self, s: stats::StripeRef, g: &Generation, d: &Decision, degraded: bool) {
        self.count_results(s, g, d.allowed, &d.results, degraded);
    }

    /// [`Limiter::count_in`] of a decision not made yet: whether it admits, and its rule results.
    #[inline]
    fn count_results(&self, s: stats::StripeRef, g: &Generation, allowed: bool, results: &[RuleResult], degraded: bool) {
        self.inner.counters.count_one(s, allowed);
        if let Some(m) = &g.metrics {
            m.count(s, results, degraded);
        }
    }

    /// Entries held by the embedded backend (expired ones not yet swept
    /// included); `None` for other backends.
    pub fn memory_entries(&self) -> Option<usize> {
        self.inner.memory.as_ref().map(MemoryBackend::len)
    }

    /// Close the limiter: drop its connections and state. Every later check,
    /// peek, reset and ping fails with [`ErrorKind::Closed`]; the counters,
    /// [`Limiter::keys`] and the policy still answer, and the backend's name
    /// is `"closed"`. Closing twice is harmless.
    pub fn close(&self) {
        if !self.is_closed() {
            self.return_all();
        }
        self.inner.closed.store(true, Ordering::SeqCst);
        if let Some(r) = &self.inner.remote {
            r.close();
        }
        if let Some(m) = &self.inner.memory {
            m.clear();
        }
        if let Some(c) = &self.inner.current.load().deny_cache {
            c.clear();
        }
    }

    /// True after [`Limiter::close`].
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    fn ensure_open(&self) -> Result<()> {
        if self.is_closed() {
            Err(Error::closed())
        } else {
            Ok(())
        }
    }

    /// "Now" for the embedded backend, and for the System/Manual clocks.
    fn local_now(&self) -> i64 {
        match &self.inner.clock {
            Clock::Manual(c) => c.now_us(),
            Clock::System => system_now_us(),
            Clock::Backend => self.inner.epoch_us + crate::clock::monotonic_us() - self.inner.started_us,
        }
    }

    /// True when the backend answers in process (the embedded backend), so
    /// [`Limiter::check_in_process`] answers without a runtime.
    pub fn is_in_process(&self) -> bool {
        self.inner.memory.is_some() && !self.is_closed()
    }

    /// [`Limiter::check_with`] answered synchronously, without a runtime,
    /// when the backend is in process (or the limiter is closed); `None` for
    /// a network backend (use the async or blocking methods).
    pub fn check_in_process<A: Attributes + ?Sized>(&self, attrs: &A, options: &CheckOptions) -> Option<Result<Decision>> {
        self.in_process(&AttrRef(attrs), options.cost, options.call_id.as_deref(), Mode::Check)
    }

    /// [`Limiter::peek`] answered synchronously when the backend is in process; `None` otherwise.
    pub fn peek_in_process<A: Attributes + ?Sized>(&self, attrs: &A, cost: u64) -> Option<Result<Decision>> {
        self.in_process(&AttrRef(attrs), cost, None, Mode::Peek)
    }

    /// The embedded backend's answer: keys are rendered into a reused
    /// buffer and only their digests kept, so a check allocates nothing but
    /// its decision. `None` for a network backend that is open.
    #[inline]
    fn in_process(&self, attrs: &dyn Attributes, cost: u64, call_id: Option<&str>, mode: Mode) -> Option<Result<Decision>> {
        if self.is_closed() {
            return Some(Err(Error::closed()));
        }
        let memory = self.inner.memory.as_ref()?;
        // Each call returns its callee's answer as it is (no moves in
        // between), so the decision is made where the caller reads it.
        self.inner.current.with(|g, s| self.embedded(memory, g, s, attrs, cost, call_id, mode))
    }

    /// [`Limiter::in_process`] on the embedded backend, under the policy `g`
    /// (always `Some`).
    #[allow(clippy::too_many_arguments)]
    fn embedded(&self, memory: &MemoryBackend, g: &Generation, s: stats::StripeRef, attrs: &dyn Attributes, cost: u64, call_id: Option<&str>, mode: Mode) -> Option<Result<Decision>> {
        if let (Some(rule), None) = (g.rules.lone(), call_id) {
            // The commonest shape, decided without a plan, counted from
            // its rule's result.
            return match g.rules.lone_digest(rule, attrs, cost) {
                Err(e) => Some(Err(e)),
                Ok(None) => {
                    let d = Decision::unlimited();
                    self.count_in(s, g, &d, false);
                    Some(Ok(d))
                }
                Ok(Some(digest)) => {
                    let o = memory.eval_one(digest, rule.args, mode, cost, self.local_now());
                    let r = crate::plan::result(rule, &o);
                    // As `Decision::from_one` will answer: a shadow rule admits.
                    self.count_results(s, g, r.allowed || r.shadow, std::slice::from_ref(&r), false);
                    Some(Ok(Decision::from_one(r, false)))
                }
            };
        }
        Some(self.planned(memory, g, s, attrs, cost, call_id, mode))
    }

    /// [`Limiter::embedded`] of a policy that needs a plan.
    #[allow(clippy::too_many_arguments)]
    fn planned(&self, memory: &MemoryBackend, g: &Generation, s: stats::StripeRef, attrs: &dyn Attributes, cost: u64, call_id: Option<&str>, mode: Mode) -> Result<Decision> {
        g.rules.plan(attrs, cost, call_id, |k| memory.digest(k)).and_then(|plan| {
            let mut d = if plan.keys.is_empty() {
                Decision::unlimited()
            } else {
                decide(&plan.rules, &memory.eval(&plan, mode, self.local_now())?)
            };
            if mode == Mode::Check {
                self.ticket(&mut d, call_id, cost, || g.rules.keys(attrs), || plan.rules.iter().map(|r| g.rules.locate(r)).collect());
                self.lease_ticket(&mut d, g, &plan.rules, plan.lease.as_deref(), || g.rules.keys(attrs));
            }
            self.count_in(s, g, &d, false);
            Ok(d)
        })
    }

    /// A check or peek: in process on the embedded backend, else through
    /// the deny cache and the network. The attributes are read before the
    /// future is made, so it holds none of them; it holds the policy in
    /// force when it was made, and finishes on it.
    fn run<'a>(
        &'a self,
        attrs: &dyn Attributes,
        cost: u64,
        call_id: Option<&'a str>,
        mode: Mode,
    ) -> impl Future<Output = Result<Decision>> + Send + 'a {
        let planned = match self.in_process(attrs, cost, call_id, mode) {
            Some(answer) => Err(answer),
            None => {
                let g = self.inner.current.load_full();
                let plan = g.rules.plan(attrs, cost, call_id, str::to_string).map(|p| {
                    let rules: SmallVec<[(usize, Option<usize>); 4]> = p.rules.iter().map(|r| g.rules.locate(r)).collect();
                    (p.keys, rules, p.ext, p.lease)
                });
                Ok((g, plan))
            }
        };
        async move {
            match planned {
                Err(answer) => answer,
                Ok((g, plan)) => {
                    let (keys, rules, ext, lease) = plan?;
                    let rules = rules.iter().map(|&at| g.rules.located(at)).collect();
                    let plan = Plan { keys, rules, cost, costs: None, call_id, ext, lease };
                    if reserve::has_reserved(&plan) {
                        return self.reserved(&g, plan, mode).await;
                    }
                    self.send(&g, plan, mode).await
                }
            }
        }
    }

    /// [`Limiter::run`] on the calling thread: in process on the embedded
    /// backend, else on a Redis connection of the thread's own.
    fn run_blocking(&self, attrs: &dyn Attributes, cost: u64, call_id: Option<&str>, mode: Mode) -> Result<Decision> {
        if let Some(answer) = self.in_process(attrs, cost, call_id, mode) {
            return answer;
        }
        // The policy in force now, held until the answer (as the async path does).
        let g = self.inner.current.load_full();
        let plan = g.rules.plan(attrs, cost, call_id, str::to_string)?;
        if reserve::has_reserved(&plan) {
            return self.reserved_blocking(&g, plan, mode);
        }
        self.send_blocking(&g, plan, mode)
    }

    /// A plan through the deny cache and the network.
    async fn send(&self, g: &Generation, plan: Plan<'_, String>, mode: Mode) -> Result<Decision> {
        let (remote, sent) = match self.before_send(g, &plan) {
            Ok(ready) => ready,
            Err(answer) => return answer,
        };
        let answer = remote.eval(&plan, mode, sent.now).await;
        self.after_send(g, &plan, mode, sent, answer)
    }

    /// [`Limiter::send`] on the calling thread, which writes and reads its
    /// own connection to Redis.
    fn send_blocking(&self, g: &Generation, plan: Plan<'_, String>, mode: Mode) -> Result<Decision> {
        let (remote, sent) = match self.before_send(g, &plan) {
            Ok(ready) => ready,
            Err(answer) => return answer,
        };
        let answer = remote.eval_blocking(&plan, mode, sent.now);
        self.after_send(g, &plan, mode, sent, answer)
    }

    /// What comes before a plan is sent: the answer when nothing needs
    /// sending (no rule applies, or a remembered denial), else the backend
    /// and the times of the call. (The large `Err` is that answer, returned
    /// at once; boxing it would allocate on every remembered denial.)
    #[allow(clippy::result_large_err)]
    fn before_send<'a>(&'a self, g: &'a Generation, plan: &Plan<'_, String>) -> std::result::Result<(&'a Connection, Sent<'a>), Result<Decision>> {
        let Some(remote) = &self.inner.remote else { return Err(Err(Error::closed())) };
        if plan.keys.is_empty() {
            self.inner.counters.count(stats::stripe(), &Decision::unlimited());
            return Err(Ok(Decision::unlimited()));
        }
        // Remembered denials (opt-in): read the clock before anything is
        // sent, so a wait counted from here never outlives Redis's.
        // A concurrency rule's slots free up at a release, before any wait ends: never cached.
        let cache = g.deny_cache.as_ref().filter(|_| plan.call_id.is_none() && plan.lease.is_none() && plan.costs.is_none());
        let sent_us = cache.map(|_| self.local_now());
        if let (Some(cache), Some(sent_us)) = (cache, sent_us) {
            let keys = plan.keys.iter().zip(&plan.rules).map(|(k, r)| (k.as_str(), r.shadow));
            if let Some(d) = cache.lookup(keys, plan.cost, sent_us) {
                self.count(g, &d, false);
                return Err(Ok(d));
            }
        }
        let now = match &self.inner.clock {
            Clock::Backend => None,
            _ => Some(sent_us.unwrap_or_else(|| self.local_now())),
        };
        let started = g.metrics.as_ref().map(|_| Instant::now());
        Ok((remote, Sent { cache, sent_us, now, started }))
    }

    /// A backend's answer to a plan, as a decision (or the failure policy's).
    fn after_send(&self, g: &Generation, plan: &Plan<'_, String>, mode: Mode, sent: Sent<'_>, answer: Result<Outcomes>) -> Result<Decision> {
        if let (Some(m), Some(started)) = (&g.metrics, sent.started) {
            m.observe(started.elapsed());
        }
        match &answer {
            Ok(_) => self.inner.outage.succeeded(),
            Err(e) => self.inner.outage.failed(e),
        }
        match answer {
            Ok(outcomes) => {
                let mut d = decide(&plan.rules, &outcomes);
                if mode == Mode::Check {
                    self.ticket(&mut d, plan.call_id, plan.cost, || plan.keys.to_vec(), || plan.rules.iter().map(|r| g.rules.locate(r)).collect());
                    self.lease_ticket(&mut d, g, &plan.rules, plan.lease.as_deref(), || plan.keys.to_vec());
                }
                if let (Some(cache), Some(sent_us), false) = (sent.cache, sent.sent_us, d.allowed) {
                    let blocked: smallvec::SmallVec<[bool; 4]> = outcomes.iter().map(|o| o.blocked).collect();
                    cache.remember(&plan.keys, &d, &blocked, plan.cost, sent_us);
                }
                self.count(g, &d, false);
                Ok(d)
            }
            Err(e) => {
                if e.kind() == ErrorKind::Timeout {
                    Counters::bump(&self.inner.counters.timeouts);
                }
                if e.kind().is_backend_failure() {
                    self.degrade(g, plan, e)
                } else {
                    Err(e)
                }
            }
        }
    }

    /// Answer from the failure policy: `error` wins over `deny`, `deny` over `allow`.
    fn degrade(&self, g: &Generation, plan: &Plan<'_, String>, err: Error) -> Result<Decision> {
        let mode = plan.rules.iter().fold(FailureMode::Allow, |m, r| m.strictest(r.failure));
        let c = &self.inner.counters;
        if let Some(m) = &g.metrics {
            let rules = plan.rules.iter().map(|r| r.index);
            m.failed(rules, err.kind() == ErrorKind::Timeout, mode == FailureMode::Error);
        }
        if mode == FailureMode::Error {
            Counters::bump(&c.backend_errors);
            return Err(err);
        }
        let results: crate::decision::RuleResults = plan
            .rules
            .iter()
            .map(|r| {
                let allowed = mode == FailureMode::Allow || r.failure == FailureMode::Allow;
                RuleResult {
                    rule: r.name,
                    index: r.index,
                    allowed,
                    shadow: r.shadow,
                    limit: r.limit,
                    remaining: if allowed { r.limit } else { 0 },
                    retry_after: if allowed { Duration::ZERO } else { DEGRADED_RETRY_AFTER },
                    reset_after: Duration::ZERO,
                    window: r.window,
                }
            })
            .collect();
        let mut d = Decision::from_results(results, true);
        if d.allowed {
            Counters::bump(&c.degraded_allowed);
        } else if d.rule.is_none() {
            // Only shadow rules denied: the request goes through.
            d.allowed = true;
            Counters::bump(&c.degraded_allowed);
        } else {
            Counters::bump(&c.degraded_denied);
        }
        self.count(g, &d, true);
        Ok(d)
    }
}

/// The answer of a check over several items: for a decision without
/// results (no rule applies, or a degraded one), no item reached any.
fn items_decision(decision: Decision, reached: Vec<SmallVec<[usize; 4]>>) -> ItemsDecision {
    let n = decision.results.len();
    let items = reached.into_iter().map(|at| at.into_iter().filter(|&i| i < n).collect()).collect();
    ItemsDecision { decision, items }
}

/// A call's answer, or its panic as an internal error.
fn caught(r: std::thread::Result<Result<Decision>>) -> Result<Decision> {
    r.unwrap_or_else(|p| Err(Error::from_panic(p.as_ref())))
}

/// A call on its way to the backend: the deny cache it may update, the
/// local time it was sent at (for the cache), the time sent to the backend
/// (`None` on the backend's clock), and when it started (for the metrics).
struct Sent<'a> {
    cache: Option<&'a DenyCache>,
    sent_us: Option<i64>,
    now: Option<i64>,
    started: Option<Instant>,
}

struct AttrRef<'a, A: ?Sized>(&'a A);

impl<A: Attributes + ?Sized> Attributes for AttrRef<'_, A> {
    fn get_attr(&self, name: &str) -> Option<&str> {
        self.0.get_attr(name)
    }
}

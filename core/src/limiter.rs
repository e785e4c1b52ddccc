//! The [`Limiter`]: a policy bound to a backend.

use std::cell::{Cell, RefCell};

use smallvec::SmallVec;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use crate::backend::{Mode, Plan, RedisBackend, Remote, RuleArgs, TlsOptions, Verdict};
use crate::cluster::ClusterBackend;
use crate::clock::{system_now_us, Clock};
use crate::decision::{Decision, RuleName, RuleResult};
use crate::deny_cache::DenyCache;
use crate::error::{Error, ErrorKind, Result};
use crate::key::{finish_key, Attributes, KeySecret, KeyTemplate, MAX_KEY_LEN};
use crate::memory::{Digest, MemoryBackend};
use crate::policy::{Algorithm, FailureMode, Policy};

/// How long a degraded denial asks the client to wait.
pub const DEGRADED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A rule prepared for the hot path: key head, template, arguments.
#[derive(Debug)]
pub(crate) struct CompiledRule {
    pub name: RuleName,
    head: String,
    template: KeyTemplate,
    matches: Vec<(String, Vec<String>)>,
    pub args: RuleArgs,
    pub script_args: [String; 3],
    limit: u64,
    window: Duration,
    shadow: bool,
    failure: FailureMode,
}

/// What answers the checks; `None` in [`Inner::backend`] once closed. The
/// embedded backend's store lives in [`Inner::memory`], outside the lock, so
/// an in-process check takes no lock but its shards'.
enum Backend {
    Memory,
    Remote(Remote),
}

/// Counters for operators: how many checks, how they ended, and how many
/// answers came from the failure policy instead of the backend.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Checks and peeks answered (degraded ones included).
    pub calls: u64,
    /// Calls answered "allowed".
    pub allowed: u64,
    /// Calls answered "denied".
    pub denied: u64,
    /// Degraded decisions that admitted (`on_backend_error = allow`).
    pub degraded_allowed: u64,
    /// Degraded decisions that denied (`on_backend_error = deny`).
    pub degraded_denied: u64,
    /// Backend failures returned as errors (`on_backend_error = error`).
    pub backend_errors: u64,
    /// Calls that ran out of time (counted also as degraded or error).
    pub timeouts: u64,
}

/// The per-call counters, striped over cache lines so that threads counting
/// at once do not contend for one line; [`Limiter::stats`] sums the stripes.
#[derive(Default)]
#[repr(align(64))]
struct Stripe {
    calls: AtomicU64,
    denied: AtomicU64,
}

const STRIPES: usize = 8;

/// This thread's stripe (threads take stripes in turn).
fn stripe_index() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    MINE.with(|i| *i)
}

thread_local! {
    /// A reused buffer for rendering keys on the in-process path.
    static KEY_BUF: RefCell<String> = RefCell::new(String::with_capacity(MAX_KEY_LEN));
}

#[derive(Default)]
struct Counters {
    stripes: [Stripe; STRIPES],
    degraded_allowed: AtomicU64,
    degraded_denied: AtomicU64,
    backend_errors: AtomicU64,
    timeouts: AtomicU64,
}

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

/// Builds a [`Limiter`]; see [`Limiter::builder`].
#[derive(Debug, Clone)]
pub struct LimiterBuilder {
    policy: Policy,
    url: Option<String>,
    timeout: Option<Duration>,
    on_backend_error: Option<FailureMode>,
    prefix: Option<String>,
    clock: Clock,
    key_secret: Option<Vec<u8>>,
    tls: Option<TlsOptions>,
    deny_cache: bool,
}

impl LimiterBuilder {
    /// For `rediss://` URLs: trust this CA certificate (PEM) instead of the
    /// system's roots (a private CA, a self-signed server).
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.get_or_insert_with(TlsOptions::default).root_cert_pem = Some(pem.into());
        self
    }

    /// For `rediss://` URLs: present this client certificate and key (PEM), for mutual TLS.
    pub fn tls_client_cert(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.tls.get_or_insert_with(TlsOptions::default).client_cert_pem = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The backend: `redis://host:port/db`, `rediss://...` (TLS),
    /// `redis+unix:///path`, or `memory://` (the embedded backend, the default).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Bound on the whole of one call (overrides the policy's `timeout`).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// What to do when the backend fails (overrides the policy's setting;
    /// rules' own overrides still win).
    pub fn on_backend_error(mut self, mode: FailureMode) -> Self {
        self.on_backend_error = Some(mode);
        self
    }

    /// Key prefix (overrides the policy's `prefix`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Remember denials in process (default off): after Redis denies a
    /// check, the same keys are denied here, without a round trip, for as
    /// long as Redis would deny them (each denying rule's `retry_after`,
    /// counted from when the check was sent), for checks of at least the
    /// denied cost. Spares Redis the traffic of clients that keep calling
    /// while refused. Exact, with two exceptions that only ever deny: a
    /// `reset` made by another process, and state lost on the server, are
    /// not seen until the wait ends. Such a denial reports only the
    /// remembered rules. Checks with a call id always go to Redis. No effect
    /// on the embedded backend, which answers in process anyway.
    pub fn deny_cache(mut self, on: bool) -> Self {
        self.deny_cache = on;
        self
    }

    /// Where "now" comes from (default: the backend's clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Hash attribute values with this secret (HMAC-SHA-256) before they go
    /// into keys, so raw values such as API keys never reach the backend.
    /// Every process sharing the backend must use the same secret.
    pub fn key_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.key_secret = Some(secret.into());
        self
    }

    /// Validate the settings and make the limiter. Connections are made on
    /// first use, so a limiter can be built while Redis is down.
    pub fn build(self) -> Result<Limiter> {
        let mut policy = self.policy;
        if let Some(p) = self.prefix {
            policy = policy.with_prefix(p)?;
        }
        if let Some(t) = self.timeout {
            policy = policy.with_timeout(t)?;
        }
        if let Some(m) = self.on_backend_error {
            policy = policy.with_on_backend_error(m);
        }
        if let Some(s) = &self.key_secret {
            if s.is_empty() {
                return Err(Error::invalid_argument("key_secret: must not be empty"));
            }
        }
        let backend = match self.url.as_deref().map(str::trim) {
            None | Some("") | Some("memory://") | Some("memory:") => Backend::Memory,
            Some(url) if url.starts_with("redis+cluster://") || url.starts_with("rediss+cluster://") => {
                Backend::Remote(Remote::Cluster(ClusterBackend::new(url, policy.timeout, self.tls.as_ref())?))
            }
            Some(url)
                if url.starts_with("redis://")
                    || url.starts_with("rediss://")
                    || url.starts_with("redis+unix://")
                    || url.starts_with("unix://") =>
            {
                Backend::Remote(Remote::Redis(RedisBackend::new(url, policy.timeout, self.tls.as_ref())?))
            }
            Some(url) => {
                return Err(Error::invalid_argument(format!(
                    "url: {url:?} has an unsupported scheme; use redis://, rediss://, redis+unix://, redis+cluster:// or memory://"
                )))
            }
        };
        let rules = policy
            .rules
            .iter()
            .zip(&policy.templates)
            .map(|(rule, template)| {
                let args = match rule.algorithm {
                    Algorithm::SlidingWindowLog { limit, window } => RuleArgs::Window {
                        limit,
                        window_us: window.as_micros() as i64,
                        shadow: rule.shadow,
                    },
                    Algorithm::TokenBucket { capacity, refill_rate } => RuleArgs::Bucket {
                        capacity,
                        rate: refill_rate,
                        shadow: rule.shadow,
                    },
                };
                CompiledRule {
                    name: RuleName::new(&rule.name),
                    head: format!("{}{}:", policy.prefix, rule.name),
                    template: template.clone(),
                    matches: rule.matches.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
                    script_args: args.script_args(),
                    args,
                    limit: rule.algorithm.limit(),
                    window: rule.algorithm.window(),
                    shadow: rule.shadow,
                    failure: rule.on_backend_error.unwrap_or(policy.on_backend_error),
                }
            })
            .collect();
        let memory = matches!(backend, Backend::Memory).then(MemoryBackend::new);
        let deny_cache = (self.deny_cache && memory.is_none()).then(DenyCache::new);
        Ok(Limiter {
            inner: Arc::new(Inner {
                memory,
                deny_cache,
                rules,
                timeout: policy.timeout,
                policy,
                backend: RwLock::new(Some(backend)),
                clock: self.clock,
                started: Instant::now(),
                epoch_us: system_now_us(),
                secret: self.key_secret.as_deref().map(KeySecret::new),
                closed: AtomicBool::new(false),
                counters: Counters::default(),
            }),
        })
    }
}

struct Inner {
    policy: Policy,
    rules: Vec<CompiledRule>,
    timeout: Duration,
    backend: RwLock<Option<Backend>>,
    /// The embedded backend's store (emptied by `close`).
    memory: Option<MemoryBackend>,
    /// Remembered denials, when asked for (remote backends only).
    deny_cache: Option<DenyCache>,
    clock: Clock,
    started: Instant,
    epoch_us: i64,
    secret: Option<KeySecret>,
    closed: AtomicBool,
    counters: Counters,
}

/// A rate limiter: a policy bound to a backend (Redis or in-memory).
///
/// Cheap to clone (clones share everything) and safe to use from many tasks
/// and threads at once. Every method that talks to the backend is async and
/// must run inside a Tokio runtime with the time driver enabled.
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Limiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limiter")
            .field("rules", &self.inner.rules.len())
            .field("backend", &self.backend_name())
            .field("closed", &self.is_closed())
            .finish()
    }
}

thread_local! {
    static RNG: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// Forks this process has gone through, as seen by the child (on Unix, a
/// `pthread_atfork` handler counts them); a changed count reseeds the
/// generator, at the cost of an atomic load per call instead of a system call.
fn fork_generation() -> u64 {
    static FORKS: AtomicU64 = AtomicU64::new(1);
    #[cfg(unix)]
    {
        extern "C" fn in_child() {
            FORKS.fetch_add(1, Ordering::Relaxed);
        }
        static REGISTERED: std::sync::Once = std::sync::Once::new();
        // SAFETY: registers a handler that only increments an atomic, which
        // is async-signal-safe and valid in a freshly forked child.
        REGISTERED.call_once(|| unsafe {
            libc::pthread_atfork(None, None, Some(in_child));
        });
    }
    FORKS.load(Ordering::Relaxed)
}

/// A random call id (16 hex digits). The generator is reseeded from the OS
/// after a fork, so parent and child never produce the same ids.
pub(crate) fn random_call_id() -> String {
    let generation = fork_generation();
    let x = RNG.with(|cell| {
        let (mut state, seeded) = cell.get();
        if seeded != generation || state == 0 {
            let mut seed = [0u8; 8];
            if getrandom::fill(&mut seed).is_err() {
                seed = (system_now_us() as u64 ^ ((std::process::id() as u64) << 32)).to_le_bytes();
            }
            state = u64::from_le_bytes(seed) | 1;
        }
        // wyrand
        state = state.wrapping_add(0xa076_1d64_78bd_642f);
        let t = (state as u128).wrapping_mul((state ^ 0xe703_7ed1_a0b4_28db) as u128);
        cell.set((state, generation));
        ((t >> 64) as u64) ^ (t as u64)
    });
    format!("{x:016x}")
}

fn validate_call_id(id: &str) -> Result<()> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(Error::invalid_argument(format!(
            "call_id: {id:?} must be 1-64 characters from A-Z a-z 0-9 _ -"
        )));
    }
    Ok(())
}

impl Limiter {
    /// Start building a limiter for `policy`.
    pub fn builder(policy: Policy) -> LimiterBuilder {
        LimiterBuilder {
            policy,
            url: None,
            timeout: None,
            on_backend_error: None,
            prefix: None,
            clock: Clock::Backend,
            key_secret: None,
            tls: None,
            deny_cache: false,
        }
    }

    /// A limiter for `policy` on the embedded in-memory backend.
    pub fn in_memory(policy: Policy) -> Limiter {
        Limiter::builder(policy)
            .build()
            .expect("a validated policy always builds an in-memory limiter")
    }

    /// The policy, with the builder's overrides applied.
    pub fn policy(&self) -> &Policy {
        &self.inner.policy
    }

    /// `"memory"`, `"redis"` or `"cluster"` (`"closed"` after [`Limiter::close`]).
    pub fn backend_name(&self) -> &'static str {
        match &*self.inner.backend.read().unwrap_or_else(|p| p.into_inner()) {
            Some(Backend::Memory) => "memory",
            Some(Backend::Remote(r)) => r.name(),
            None => "closed",
        }
    }

    /// Check a request of cost 1 or more: consume from every applicable rule
    /// if all admit it, nothing otherwise.
    pub async fn check<A: Attributes + ?Sized>(&self, attrs: &A, cost: u64) -> Result<Decision> {
        if let Some(answer) = self.run_in_process(&AttrRef(attrs), cost, None, Mode::Check) {
            return answer;
        }
        let plan = self.plan(&AttrRef(attrs), cost, None);
        self.run(plan, Mode::Check).await
    }

    /// [`Limiter::check`] with options (an explicit call id).
    pub async fn check_with<A: Attributes + ?Sized>(
        &self,
        attrs: &A,
        options: &CheckOptions,
    ) -> Result<Decision> {
        let (cost, call_id) = (options.cost, options.call_id.as_deref());
        if let Some(answer) = self.run_in_process(&AttrRef(attrs), cost, call_id, Mode::Check) {
            return answer;
        }
        let plan = self.plan(&AttrRef(attrs), cost, call_id);
        self.run(plan, Mode::Check).await
    }

    /// The decision a check of this cost would get now, without consuming anything.
    pub async fn peek<A: Attributes + ?Sized>(&self, attrs: &A, cost: u64) -> Result<Decision> {
        if let Some(answer) = self.run_in_process(&AttrRef(attrs), cost, None, Mode::Peek) {
            return answer;
        }
        let plan = self.plan(&AttrRef(attrs), cost, None);
        self.run(plan, Mode::Peek).await
    }

    /// Forget the state of every rule that applies to this request (to
    /// unblock a customer). Returns how many keys existed.
    pub async fn reset<A: Attributes + ?Sized>(&self, attrs: &A) -> Result<u64> {
        self.ensure_open()?;
        let keys = self.keys_for(&AttrRef(attrs));
        if keys.is_empty() {
            return Ok(0);
        }
        let now = self.local_now();
        if let Some(c) = &self.inner.deny_cache {
            c.forget(&keys);
        }
        let redis = {
            let guard = self.inner.backend.read().unwrap_or_else(|p| p.into_inner());
            match &*guard {
                Some(Backend::Memory) => return Ok(self.memory().reset(&keys, now)),
                Some(Backend::Remote(r)) => r.clone(),
                None => return Err(closed()),
            }
        };
        match tokio::time::timeout(self.inner.timeout, redis.reset(&keys)).await {
            Ok(r) => r,
            Err(_) => Err(timeout_error(self.inner.timeout)),
        }
    }

    /// The keys this request touches, one per applicable rule, in policy order.
    pub fn keys<A: Attributes + ?Sized>(&self, attrs: &A) -> Vec<String> {
        self.keys_for(&AttrRef(attrs))
    }

    /// Check that the backend answers (a `PING` for Redis), within the timeout.
    pub async fn ping(&self) -> Result<()> {
        self.ensure_open()?;
        let redis = {
            let guard = self.inner.backend.read().unwrap_or_else(|p| p.into_inner());
            match &*guard {
                Some(Backend::Memory) => return Ok(()),
                Some(Backend::Remote(r)) => r.clone(),
                None => return Err(closed()),
            }
        };
        match tokio::time::timeout(self.inner.timeout, redis.ping()).await {
            Ok(r) => r,
            Err(_) => Err(timeout_error(self.inner.timeout)),
        }
    }

    /// Counters since the limiter was made.
    pub fn stats(&self) -> Stats {
        let c = &self.inner.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let sum = |f: fn(&Stripe) -> &AtomicU64| c.stripes.iter().map(|s| get(f(s))).sum::<u64>();
        // Denials are read first: a call counted in between shows as allowed.
        let denied = sum(|s| &s.denied);
        let calls = sum(|s| &s.calls);
        Stats {
            calls,
            allowed: calls.saturating_sub(denied),
            denied,
            degraded_allowed: get(&c.degraded_allowed),
            degraded_denied: get(&c.degraded_denied),
            backend_errors: get(&c.backend_errors),
            timeouts: get(&c.timeouts),
        }
    }

    /// Entries held by the embedded backend (expired ones not yet swept
    /// included); `None` for other backends.
    pub fn memory_entries(&self) -> Option<usize> {
        self.inner.memory.as_ref().map(MemoryBackend::len)
    }

    /// The embedded backend's store (only called for [`Backend::Memory`]).
    fn memory(&self) -> &MemoryBackend {
        self.inner.memory.as_ref().expect("the embedded backend has a store")
    }

    /// Close the limiter: drop its connections and state. Every later call
    /// fails with [`ErrorKind::Closed`]. Closing twice is harmless.
    pub fn close(&self) {
        self.inner.closed.store(true, Ordering::SeqCst);
        let old = self
            .inner
            .backend
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(old);
        if let Some(m) = &self.inner.memory {
            m.clear();
        }
        if let Some(c) = &self.inner.deny_cache {
            c.clear();
        }
    }

    /// True after [`Limiter::close`].
    pub fn is_closed(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    fn ensure_open(&self) -> Result<()> {
        if self.is_closed() {
            Err(closed())
        } else {
            Ok(())
        }
    }

    /// "Now" for the embedded backend, and for the System/Manual clocks.
    fn local_now(&self) -> i64 {
        match &self.inner.clock {
            Clock::Manual(c) => c.now_us(),
            Clock::System => system_now_us(),
            Clock::Backend => self.inner.epoch_us + self.inner.started.elapsed().as_micros() as i64,
        }
    }

    fn keys_for(&self, attrs: &dyn Attributes) -> Vec<String> {
        self.inner
            .rules
            .iter()
            .filter_map(|r| self.key_of(r, attrs))
            .collect()
    }

    /// The rule's key for these attributes; `None` when the rule does not apply.
    fn key_of(&self, rule: &CompiledRule, attrs: &dyn Attributes) -> Option<String> {
        // Rendered straight after the head: one allocation for a usual key.
        let mut key = String::with_capacity(rule.head.len() + 48);
        self.render_key(rule, attrs, &mut key).then_some(key)
    }

    /// Write the rule's key for these attributes into `key` (cleared first);
    /// false when the rule does not apply.
    fn render_key(&self, rule: &CompiledRule, attrs: &dyn Attributes, key: &mut String) -> bool {
        for (attr, values) in &rule.matches {
            match attrs.get_attr(attr) {
                Some(v) if values.iter().any(|x| x == v) => {}
                _ => return false,
            }
        }
        key.clear();
        key.push_str(&rule.head);
        if !rule.template.render(attrs, self.inner.secret.as_ref(), key) {
            return false;
        }
        if key.len() > MAX_KEY_LEN {
            *key = finish_key(&rule.head, &key[rule.head.len()..]);
        }
        true
    }

    /// The checks every plan gets: a cost of at least 1, a well-formed call
    /// id, and a cost no applicable rule makes impossible.
    fn validate(cost: u64, call_id: Option<&str>) -> Result<()> {
        if cost == 0 {
            return Err(Error::invalid_argument("cost: must be at least 1"));
        }
        if let Some(id) = call_id {
            validate_call_id(id)?;
        }
        Ok(())
    }

    fn cost_fits(rule: &CompiledRule, cost: u64) -> Result<()> {
        if cost > rule.limit {
            return Err(Error::invalid_argument(format!(
                "cost: {cost} is more than rule {:?} allows ({}); such a request could never pass",
                &*rule.name, rule.limit
            )));
        }
        Ok(())
    }

    fn plan<'a>(&'a self, attrs: &dyn Attributes, cost: u64, call_id: Option<&str>) -> Result<Plan<'a>> {
        Self::validate(cost, call_id)?;
        let mut keys = SmallVec::new();
        let mut compiled = SmallVec::new();
        for rule in &self.inner.rules {
            if let Some(key) = self.key_of(rule, attrs) {
                Self::cost_fits(rule, cost)?;
                keys.push(key);
                compiled.push(rule);
            }
        }
        Ok(Plan {
            keys,
            compiled,
            cost,
            call_id: call_id.map(str::to_string),
        })
    }

    /// True when the backend answers in process (the embedded backend), so
    /// [`Limiter::check_in_process`] answers without a runtime.
    pub fn is_in_process(&self) -> bool {
        self.inner.memory.is_some() && !self.is_closed()
    }

    /// [`Limiter::check_with`] answered synchronously, without a runtime,
    /// when the backend is in process; `None` for a network backend (use the
    /// async methods). Front ends use this to answer embedded checks with no
    /// thread hop.
    pub fn check_in_process<A: Attributes + ?Sized>(
        &self,
        attrs: &A,
        options: &CheckOptions,
    ) -> Option<Result<Decision>> {
        self.run_in_process(&AttrRef(attrs), options.cost, options.call_id.as_deref(), Mode::Check)
    }

    /// [`Limiter::peek`] answered synchronously when the backend is in process; `None` otherwise.
    pub fn peek_in_process<A: Attributes + ?Sized>(&self, attrs: &A, cost: u64) -> Option<Result<Decision>> {
        self.run_in_process(&AttrRef(attrs), cost, None, Mode::Peek)
    }

    /// The embedded backend's own path: keys are rendered into a reused
    /// buffer and only their digests kept, so a check allocates nothing but
    /// its decision.
    fn run_in_process(
        &self,
        attrs: &dyn Attributes,
        cost: u64,
        call_id: Option<&str>,
        mode: Mode,
    ) -> Option<Result<Decision>> {
        let Some(memory) = &self.inner.memory else {
            return if self.is_closed() { Some(Err(closed())) } else { None };
        };
        if self.is_closed() {
            return Some(Err(closed()));
        }
        if let Err(e) = Self::validate(cost, call_id) {
            return Some(Err(e));
        }
        let mut digests: SmallVec<[Digest; 4]> = SmallVec::new();
        let mut rules: SmallVec<[&CompiledRule; 4]> = SmallVec::new();
        let applied = KEY_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            for rule in &self.inner.rules {
                if self.render_key(rule, attrs, &mut buf) {
                    Self::cost_fits(rule, cost)?;
                    digests.push(memory.digest(&buf));
                    rules.push(rule);
                }
            }
            Ok(())
        });
        if let Err(e) = applied {
            return Some(Err(e));
        }
        Some(Ok(self.eval_memory(memory, &digests, &rules, cost, call_id, mode)))
    }

    /// Decide on the embedded backend and count the answer.
    fn eval_memory(
        &self,
        memory: &MemoryBackend,
        digests: &[Digest],
        rules: &[&CompiledRule],
        cost: u64,
        call_id: Option<&str>,
        mode: Mode,
    ) -> Decision {
        if digests.is_empty() {
            self.count(&Decision::unlimited());
            return Decision::unlimited();
        }
        let verdict = memory.eval(digests, rules, cost, call_id, mode, self.local_now());
        let d = self.decide(rules, verdict, false);
        self.count(&d);
        d
    }

    /// A check or peek through the remote backend (the embedded one answers
    /// in process before a plan is made).
    async fn run(&self, plan: Result<Plan<'_>>, mode: Mode) -> Result<Decision> {
        self.ensure_open()?;
        let plan = plan?;
        if plan.keys.is_empty() {
            self.count(&Decision::unlimited());
            return Ok(Decision::unlimited());
        }
        let redis = match &*self.inner.backend.read().unwrap_or_else(|p| p.into_inner()) {
            Some(Backend::Remote(r)) => r.clone(),
            _ => return Err(closed()),
        };
        // Remembered denials (opt-in): read the clock before anything is
        // sent, so a wait counted from here never outlives Redis's.
        let cache = self.inner.deny_cache.as_ref().filter(|_| plan.call_id.is_none());
        let sent_us = cache.map(|_| self.local_now());
        if let (Some(cache), Some(sent_us)) = (cache, sent_us) {
            let keys = plan.keys.iter().zip(&plan.compiled).map(|(k, r)| (k.as_str(), r.shadow));
            if let Some(d) = cache.lookup(keys, plan.cost, sent_us) {
                self.count(&d);
                return Ok(d);
            }
        }
        let now = match &self.inner.clock {
            Clock::Backend => None,
            _ => Some(sent_us.unwrap_or_else(|| self.local_now())),
        };
        let result = match tokio::time::timeout(self.inner.timeout, redis.eval(&plan, mode, now)).await {
            Ok(r) => r,
            Err(_) => Err(timeout_error(self.inner.timeout)),
        };
        if matches!(&result, Err(e) if e.kind() == ErrorKind::Timeout) {
            self.inner.counters.timeouts.fetch_add(1, Ordering::Relaxed);
        }
        match result {
            Ok(verdict) => {
                let d = self.decide(&plan.compiled, verdict, false);
                if let (Some(cache), Some(sent_us), false) = (cache, sent_us, d.allowed) {
                    cache.remember(&plan.keys, &d, plan.cost, sent_us);
                }
                self.count(&d);
                Ok(d)
            }
            Err(e) if e.kind().is_backend_failure() => self.degrade(&plan, e),
            Err(e) => Err(e),
        }
    }

    /// Count an answer (`allowed` is derived: calls less denials).
    fn count(&self, d: &Decision) {
        let c = &self.inner.counters.stripes[stripe_index()];
        c.calls.fetch_add(1, Ordering::Relaxed);
        if !d.allowed {
            c.denied.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn decide(&self, rules: &[&CompiledRule], verdict: Verdict, degraded: bool) -> Decision {
        let results = rules
            .iter()
            .zip(&verdict.outcomes)
            .map(|(rule, o)| RuleResult {
                rule: rule.name,
                allowed: o.allowed,
                shadow: rule.shadow,
                limit: rule.limit,
                remaining: o.remaining,
                retry_after: Duration::from_micros(o.retry_after_us.max(0) as u64),
                reset_after: Duration::from_micros(o.reset_after_us.max(0) as u64),
                window: rule.window,
            })
            .collect();
        Decision::from_results(results, degraded)
    }

    /// Answer from the failure policy: `error` wins over `deny`, `deny` over `allow`.
    fn degrade(&self, plan: &Plan<'_>, err: Error) -> Result<Decision> {
        let mode = plan
            .compiled
            .iter()
            .fold(FailureMode::Allow, |m, r| m.strictest(r.failure));
        let c = &self.inner.counters;
        match mode {
            FailureMode::Error => {
                c.backend_errors.fetch_add(1, Ordering::Relaxed);
                Err(err)
            }
            FailureMode::Allow | FailureMode::Deny => {
                let results = plan
                    .compiled
                    .iter()
                    .map(|r| {
                        let allowed = mode == FailureMode::Allow || r.failure == FailureMode::Allow;
                        RuleResult {
                            rule: r.name,
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
                    c.degraded_allowed.fetch_add(1, Ordering::Relaxed);
                } else if d.rule.is_none() {
                    // Only shadow rules denied: the request goes through.
                    d.allowed = true;
                    c.degraded_allowed.fetch_add(1, Ordering::Relaxed);
                } else {
                    c.degraded_denied.fetch_add(1, Ordering::Relaxed);
                }
                self.count(&d);
                Ok(d)
            }
        }
    }
}

struct AttrRef<'a, A: ?Sized>(&'a A);

impl<A: Attributes + ?Sized> Attributes for AttrRef<'_, A> {
    fn get_attr(&self, name: &str) -> Option<&str> {
        self.0.get_attr(name)
    }
}

fn closed() -> Error {
    Error::new(ErrorKind::Closed, "the limiter is closed")
}

fn timeout_error(t: Duration) -> Error {
    Error::new(
        ErrorKind::Timeout,
        format!("the backend did not answer within the timeout ({} ms)", t.as_millis()),
    )
}

#[cfg(all(test, unix))]
mod tests {
    use super::random_call_id;

    #[test]
    fn a_forked_child_draws_other_call_ids() {
        let _ = random_call_id();
        let mut fds = [0i32; 2];
        // SAFETY: plain pipe/fork/write/_exit; the child only draws one id.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            assert!(pid >= 0, "fork failed");
            if pid == 0 {
                let id = random_call_id();
                libc::write(fds[1], id.as_ptr().cast(), id.len());
                libc::_exit(0);
            }
            libc::close(fds[1]);
            let mut buf = [0u8; 16];
            let n = libc::read(fds[0], buf.as_mut_ptr().cast(), buf.len());
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            assert_eq!(n, 16);
            let parent = random_call_id();
            assert_ne!(std::str::from_utf8(&buf).unwrap(), parent, "child and parent drew the same id");
        }
    }
}

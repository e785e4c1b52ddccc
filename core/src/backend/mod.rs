//! The backends that decide a [`Plan`](crate::plan::Plan): the embedded
//! store ([`memory`]) in process, and over the network one Redis node
//! ([`redis`]), the primary named by Redis Sentinel ([`sentinel`]) or a
//! Redis Cluster ([`cluster`]), all running the one check script
//! ([`script`]).

pub(crate) mod cluster;
pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod script;
pub(crate) mod sentinel;

use std::sync::RwLock;
use std::time::Duration;

use smallvec::SmallVec;

use self::cluster::ClusterBackend;
use self::redis::{RedisBackend, TlsOptions};
use self::sentinel::SentinelBackend;
use crate::algo::Outcome;
use crate::error::{Error, Result};
use crate::plan::{CompiledRule, Mode, Plan};
use crate::runtime::{block_on, current_runtime, fork_generation, random_call_id, refuse_inside_async};

/// A backend's answer: one outcome per rule of the plan, in plan order. (A
/// re-sent call that was already applied is answered as admitted, with the
/// current state.)
pub(crate) type Outcomes = SmallVec<[Outcome; 4]>;

/// What a settle did on one rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SettleOutcome {
    /// Corrected to the real cost.
    Settled,
    /// Nothing to correct: the call never consumed there, was settled
    /// already, or its units no longer count.
    Unchanged,
    /// The call is not among the 64 recent ids the key keeps, which are all
    /// newer calls': it may have been pushed out, and its units can no
    /// longer be told apart. Nothing changed.
    PushedOut,
}

/// A settle's answer: per rule of the plan, what it did there.
pub(crate) type Settled = SmallVec<[SettleOutcome; 4]>;

/// A release's or extend's answer: per key, whether the lease held slots there.
pub(crate) type Held = SmallVec<[bool; 4]>;

/// How much earlier than the caller's own deadline a check's deadline on
/// the server is set (at most a quarter of the timeout): the time its reply
/// needs to come back. A script that starts before it is answered in time.
pub(crate) const DEADLINE_MARGIN: Duration = Duration::from_millis(2);

/// How long an estimate of the server's clock is kept before a lower one
/// replaces it (a server clock stepped back is learned within this).
const OFFSET_KEPT_US: i64 = 10_000_000;

/// How long after a reply that carried the server's time a check may ask
/// for a terse reply, which carries none (mode `t`, `lua/single_rule.lua`):
/// a busy client still reads the server's time about once a second, so
/// the offset is learned as before.
const TERSE_FOR_US: i64 = 1_000_000;

/// What a backend knows of the server's clock: the offset between Redis
/// `TIME` and this host's clock, learned from the server time every check
/// reply carries (the script's `now`, read at its start). Each reply gives a
/// lower bound of the offset (the script started before the reply was
/// read); the highest recent one is kept, so a deadline made from it is
/// never later on the server than the caller's own. Until a reply is read,
/// the clocks are taken as equal (the first reply corrects it: at worst one
/// call of a server whose clock is ahead by more than the timeout is
/// refused as late).
#[derive(Debug, Default)]
pub(crate) struct ServerTime {
    offset_us: std::sync::atomic::AtomicI64,
    learned_at_us: std::sync::atomic::AtomicI64,
    /// When the last reply carrying the server's time was read (this host's clock).
    observed_at_us: std::sync::atomic::AtomicI64,
}

impl ServerTime {
    /// The deadline, on the server's clock, of a call that starts now with
    /// `timeout`.
    pub fn deadline(&self, timeout: Duration) -> i64 {
        let margin = DEADLINE_MARGIN.min(timeout / 4);
        let offset = self.offset_us.load(std::sync::atomic::Ordering::Relaxed);
        crate::clock::system_now_us() + (timeout - margin).as_micros() as i64 + offset
    }

    /// A reply read now says the server's clock read `server_us` when the
    /// script started.
    pub fn observe(&self, server_us: i64) {
        use std::sync::atomic::Ordering::Relaxed;
        let local = crate::clock::system_now_us();
        self.observed_at_us.store(local, Relaxed);
        let estimate = server_us - local;
        let kept = self.offset_us.load(Relaxed);
        if estimate > kept || local - self.learned_at_us.load(Relaxed) > OFFSET_KEPT_US {
            self.offset_us.store(estimate, Relaxed);
            self.learned_at_us.store(local, Relaxed);
        }
    }

    /// Whether a reply that carried the server's time was read within the
    /// last second: a check on the server's clock may then ask for a terse
    /// reply, which carries none.
    pub fn fresh(&self) -> bool {
        let at = self.observed_at_us.load(std::sync::atomic::Ordering::Relaxed);
        at != 0 && crate::clock::system_now_us() - at < TERSE_FOR_US
    }

    /// Learn from a check's reply when it carries the server's time: every
    /// reply of a call on the server's clock (`now` not sent), and an
    /// expired one.
    pub fn observe_reply(&self, reply: &[i64], now_sent: Option<i64>) {
        // (A terse admission, one integer, carries no time.)
        if let [t, _, ..] = reply {
            let t = *t;
            if now_sent.is_none() || script::is_expired(reply) {
                self.observe(t);
            }
        }
    }
}

/// A network backend: one Redis node, the primary named by Sentinel, or a
/// Redis Cluster. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Remote {
    Redis(RedisBackend),
    Sentinel(SentinelBackend),
    Cluster(ClusterBackend),
}

impl Remote {
    /// The backend named by `url`; `None` for the embedded one.
    fn open(url: &str, timeout: Duration, tls: Option<&TlsOptions>, wait_replicas: u32) -> Result<Option<Remote>> {
        Ok(Some(match url.trim() {
            "" | "memory://" | "memory:" => return Ok(None),
            url if url.starts_with("redis+cluster://") || url.starts_with("rediss+cluster://") => {
                if wait_replicas > 0 {
                    return Err(Error::invalid_argument(
                        "wait_replicas: is for redis:// and redis+sentinel:// backends, not a Redis Cluster",
                    ));
                }
                Remote::Cluster(ClusterBackend::new(url, timeout, tls)?)
            }
            url if url.starts_with("redis+sentinel://") || url.starts_with("rediss+sentinel://") => {
                Remote::Sentinel(SentinelBackend::new(url, timeout, tls, wait_replicas)?)
            }
            url if ["redis://", "rediss://", "redis+unix://", "unix://"].iter().any(|s| url.starts_with(s)) => {
                Remote::Redis(RedisBackend::new(url, timeout, tls, wait_replicas)?)
            }
            url => {
                return Err(Error::invalid_argument(format!(
                    "url: {url:?} has an unsupported scheme; use redis://, rediss://, redis+unix://, redis+sentinel://, redis+cluster:// or memory://"
                )))
            }
        }))
    }

    /// Decide `plan` (a random call id is made when the caller gave none).
    async fn eval(&self, plan: &Plan<'_, String>, mode: Mode, now: Option<i64>) -> Result<Outcomes> {
        match self {
            Remote::Redis(r) => r.eval(plan, node_call_id(plan), mode, now).await,
            Remote::Sentinel(s) => {
                let call_id = node_call_id(plan);
                Box::pin(s.on_primary(|r| async move { r.eval(plan, call_id, mode, now).await })).await
            }
            Remote::Cluster(c) => {
                let mut random = None;
                c.eval(plan, call_id(plan, &mut random), mode, now).await
            }
        }
    }

    /// [`Remote::eval`] on the calling thread: on one node its own
    /// connection; a cluster's calls still run on the runtime.
    fn eval_blocking(&self, plan: &Plan<'_, String>, mode: Mode, now: Option<i64>, timeout: Duration) -> Result<Outcomes> {
        match self {
            Remote::Redis(r) => r.eval_blocking(plan, node_call_id(plan), mode, now),
            Remote::Sentinel(_) | Remote::Cluster(_) => block_on(bounded(timeout, self.eval(plan, mode, now)))?,
        }
    }

    async fn query<T: ::redis::FromRedisValue>(&self, cmd: &::redis::Cmd) -> Result<T> {
        match self {
            Remote::Redis(r) => r.query(cmd).await,
            Remote::Sentinel(s) => Box::pin(s.on_primary(|r| async move { r.query(cmd).await })).await,
            Remote::Cluster(c) => c.query(cmd).await,
        }
    }

    async fn settle(&self, plan: &Plan<'_, String>, call_id: &str, actual: u64, now: Option<i64>) -> Result<Settled> {
        match self {
            Remote::Redis(r) => r.settle(plan, call_id, actual, now).await,
            Remote::Sentinel(s) => Box::pin(s.on_primary(|r| async move { r.settle(plan, call_id, actual, now).await })).await,
            Remote::Cluster(c) => c.settle(plan, call_id, actual, now).await,
        }
    }

    async fn lease(&self, keys: &[String], rules: &[&CompiledRule], lease_id: &str, extend_us: Option<i64>, now: Option<i64>) -> Result<Held> {
        match self {
            Remote::Redis(r) => r.lease(keys, rules, lease_id, extend_us, now).await,
            Remote::Sentinel(s) => Box::pin(s.on_primary(|r| async move { r.lease(keys, rules, lease_id, extend_us, now).await })).await,
            Remote::Cluster(c) => c.lease(keys, rules, lease_id, extend_us, now).await,
        }
    }

    async fn reset(&self, keys: &[String]) -> Result<u64> {
        match self {
            Remote::Redis(r) => r.reset(keys).await,
            Remote::Sentinel(s) => Box::pin(s.on_primary(|r| async move { r.reset(keys).await })).await,
            Remote::Cluster(c) => c.reset(keys).await,
        }
    }

    async fn ping(&self) -> Result<()> {
        match self {
            Remote::Redis(r) => r.ping().await,
            Remote::Sentinel(s) => Box::pin(s.on_primary(|r| async move { r.ping().await })).await,
            Remote::Cluster(c) => c.ping().await,
        }
    }

    /// `PING`, then the check script once on no key (a peek), loading it
    /// if needed: what a check needs of the server, short of its keys.
    async fn probe(&self) -> Result<()> {
        let step = |what: &'static str| move |e: Error| Error::new(e.kind(), format!("{what}: {e}")).set_temporary(e.is_temporary());
        self.ping().await.map_err(step("PING"))?;
        let sha = ::redis::Script::new(script::CHECK_SCRIPT).get_hash().to_string();
        let run = |sha: Option<&str>| {
            let mut cmd = match sha {
                Some(sha) => {
                    let mut c = ::redis::cmd("EVALSHA");
                    c.arg(sha);
                    c
                }
                None => {
                    let mut c = ::redis::cmd("EVAL");
                    c.arg(script::CHECK_SCRIPT);
                    c
                }
            };
            cmd.arg(0).arg("p").arg("").arg("strict-probe").arg(1);
            cmd
        };
        let first: Result<Vec<i64>> = self.query(&run(Some(&sha))).await;
        match first {
            Ok(_) => Ok(()),
            Err(e) if std::error::Error::source(&e).and_then(|s| s.downcast_ref::<::redis::RedisError>()).is_some_and(script::is_noscript) => {
                self.query::<Vec<i64>>(&run(None)).await.map(|_| ()).map_err(step("running the check script (EVAL)"))
            }
            Err(e) => Err(step("running the check script (EVALSHA)")(e)),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            // The primary a Sentinel names is one Redis node.
            Remote::Redis(_) | Remote::Sentinel(_) => "redis",
            Remote::Cluster(_) => "cluster",
        }
    }
}

/// A limiter's network backend, following the process through `fork()`:
/// the connections belong to the fork generation they were made in, and a
/// child connects anew on first use (leaking the parent's, whose runtime
/// threads it does not have).
pub(crate) struct Connection {
    url: String,
    timeout: Duration,
    tls: Option<TlsOptions>,
    wait_replicas: u32,
    name: &'static str,
    /// The generation and backend; `None` once closed.
    live: RwLock<Option<(u64, Remote)>>,
}

impl Connection {
    /// The network backend named by `url` (`None` for the embedded one).
    /// Connections are made on first use, so this succeeds while Redis is down.
    /// `wait_replicas`: replicas that must acknowledge each check (`WAIT`).
    pub fn open(url: Option<&str>, timeout: Duration, tls: Option<TlsOptions>, wait_replicas: u32) -> Result<Option<Connection>> {
        let url = url.unwrap_or("");
        let Some(remote) = Remote::open(url, timeout, tls.as_ref(), wait_replicas)? else { return Ok(None) };
        Ok(Some(Connection {
            url: url.to_string(),
            timeout,
            tls,
            wait_replicas,
            name: remote.name(),
            live: RwLock::new(Some((fork_generation(), remote))),
        }))
    }

    /// `"redis"` or `"cluster"`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// This process's backend: the one made here, or a new one in a forked child.
    fn get(&self) -> Result<Remote> {
        let generation = fork_generation();
        match &*self.live.read().unwrap_or_else(|p| p.into_inner()) {
            Some((g, r)) if *g == generation => return Ok(r.clone()),
            None => return Err(Error::closed()),
            Some(_) => {}
        }
        let mut live = self.live.write().unwrap_or_else(|p| p.into_inner());
        match &mut *live {
            None => Err(Error::closed()),
            Some((g, r)) if *g == generation => Ok(r.clone()),
            Some(slot) => {
                let fresh = Remote::open(&self.url, self.timeout, self.tls.as_ref(), self.wait_replicas)?
                    .expect("a network URL stays one");
                let inherited = std::mem::replace(slot, (generation, fresh.clone()));
                std::mem::forget(inherited);
                Ok(fresh)
            }
        }
    }

    /// The one Redis node of this backend (`None` for a cluster, or once closed).
    pub(crate) fn redis_node(&self) -> Option<RedisBackend> {
        match self.get().ok()? {
            Remote::Redis(r) => Some(r),
            // Its address changes with a failover: the core's own calls follow it.
            Remote::Sentinel(_) | Remote::Cluster(_) => None,
        }
    }

    /// Decide `plan` over the network, within the timeout.
    pub async fn eval(&self, plan: &Plan<'_, String>, mode: Mode, now: Option<i64>) -> Result<Outcomes> {
        let remote = self.get()?;
        self.bounded(remote.eval(plan, mode, now)).await
    }

    /// Settle the check `call_id` of `plan` to `actual`, within the timeout.
    pub async fn settle(&self, plan: &Plan<'_, String>, call_id: &str, actual: u64, now: Option<i64>) -> Result<Settled> {
        let remote = self.get()?;
        self.bounded(remote.settle(plan, call_id, actual, now)).await
    }

    /// Release (`extend_us` `None`) or extend lease `lease_id` on these keys
    /// of concurrency rules, within the timeout: per key, whether it held slots.
    pub async fn lease(&self, keys: &[String], rules: &[&CompiledRule], lease_id: &str, extend_us: Option<i64>, now: Option<i64>) -> Result<Held> {
        let remote = self.get()?;
        self.bounded(remote.lease(keys, rules, lease_id, extend_us, now)).await
    }

    /// Delete `keys`, within the timeout; returns how many existed.
    pub async fn reset(&self, keys: &[String]) -> Result<u64> {
        let remote = self.get()?;
        self.bounded(remote.reset(keys)).await
    }

    /// Run one command (routed by its key on a cluster), within the timeout.
    pub async fn query<T: ::redis::FromRedisValue>(&self, cmd: &::redis::Cmd) -> Result<T> {
        let remote = self.get()?;
        self.bounded(remote.query(cmd)).await
    }

    /// A round trip, within the timeout.
    pub async fn ping(&self) -> Result<()> {
        let remote = self.get()?;
        self.bounded(remote.ping()).await
    }

    /// The strict start-up check: `PING` and the check script run once on
    /// no key, within the timeout.
    pub async fn probe(&self) -> Result<()> {
        let remote = self.get()?;
        self.bounded(remote.probe()).await
    }

    /// [`Connection::eval`] for a caller without an event loop, on its own
    /// thread (see [`RedisBackend::eval_blocking`]).
    pub fn eval_blocking(&self, plan: &Plan<'_, String>, mode: Mode, now: Option<i64>) -> Result<Outcomes> {
        refuse_inside_async()?;
        self.get()?.eval_blocking(plan, mode, now, self.timeout)
    }

    async fn bounded<T>(&self, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
        bounded(self.timeout, call).await
    }

    /// Drop the connections; every later call fails with `closed`.
    pub fn close(&self) {
        let old = self.live.write().unwrap_or_else(|p| p.into_inner()).take();
        release(old);
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        release(self.live.get_mut().unwrap_or_else(|p| p.into_inner()).take());
    }
}

/// `call` within `timeout`, else the timeout error. The client's own
/// response timeout (a little longer) may still fire first on a loaded
/// machine, when the runtime wakes late: it reads as the same error.
async fn bounded<T>(timeout: Duration, call: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Err(e)) if e.kind() == crate::ErrorKind::Timeout => Err(Error::timeout(timeout)),
        Ok(r) => r,
        Err(_) => Err(Error::timeout(timeout)),
    }
}

/// The plan's call id, or a random one made into `random` when the caller
/// gave none.
fn call_id<'a>(plan: &'a Plan<'_, String>, random: &'a mut Option<String>) -> &'a str {
    // A check of a concurrency rule takes its slots under the plan's lease id.
    match (plan.call_id, &plan.lease) {
        (Some(id), _) => id,
        (None, Some(lease)) => lease,
        (None, None) => random.insert(random_call_id()).as_str(),
    }
}

/// The call id a check sends to one Redis node: the caller's, or the plan's
/// lease id, else none (""): on one node a check without either is sent in
/// mode `c`, whose script records no call id, so a random one would only
/// cost its making and its bytes. (Redis Cluster makes one: it gives a
/// check back by its id when another slot denies.)
pub(crate) fn node_call_id<'a>(plan: &'a Plan<'_, String>) -> &'a str {
    match (plan.call_id, &plan.lease) {
        (Some(id), _) => id,
        (None, Some(lease)) => lease,
        (None, None) => "",
    }
}

/// Drop a backend inside the runtime its connections run on; leak one
/// inherited through `fork()`.
fn release(old: Option<(u64, Remote)>) {
    let Some((generation, remote)) = old else { return };
    if generation != fork_generation() {
        std::mem::forget(remote);
        return;
    }
    let _guard = current_runtime().map(|rt| rt.enter());
    drop(remote);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::system_now_us;

    #[test]
    fn a_deadline_is_on_the_servers_clock_and_never_late() {
        let time = ServerTime::default();
        let timeout = Duration::from_millis(100);
        // Until a reply is read, the clocks are taken as equal.
        let before = system_now_us();
        let d = time.deadline(timeout);
        assert!((before + 98_000..=system_now_us() + 98_000).contains(&d), "{d} vs {before}");
        // A server 5 s ahead: its replies move the deadline there.
        time.observe(system_now_us() + 5_000_000);
        let d = time.deadline(timeout);
        assert!(d >= system_now_us() + 5_000_000 + 97_000 && d <= system_now_us() + 5_098_000, "{d}");
        // A lower estimate (a reply read late) does not move it back...
        time.observe(system_now_us() + 4_000_000);
        assert!(time.deadline(timeout) >= system_now_us() + 5_000_000);
        // ...and an explicit time (a manual clock) teaches nothing, an expired reply does.
        time.observe_reply(&[1, 0, 1, 0, 0, 0], Some(1));
        time.observe_reply(&[system_now_us() + 6_000_000, -1], Some(1));
        assert!(time.deadline(timeout) >= system_now_us() + 6_000_000);
        // The margin is at most a quarter of a short timeout.
        let short = time.deadline(Duration::from_millis(4));
        assert!(short >= system_now_us() + 6_000_000 + 3_000 - 1_000, "{short}");
    }
}

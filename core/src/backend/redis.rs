//! Redis on one node, and the TLS settings of every Redis connection.
//!
//! Two ways to the same server, with the same script, errors and timeout:
//! - **async** (Node, Python's asyncio, Rust's `check`): one multiplexed
//!   connection, driven by the runtime, that reconnects by itself;
//! - **blocking** (Python's blocking calls, C, the command line): the
//!   calling thread writes its command and reads the reply on a connection
//!   of its own, taken from a pool of idle ones, with no thread hand-over
//!   (a check is one `write` and one `read`).

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::script::{command, ext_refs, is_noscript, lease_command, query_script, override_error, parse_check_reply, parse_settle_reply, settle_command, Header, Ints, CHECK_SCRIPT};
use super::{Outcomes, ServerTime};
use crate::error::{Error, Result};
use crate::plan::{CompiledRule, Mode, Plan};

/// Redis on one node, through a multiplexed connection that reconnects by
/// itself. Clones share the connection.
#[derive(Clone)]
pub(crate) struct RedisBackend(std::sync::Arc<RedisInner>);

pub(crate) struct RedisInner {
    client: redis::Client,
    /// The client of the blocking path: the same server and settings,
    /// without the client's own `CLIENT SETINFO` on connecting.
    blocking: redis::Client,
    /// How many replies the blocking client reads when it connects (`AUTH`
    /// or `HELLO`, `SELECT`).
    setup_replies: u32,
    timeout: Duration,
    conn: OnceLock<ConnectionManager>,
    /// Idle connections of the blocking path; a connection is taken out for
    /// one call and put back only if it is still in step with the server.
    idle: Mutex<Vec<redis::Connection>>,
    sha: String,
    /// The server's clock, for each check's deadline.
    time: ServerTime,
    /// Replicas that must acknowledge a check (`WAIT` after it; 0: none).
    wait_replicas: u32,
}

/// Idle blocking connections kept at most (one per thread that calls at once).
const MAX_IDLE: usize = 64;

impl RedisBackend {
    pub fn new(url: &str, timeout: Duration, tls: Option<&TlsOptions>, wait_replicas: u32) -> Result<RedisBackend> {
        let bad_url = |e: redis::RedisError| {
            Error::invalid_argument(format!("url: {url:?} is not a valid Redis URL")).with_source(e)
        };
        let client = match tls {
            Some(t) => {
                t.validate()?;
                redis::Client::build_with_tls(url, t.certificates()).map_err(bad_url)?
            }
            None => redis::Client::open(url).map_err(bad_url)?,
        };
        RedisBackend::from_client(client, timeout, wait_replicas).map_err(bad_url)
    }

    /// The backend of the server `client` leads to (a URL's, or the primary
    /// a Sentinel named).
    pub(crate) fn from_client(client: redis::Client, timeout: Duration, wait_replicas: u32) -> redis::RedisResult<RedisBackend> {
        // The client reads every reply of its connection setup, each within
        // the timeout it was given, even after one timed out: on a server
        // that does not answer, connecting would take that timeout once per
        // command. Without the (informational) `CLIENT SETINFO`, the setup
        // is at most `AUTH` or `HELLO` and `SELECT`, and each gets its
        // share of the time left.
        let info = client.get_connection_info().clone();
        let settings = info.redis_settings().clone().set_skip_set_lib_name();
        let setup_replies = u32::from(settings.protocol().supports_resp3() || settings.password().is_some())
            + u32::from(settings.db() != 0);
        let blocking = redis::Client::open(info.set_redis_settings(settings))?;
        Ok(RedisBackend(std::sync::Arc::new(RedisInner {
            client,
            blocking,
            setup_replies,
            timeout,
            conn: OnceLock::new(),
            idle: Mutex::new(Vec::new()),
            sha: redis::Script::new(CHECK_SCRIPT).get_hash().to_string(),
            time: ServerTime::default(),
            wait_replicas,
        })))
    }

    /// Replicas that must acknowledge each check (`WAIT`; 0: none).
    pub(crate) fn wait_replicas(&self) -> u32 {
        self.0.wait_replicas
    }

    /// True when `other` is this backend (a clone of it).
    pub(crate) fn same(&self, other: &RedisBackend) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }

    /// The connection manager, made on first use (inside the runtime). It
    /// connects lazily and reconnects in the background after a loss; each
    /// reconnect tries twice, 10-200 ms apart, and the caller's timeout bounds
    /// every wait.
    fn conn(&self) -> Result<ConnectionManager> {
        let this = &self.0;
        if let Some(c) = this.conn.get() {
            return Ok(c.clone());
        }
        // Slightly longer than the call's timeout, so the limiter's own bound
        // fires first and a slow server is always reported as a timeout; the
        // client's bound then drops the stale request from the connection.
        let slack = this.timeout + Duration::from_millis(50);
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(slack))
            .set_response_timeout(Some(slack))
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(200));
        let manager = ConnectionManager::new_lazy_with_config(this.client.clone(), config)?;
        Ok(this.conn.get_or_init(|| manager).clone())
    }

    /// Run the check script: EVALSHA, and on NOSCRIPT load it and retry once
    /// (and if it was flushed again in between, EVAL the script itself).
    pub async fn eval(&self, plan: &Plan<'_, String>, call_id: &str, mode: Mode, now: Option<i64>) -> Result<Outcomes> {
        let mut conn = self.conn()?;
        let header = self.header(plan, mode, call_id, now);
        let ext = ext_refs(plan);
        let cmd = command(Some(&self.0.sha), &plan.keys, &plan.rules, &ext, header);
        let answer: redis::RedisResult<Vec<i64>> = async {
            match self.send(&cmd, mode, &mut conn).await {
                Err(e) if is_noscript(&e) => {
                    redis::cmd("SCRIPT").arg("LOAD").arg(CHECK_SCRIPT).query_async::<String>(&mut conn).await?;
                    match self.send(&cmd, mode, &mut conn).await {
                        // Flushed again between the load and the retry: send the
                        // script itself, which cannot miss.
                        Err(e) if is_noscript(&e) => {
                            self.send(&command(None, &plan.keys, &plan.rules, &ext, header), mode, &mut conn).await
                        }
                        other => other,
                    }
                }
                other => other,
            }
        }
        .await;
        let reply = match answer {
            Ok(v) => v,
            Err(e) => {
                // A cost above an override's limit (lua/extensions.lua).
                let named = if ext.is_empty() { None } else { override_error(&e, &plan.rules, plan.cost, plan.costs.as_deref()) };
                return Err(named.unwrap_or_else(|| e.into()));
            }
        };
        self.0.time.observe_reply(&reply, now);
        parse_check_reply(&reply, &plan.rules, &ext)
    }

    /// Send a check's script command; with `wait_replicas`, a check (not a
    /// peek) is followed by `WAIT` in the same pipeline, and a check the
    /// replicas did not acknowledge in time is an error.
    async fn send(&self, cmd: &redis::Cmd, mode: Mode, conn: &mut ConnectionManager) -> redis::RedisResult<Vec<i64>> {
        match self.wait_for(mode) {
            None => cmd.query_async::<Ints>(conn).await.map(|r| r.0),
            Some((n, ms)) => {
                let (reply, acked): (Ints, u64) =
                    redis::pipe().add_command(cmd.clone()).cmd("WAIT").arg(n).arg(ms).query_async(conn).await?;
                not_acknowledged(n, ms, acked)?;
                Ok(reply.0)
            }
        }
    }

    /// [`RedisBackend::send`] on a blocking connection.
    fn send_blocking(&self, cmd: &redis::Cmd, mode: Mode, conn: &mut redis::Connection) -> redis::RedisResult<Vec<i64>> {
        match self.wait_for(mode) {
            None => cmd.query::<Ints>(conn).map(|r| r.0),
            Some((n, ms)) => {
                let (reply, acked): (Ints, u64) =
                    redis::pipe().add_command(cmd.clone()).cmd("WAIT").arg(n).arg(ms).query(conn)?;
                not_acknowledged(n, ms, acked)?;
                Ok(reply.0)
            }
        }
    }

    /// The replicas a call in `mode` waits for and `WAIT`'s timeout in
    /// milliseconds (half the call's timeout, so its answer is read in time).
    fn wait_for(&self, mode: Mode) -> Option<(u32, u64)> {
        let n = self.0.wait_replicas;
        (n > 0 && mode == Mode::Check).then(|| (n, (self.0.timeout.as_millis() as u64 / 2).max(1)))
    }

    /// The header of a plan sent now: a check on the server's clock carries
    /// its deadline (`lua/deadline.lua`).
    pub(crate) fn header<'a>(&self, plan: &'a Plan<'_, String>, mode: Mode, call_id: &'a str, now: Option<i64>) -> Header<'a> {
        let deadline = now.is_none().then(|| self.0.time.deadline(self.0.timeout));
        Header::of(plan, mode, call_id, now).until(deadline).terse(now.is_some() || self.0.time.fresh())
    }

    /// What this backend knows of the server's clock.
    pub(crate) fn server_time(&self) -> &ServerTime {
        &self.0.time
    }

    /// The client (its URL's address and settings), the script's SHA1 and
    /// the timeout: what a front end that moves the bytes itself needs
    /// ([`crate::Wire`]).
    pub(crate) fn parts(&self) -> (&redis::Client, &str, Duration) {
        (&self.0.client, &self.0.sha, self.0.timeout)
    }

    /// Run one command.
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Result<T> {
        let mut conn = self.conn()?;
        Ok(cmd.query_async(&mut conn).await?)
    }

    /// [`RedisBackend::eval`] on the calling thread: the same commands
    /// (EVALSHA, and SCRIPT LOAD then a retry on NOSCRIPT) on a connection of
    /// its own, the whole call bounded by the timeout. A connection that
    /// failed or timed out is dropped, and with it every idle one (they
    /// lead to the same server, which is likely gone); the next call
    /// connects anew.
    pub fn eval_blocking(&self, plan: &Plan<'_, String>, call_id: &str, mode: Mode, now: Option<i64>) -> Result<Outcomes> {
        let deadline = Instant::now() + self.0.timeout;
        let header = self.header(plan, mode, call_id, now);
        let ext = ext_refs(plan);
        let cmd = command(Some(&self.0.sha), &plan.keys, &plan.rules, &ext, header);
        let (mut conn, mut shortened) = self.take(deadline)?;
        let reply = match self.send_blocking(&cmd, mode, &mut conn) {
            Err(e) if is_noscript(&e) => (|| {
                shortened = true;
                self.bound(&conn, deadline)?;
                redis::cmd("SCRIPT").arg("LOAD").arg(CHECK_SCRIPT).query::<String>(&mut conn)?;
                self.bound(&conn, deadline)?;
                match self.send_blocking(&cmd, mode, &mut conn) {
                    // Flushed again in between: the script itself cannot miss.
                    Err(e) if is_noscript(&e) => {
                        self.send_blocking(&command(None, &plan.keys, &plan.rules, &ext, header), mode, &mut conn)
                    }
                    other => other,
                }
            })(),
            other => other,
        };
        // A cost above an override's limit (lua/extensions.lua), as the async path names it.
        let named = match &reply {
            Err(e) if !ext.is_empty() => override_error(e, &plan.rules, plan.cost, plan.costs.as_deref()),
            _ => None,
        };
        let reply = match (self.put_back(conn, shortened, reply), named) {
            (Err(_), Some(named)) => return Err(named),
            (reply, _) => reply?,
        };
        self.0.time.observe_reply(&reply, now);
        parse_check_reply(&reply, &plan.rules, &ext)
    }

    /// An idle connection, or a new one made within the time left, and
    /// whether its timeouts were shortened. An idle connection's read and
    /// write timeouts are the limiter's timeout (the whole call is still
    /// ahead), so its first command is bounded without a system call to
    /// set them. A new one has spent part of the call on connecting (the
    /// TCP handshake, then the client's own setup commands, read within
    /// the same time): its timeouts are the time left, so connecting and
    /// the command together stay within the one deadline.
    fn take(&self, deadline: Instant) -> Result<(redis::Connection, bool)> {
        if let Some(c) = self.0.idle.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            return Ok((c, false));
        }
        let left = self.left(deadline)?;
        let share = left / self.0.setup_replies.max(1);
        let conn = self.0.blocking.get_connection_with_timeout(share).map_err(|e| self.error(e))?;
        self.bound(&conn, deadline).map_err(|e| self.error(e))?;
        Ok((conn, true))
    }

    /// Shorten a connection's timeouts to the time left (the rare second
    /// and third commands of a call after NOSCRIPT).
    fn bound(&self, conn: &redis::Connection, deadline: Instant) -> redis::RedisResult<()> {
        let left = self.left(deadline).map_err(|_| redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))?;
        conn.set_read_timeout(Some(left))?;
        conn.set_write_timeout(Some(left))
    }

    fn left(&self, deadline: Instant) -> Result<Duration> {
        match deadline.checked_duration_since(Instant::now()) {
            Some(d) if !d.is_zero() => Ok(d),
            _ => Err(Error::timeout(self.0.timeout)),
        }
    }

    /// Keep a connection that is still in step with the server (its reply
    /// was read: a value or an error reply), with its timeouts restored if
    /// they were `shortened`; drop it, and every idle one, after a failure
    /// of the connection.
    fn put_back<T>(&self, conn: redis::Connection, shortened: bool, reply: redis::RedisResult<T>) -> Result<T> {
        let broken = |e: &redis::RedisError| e.is_timeout() || e.is_io_error() || e.is_unrecoverable_error();
        match &reply {
            Err(e) if broken(e) => {
                self.0.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
                drop(conn);
            }
            _ => {
                let timeout = Some(self.0.timeout);
                let restored = !shortened || conn.set_read_timeout(timeout).and_then(|_| conn.set_write_timeout(timeout)).is_ok();
                let mut idle = self.0.idle.lock().unwrap_or_else(|p| p.into_inner());
                if restored && idle.len() < MAX_IDLE {
                    idle.push(conn);
                }
            }
        }
        reply.map_err(|e| self.error(e))
    }

    /// The error of a blocking call: a timeout reads as the async path's.
    fn error(&self, e: redis::RedisError) -> Error {
        if e.is_timeout() {
            Error::timeout(self.0.timeout)
        } else {
            e.into()
        }
    }

    /// Settle the check `call_id` of `plan` (made at cost `plan.cost`) to
    /// `actual` (mode `x`, `lua/settle.lua`): which rules were settled.
    pub async fn settle(
        &self,
        plan: &Plan<'_, String>,
        call_id: &str,
        actual: u64,
        now: Option<i64>,
    ) -> Result<super::Settled> {
        let mut conn = self.conn()?;
        let build = |sha: Option<&str>| settle_command(sha, &plan.keys, &plan.rules, now, call_id, plan.cost, actual);
        let reply = query_script(&mut conn, &self.0.sha, build).await?;
        parse_settle_reply(&reply, plan.keys.len())
    }

    /// Release or extend (by `extend_us`) lease `lease_id` on these keys of
    /// concurrency rules (modes `d` and `e`, `lua/concurrency.lua`): per key,
    /// whether the lease held slots there.
    pub async fn lease(
        &self,
        keys: &[String],
        rules: &[&CompiledRule],
        lease_id: &str,
        extend_us: Option<i64>,
        now: Option<i64>,
    ) -> Result<smallvec::SmallVec<[bool; 4]>> {
        let mut conn = self.conn()?;
        let build = |sha: Option<&str>| lease_command(sha, keys, rules, now, lease_id, extend_us);
        let reply = query_script(&mut conn, &self.0.sha, build).await?;
        // The same reply shape as a settle's: 1 where the lease held slots.
        Ok(parse_settle_reply(&reply, keys.len())?.into_iter().map(|o| o == super::SettleOutcome::Settled).collect())
    }

    /// Delete `keys`; returns how many existed.
    pub async fn reset(&self, keys: &[String]) -> Result<u64> {
        let mut conn = self.conn()?;
        Ok(redis::cmd("DEL").arg(keys).query_async(&mut conn).await?)
    }

    /// Round trip to the server.
    pub async fn ping(&self) -> Result<()> {
        let mut conn = self.conn()?;
        redis::cmd("PING").query_async::<String>(&mut conn).await?;
        Ok(())
    }
}

/// The error of a check that fewer than `n` replicas acknowledged within
/// `ms` (`WAIT` answered `acked`): the backend is unavailable as far as this
/// check is concerned (answered by `on_backend_error`).
fn not_acknowledged(n: u32, ms: u64, acked: u64) -> redis::RedisResult<()> {
    if acked >= n as u64 {
        return Ok(());
    }
    Err(redis::RedisError::from((
        redis::ErrorKind::Server(redis::ServerErrorKind::TryAgain),
        "wait_replicas",
        format!("the check was acknowledged by {acked} of {n} replica(s) within {ms} ms (WAIT)"),
    )))
}

/// TLS settings for `rediss://` URLs beyond the system's trust store.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// A CA certificate (PEM) to trust instead of the system's roots.
    pub root_cert_pem: Option<Vec<u8>>,
    /// A client certificate and key (PEM) for mutual TLS.
    pub client_cert_pem: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsOptions {
    /// Check that the PEM data parses, so a bad file is reported when the
    /// limiter is built, naming the option, instead of at the first call.
    pub(crate) fn validate(&self) -> Result<()> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = |pem: &[u8], what: &str| -> Result<()> {
            let n = CertificateDer::pem_slice_iter(pem)
                .map(|c| c.map(|_| ()))
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| Error::invalid_argument(format!("{what}: not a PEM certificate: {e}")))?
                .len();
            if n == 0 {
                return Err(Error::invalid_argument(format!("{what}: no PEM certificate found")));
            }
            Ok(())
        };
        if let Some(root) = &self.root_cert_pem {
            certs(root, "tls_root_cert")?;
        }
        if let Some((cert, key)) = &self.client_cert_pem {
            certs(cert, "tls_client_cert")?;
            PrivateKeyDer::from_pem_slice(key)
                .map_err(|e| Error::invalid_argument(format!("tls_client_cert: the key is not a PEM private key: {e}")))?;
        }
        Ok(())
    }

    pub(crate) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self.client_cert_pem.as_ref().map(|(c, k)| redis::ClientTlsConfig {
                client_cert: c.clone(),
                client_key: k.clone(),
            }),
            root_cert: self.root_cert_pem.clone(),
        }
    }
}


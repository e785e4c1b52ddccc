//! What a check sends to a backend, and the Redis backend.

use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use smallvec::SmallVec;

use crate::algo::Outcome;
use crate::error::{Error, ErrorKind, Result};
use crate::limiter::CompiledRule;

/// The one script behind every check: the single-rule fast path, the
/// arguments of the general one, both algorithms, the replay and give-back helpers and the stacked
/// driver from `lua/`, composed at build time. `#!lua` (Redis >= 7)
/// makes Redis refuse the whole script up front when it is out of memory,
/// instead of failing half-way through the writes.
pub const CHECK_SCRIPT: &str = concat!(
    "#!lua\n",
    include_str!("../lua/single_rule.lua"),
    "\n",
    include_str!("../lua/args.lua"),
    "\n",
    include_str!("../lua/sliding_window_log.lua"),
    "\n",
    include_str!("../lua/token_bucket.lua"),
    "\n",
    include_str!("../lua/replay.lua"),
    "\n",
    include_str!("../lua/check.lua"),
);

/// Check (consume when every rule admits) or peek (never writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Check,
    Peek,
}

/// A rule's algorithm parameters in backend units.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum RuleArgs {
    Window { limit: u64, window_us: i64, shadow: bool },
    Bucket { capacity: u64, rate: f64, shadow: bool },
}

impl RuleArgs {
    pub fn shadow(&self) -> bool {
        match *self {
            RuleArgs::Window { shadow, .. } | RuleArgs::Bucket { shadow, .. } => shadow,
        }
    }

    /// The three script arguments of this rule: the algorithm code (upper
    /// case for a shadow rule) and its two parameters.
    pub fn script_args(&self) -> [String; 3] {
        match *self {
            RuleArgs::Window { limit, window_us, shadow } => [
                if shadow { "W" } else { "w" }.into(),
                limit.to_string(),
                window_us.to_string(),
            ],
            // `{}` prints the shortest text that reads back as the same f64,
            // which is what Lua's tonumber gets.
            RuleArgs::Bucket { capacity, rate, shadow } => {
                [if shadow { "B" } else { "b" }.into(), capacity.to_string(), format!("{rate}")]
            }
        }
    }
}

/// The applicable rules of one check, with their keys.
pub(crate) struct Plan<'a> {
    pub keys: SmallVec<[String; 4]>,
    pub compiled: SmallVec<[&'a CompiledRule; 4]>,
    pub cost: u64,
    /// The caller's id for this call; `None` means a random one is made
    /// when the call goes over the network.
    pub call_id: Option<String>,
}

/// A backend's answer: per-rule outcomes. (A re-sent call that was already
/// applied is answered as admitted, with the current state.)
pub(crate) struct Verdict {
    pub outcomes: SmallVec<[Outcome; 4]>,
}

/// Redis on one node, through a multiplexed connection that reconnects by
/// itself. Clones share the connection.
#[derive(Clone)]
pub(crate) struct RedisBackend(std::sync::Arc<RedisInner>);

pub(crate) struct RedisInner {
    client: redis::Client,
    timeout: Duration,
    conn: OnceLock<ConnectionManager>,
    sha: String,
}

impl RedisBackend {
    pub fn new(url: &str, timeout: Duration, tls: Option<&TlsOptions>) -> Result<RedisBackend> {
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
        Ok(RedisBackend(std::sync::Arc::new(RedisInner {
            client,
            timeout,
            conn: OnceLock::new(),
            sha: redis::Script::new(CHECK_SCRIPT).get_hash().to_string(),
        })))
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
    /// Returns the time the script used and the verdict.
    pub async fn eval(&self, plan: &Plan<'_>, call_id: &str, mode: Mode, now: Option<i64>) -> Result<(i64, Verdict)> {
        let mut conn = self.conn()?;
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.0.sha).arg(plan.keys.len()).arg(&plan.keys[..]);
        push_args(&mut cmd, plan, call_id, mode, now);
        let reply: Vec<i64> = match cmd.query_async(&mut conn).await {
            Ok(v) => v,
            Err(e) if is_noscript(&e) => {
                redis::cmd("SCRIPT")
                    .arg("LOAD")
                    .arg(CHECK_SCRIPT)
                    .query_async::<String>(&mut conn)
                    .await?;
                match cmd.query_async(&mut conn).await {
                    Ok(v) => v,
                    // Flushed again between the load and the retry: send the
                    // script itself, which cannot miss.
                    Err(e) if is_noscript(&e) => eval_cmd(plan, call_id, mode, now).query_async(&mut conn).await?,
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        parse_reply(&reply, plan.keys.len())
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

pub(crate) fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// An EVAL of the whole script with the plan's keys and arguments.
fn eval_cmd(plan: &Plan<'_>, call_id: &str, mode: Mode, now: Option<i64>) -> redis::Cmd {
    let mut eval = redis::cmd("EVAL");
    eval.arg(CHECK_SCRIPT).arg(plan.keys.len()).arg(&plan.keys[..]);
    push_args(&mut eval, plan, call_id, mode, now);
    eval
}

/// The script arguments after the keys.
fn push_args(cmd: &mut redis::Cmd, plan: &Plan<'_>, call_id: &str, mode: Mode, now: Option<i64>) {
    // The most common check has a short form of its own (lua/single_rule.lua).
    if let ([rule], Mode::Check, None, None, 1) = (&plan.compiled[..], mode, now, &plan.call_id, plan.cost) {
        if let RuleArgs::Window { shadow: false, .. } = rule.args {
            cmd.arg("s").arg(call_id).arg(&rule.script_args[1..]);
            return;
        }
    }
    // A caller's own call id may come back in a retry: "C" looks it up first.
    cmd.arg(match mode {
        Mode::Check if plan.call_id.is_some() => "C",
        Mode::Check => "c",
        Mode::Peek => "p",
    });
    match now {
        Some(t) => cmd.arg(t),
        None => cmd.arg(""),
    };
    cmd.arg(call_id).arg(plan.cost);
    for rule in &plan.compiled {
        cmd.arg(&rule.script_args[..]);
    }
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

pub(crate) fn parse_reply(reply: &[i64], n: usize) -> Result<(i64, Verdict)> {
    if reply.len() != 2 + 4 * n {
        return Err(Error::new(
            ErrorKind::Backend,
            format!(
                "the check script returned {} values for {n} rules; is another version of throttlegate's script loaded under the same hash?",
                reply.len()
            ),
        ));
    }
    let outcomes = reply[2..]
        .chunks_exact(4)
        .map(|c| Outcome {
            allowed: c[0] == 1,
            remaining: c[1].max(0) as u64,
            retry_after_us: c[2],
            reset_after_us: c[3],
        })
        .collect();
    Ok((
        reply[0],
        Verdict { outcomes },
    ))
}

/// A network backend: one Redis node or a Redis Cluster. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Remote {
    Redis(RedisBackend),
    Cluster(crate::cluster::ClusterBackend),
}

impl Remote {
    pub async fn eval(&self, plan: &Plan<'_>, mode: Mode, now: Option<i64>) -> Result<Verdict> {
        let random;
        let call_id = match &plan.call_id {
            Some(id) => id.as_str(),
            None => {
                random = crate::limiter::random_call_id();
                random.as_str()
            }
        };
        match self {
            Remote::Redis(r) => r.eval(plan, call_id, mode, now).await.map(|(_, v)| v),
            Remote::Cluster(c) => c.eval(plan, call_id, mode, now).await,
        }
    }

    pub async fn reset(&self, keys: &[String]) -> Result<u64> {
        match self {
            Remote::Redis(r) => r.reset(keys).await,
            Remote::Cluster(c) => c.reset(keys).await,
        }
    }

    pub async fn ping(&self) -> Result<()> {
        match self {
            Remote::Redis(r) => r.ping().await,
            Remote::Cluster(c) => c.ping().await,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Remote::Redis(_) => "redis",
            Remote::Cluster(_) => "cluster",
        }
    }
}

//! Redis on one node, and the TLS settings of every Redis connection.

use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::script::{command, is_noscript, parse_reply, parse_settle_reply, settle_command, Header, CHECK_SCRIPT};
use super::Outcomes;
use crate::error::{Error, Result};
use crate::plan::{Mode, Plan};

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
    pub async fn eval(&self, plan: &Plan<'_, String>, call_id: &str, mode: Mode, now: Option<i64>) -> Result<Outcomes> {
        let mut conn = self.conn()?;
        let header = Header::of(plan, mode, call_id, now);
        let cmd = command(Some(&self.0.sha), &plan.keys, &plan.rules, header);
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
                    Err(e) if is_noscript(&e) => {
                        command(None, &plan.keys, &plan.rules, header).query_async(&mut conn).await?
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        };
        parse_reply(&reply, plan.keys.len())
    }

    /// Settle the check `call_id` of `plan` (made at cost `plan.cost`) to
    /// `actual` (mode `x`, `lua/settle.lua`): which rules were settled.
    pub async fn settle(
        &self,
        plan: &Plan<'_, String>,
        call_id: &str,
        actual: u64,
        now: Option<i64>,
    ) -> Result<smallvec::SmallVec<[bool; 4]>> {
        let mut conn = self.conn()?;
        let build = |sha: Option<&str>| settle_command(sha, &plan.keys, &plan.rules, now, call_id, plan.cost, actual);
        let cmd = build(Some(&self.0.sha));
        let reply: Vec<i64> = match cmd.query_async(&mut conn).await {
            Ok(v) => v,
            // The script is gone (a flush, a restart): send it whole, which cannot miss.
            Err(e) if is_noscript(&e) => build(None).query_async(&mut conn).await?,
            Err(e) => return Err(e.into()),
        };
        parse_settle_reply(&reply, plan.keys.len())
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


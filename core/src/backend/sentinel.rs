//! Redis behind Sentinel: `redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[/DB]`
//! (`rediss+sentinel://` for TLS to the sentinels and the primary).
//!
//! The sentinels name the service's primary; every call runs on it as on
//! one node ([`RedisBackend`]). A call that finds the primary gone (the
//! connection lost or refused, no answer within the timeout, `READONLY`
//! from a primary demoted to a replica, `MASTERDOWN`) forgets it, so the
//! next call asks the sentinels again: the limiter follows a failover
//! without a restart. Calls during the switch fail like any outage
//! (answered by the failure policy).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, TlsMode};

use super::redis::{RedisBackend, TlsOptions};
use crate::error::{Error, ErrorKind, Result};

/// The sentinels' port when a host names none.
const SENTINEL_PORT: u16 = 26379;

/// The primary of a Sentinel-managed service. Cheap to clone.
#[derive(Clone)]
pub(crate) struct SentinelBackend(Arc<Inner>);

struct Inner {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    primary: RwLock<Option<RedisBackend>>,
    timeout: Duration,
    wait_replicas: u32,
}

/// What a `redis+sentinel://` URL says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    pub tls: bool,
    pub username: Option<String>,
    pub password: Option<String>,
    pub sentinels: Vec<(String, u16)>,
    pub service: String,
    pub db: i64,
}

impl SentinelUrl {
    /// Parse `url`; the error names what is wrong.
    pub fn parse(url: &str) -> Result<SentinelUrl> {
        let bad = |what: &str| {
            Error::invalid_argument(format!(
                "url: {what} in a Sentinel URL; the form is redis+sentinel://[user:password@]host:port[,host:port...]/SERVICE[/DB]"
            ))
        };
        let (tls, rest) = if let Some(r) = url.strip_prefix("redis+sentinel://") {
            (false, r)
        } else if let Some(r) = url.strip_prefix("rediss+sentinel://") {
            (true, r)
        } else {
            return Err(bad("an unknown scheme"));
        };
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => {
                let (user, pass) = match u.split_once(':') {
                    Some((user, pass)) => (user, Some(pass)),
                    None => (u, None),
                };
                let decode = |s: &str| {
                    percent_decode(s)
                        .ok_or_else(|| bad("a bad percent-encoding in the user or password"))
                };
                let user = if user.is_empty() {
                    None
                } else {
                    Some(decode(user)?)
                };
                let pass = match pass {
                    Some(p) if !p.is_empty() => Some(decode(p)?),
                    _ => None,
                };
                (user, pass)
            }
        };
        if username.is_some() && password.is_none() {
            return Err(bad("a user without a password"));
        }
        let mut sentinels = Vec::new();
        for host in hosts.split(',') {
            let host = host.trim();
            if host.is_empty() {
                return Err(bad("an empty host"));
            }
            let (name, port) = if let Some(v6) = host.strip_prefix('[') {
                let (name, after) = v6
                    .split_once(']')
                    .ok_or_else(|| bad("an unclosed [ in a host"))?;
                match after.strip_prefix(':') {
                    Some(p) => (name, Some(p)),
                    None if after.is_empty() => (name, None),
                    None => return Err(bad(&format!("a bad host {host:?}"))),
                }
            } else {
                match host.rsplit_once(':') {
                    Some((n, p)) => (n, Some(p)),
                    None => (host, None),
                }
            };
            let port = match port {
                None => SENTINEL_PORT,
                Some(p) => p
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad(&format!("a bad port {p:?}")))?,
            };
            if name.is_empty() {
                return Err(bad(&format!("a host without a name {host:?}")));
            }
            sentinels.push((name.to_string(), port));
        }
        let mut parts = path.split('/');
        let service = parts.next().unwrap_or("").to_string();
        if service.is_empty() {
            return Err(bad("no SERVICE (the name the sentinels monitor)"));
        }
        let db = match parts.next() {
            None | Some("") => 0,
            Some(d) => d
                .parse::<i64>()
                .ok()
                .filter(|d| *d >= 0)
                .ok_or_else(|| bad(&format!("a bad DB {d:?}")))?,
        };
        if parts.next().is_some_and(|p| !p.is_empty()) {
            return Err(bad("a path beyond /SERVICE/DB"));
        }
        Ok(SentinelUrl {
            tls,
            username,
            password,
            sentinels,
            service,
            db,
        })
    }
}

/// `%XX` decoded; `None` for a malformed escape or bytes that are not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl SentinelBackend {
    pub fn new(url: &str, timeout: Duration, tls: Option<&TlsOptions>, wait_replicas: u32) -> Result<SentinelBackend> {
        let u = SentinelUrl::parse(url)?;
        let addrs = u.sentinels.iter().map(|(host, port)| {
            if u.tls {
                ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: false,
                    tls_params: None,
                }
            } else {
                ConnectionAddr::Tcp(host.clone(), *port)
            }
        });
        let invalid = |e: redis::RedisError| {
            Error::invalid_argument(format!("url: {url:?} is not a valid Sentinel URL"))
                .with_source(e)
        };
        let mut b = SentinelClientBuilder::new(addrs, &u.service, SentinelServerType::Master)
            .map_err(invalid)?;
        if let Some(user) = &u.username {
            b = b
                .set_client_to_redis_username(user)
                .set_client_to_sentinel_username(user);
        }
        if let Some(pass) = &u.password {
            b = b
                .set_client_to_redis_password(pass)
                .set_client_to_sentinel_password(pass);
        }
        if u.db != 0 {
            b = b.set_client_to_redis_db(u.db);
        }
        if u.tls {
            b = b
                .set_client_to_redis_tls_mode(TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(TlsMode::Secure);
            if let Some(t) = tls {
                t.validate()?;
                b = b
                    .set_client_to_redis_certificates(t.certificates())
                    .set_client_to_sentinel_certificates(t.certificates());
            }
        } else if tls.is_some_and(|t| t.root_cert_pem.is_some() || t.client_cert_pem.is_some()) {
            return Err(Error::invalid_argument(format!(
                "url: {url:?}: TLS certificates are given but the URL is not rediss+sentinel://"
            )));
        }
        let sentinels = b.build().map_err(invalid)?;
        Ok(SentinelBackend(Arc::new(Inner {
            sentinels: tokio::sync::Mutex::new(sentinels),
            primary: RwLock::new(None),
            timeout,
            wait_replicas,
        })))
    }

    /// The primary the sentinels named last, or the one they name now.
    async fn primary(&self) -> Result<RedisBackend> {
        if let Some(p) = &*self.0.primary.read().unwrap_or_else(|p| p.into_inner()) {
            return Ok(p.clone());
        }
        let mut sentinels = self.0.sentinels.lock().await;
        // Another call may have asked while this one waited.
        if let Some(p) = &*self.0.primary.read().unwrap_or_else(|p| p.into_inner()) {
            return Ok(p.clone());
        }
        let client = sentinels.async_get_client().await.map_err(|e| {
            let e = Error::from(e);
            Error::new(e.kind(), format!("no primary from the sentinels: {e}"))
                .set_temporary(e.is_temporary() || e.kind() == ErrorKind::Backend)
        })?;
        let backend = RedisBackend::from_client(client, self.0.timeout, self.0.wait_replicas)?;
        *self.0.primary.write().unwrap_or_else(|p| p.into_inner()) = Some(backend.clone());
        Ok(backend)
    }

    /// Run `call` on the primary; forget it when the call says it is gone
    /// (or does not finish: the caller's timeout dropped it).
    pub async fn on_primary<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: FnOnce(RedisBackend) -> Fut,
        Fut: std::future::Future<Output = Result<T>>,
    {
        let primary = self.primary().await?;
        let mut suspect = Suspect {
            backend: self,
            primary: Some(primary.clone()),
        };
        let result = call(primary).await;
        if let Err(e) = &result {
            if primary_gone(e) {
                return result;
            }
        }
        suspect.primary = None;
        result
    }
}

/// Forgets the primary on drop unless disarmed: a call that failed for the
/// primary's sake or never finished.
struct Suspect<'a> {
    backend: &'a SentinelBackend,
    primary: Option<RedisBackend>,
}

impl Drop for Suspect<'_> {
    fn drop(&mut self) {
        let Some(p) = self.primary.take() else { return };
        let mut slot = self
            .backend
            .0
            .primary
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_some_and(|cur| cur.same(&p)) {
            *slot = None;
        }
    }
}

/// True for an error after which the primary must be asked for again.
fn primary_gone(e: &Error) -> bool {
    if matches!(e.kind(), ErrorKind::BackendUnavailable | ErrorKind::Timeout) {
        return true;
    }
    let text = format!("{e} {e:?}");
    text.contains("READONLY")
        || text.contains("ReadOnly")
        || text.contains("MASTERDOWN")
        || text.contains("MasterDown")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_of_the_limits_form() {
        let u =
            SentinelUrl::parse("redis+sentinel://app:p%40ss@10.0.0.1:26380,[::1],s3/mymaster/2")
                .unwrap();
        assert_eq!(
            u,
            SentinelUrl {
                tls: false,
                username: Some("app".into()),
                password: Some("p@ss".into()),
                sentinels: vec![
                    ("10.0.0.1".into(), 26380),
                    ("::1".into(), 26379),
                    ("s3".into(), 26379)
                ],
                service: "mymaster".into(),
                db: 2,
            }
        );
        let u = SentinelUrl::parse("rediss+sentinel://:secret@h:1/svc").unwrap();
        assert!(
            u.tls && u.username.is_none() && u.password.as_deref() == Some("secret") && u.db == 0
        );
        for (bad, says) in [
            ("redis+sentinel://h:1", "no SERVICE"),
            ("redis+sentinel://h:1/", "no SERVICE"),
            ("redis+sentinel://h:0/s", "bad port"),
            ("redis+sentinel://h:x/s", "bad port"),
            ("redis+sentinel://h:1,/s", "empty host"),
            ("redis+sentinel://h:1/s/-1", "bad DB"),
            ("redis+sentinel://h:1/s/0/x", "beyond"),
            ("redis+sentinel://u@h:1/s", "without a password"),
            ("redis+sentinel://u:%zz@h:1/s", "percent-encoding"),
        ] {
            let e = SentinelUrl::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidArgument);
            assert!(
                e.to_string().contains(says) && e.to_string().contains("/SERVICE[/DB]"),
                "{bad}: {e}"
            );
        }
    }
}

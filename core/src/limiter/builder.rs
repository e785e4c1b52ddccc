//! [`LimiterOptions`], the one set of settings every front end fills, and
//! [`LimiterBuilder`], the same settings as chained calls.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;


use super::metrics::RuleCounters;
use super::reload::{self, Overrides, ReloadCounters};
use super::stats::Counters;
use super::{Generation, Inner, Limiter};
use crate::backend::memory::MemoryBackend;
use crate::backend::redis::TlsOptions;
use crate::backend::Connection;
use crate::clock::{system_now_us, Clock};
use crate::decision::HeaderOptions;
use crate::deny_cache::DenyCache;
use crate::error::{Error, Result};
use crate::health::{HealthSink, Outage};
use crate::plan::Rules;
use crate::policy::{FailureMode, Policy};

/// A limiter's settings beyond its policy. Every field has the default of
/// [`Default`]: the embedded backend, the policy's own timeout, failure mode
/// and prefix, the backend's clock, no key secret, no TLS settings, no deny
/// cache, per-rule metrics on. Python's keyword arguments, Node's options
/// object and C's `tg_limiter_options` fill this struct and nothing else.
#[derive(Debug, Clone)]
pub struct LimiterOptions {
    /// The backend: `redis://host:port/db`, `rediss://...` (TLS),
    /// `redis+unix:///path`, `redis+cluster://host:port,host:port`
    /// (`rediss+cluster://` with TLS), or `memory://` / `None` (embedded).
    pub url: Option<String>,
    /// Bound on the whole of one call (overrides the policy's `timeout`).
    pub timeout: Option<Duration>,
    /// What to do when the backend fails (overrides the policy's setting;
    /// rules' own overrides still win).
    pub on_backend_error: Option<FailureMode>,
    /// Key prefix (overrides the policy's `prefix`).
    pub prefix: Option<String>,
    /// Where "now" comes from.
    pub clock: Clock,
    /// Hash attribute values with this secret (HMAC-SHA-256) before they go
    /// into keys; must not be empty.
    pub key_secret: Option<Vec<u8>>,
    /// For `rediss://` URLs: a CA certificate (PEM) to trust instead of the
    /// system's roots.
    pub tls_root_cert: Option<Vec<u8>>,
    /// For `rediss://` URLs: a client certificate and its key (PEM), for mutual TLS.
    pub tls_client_cert: Option<(Vec<u8>, Vec<u8>)>,
    /// Remember denials in process (see [`LimiterBuilder::deny_cache`]).
    pub deny_cache: bool,
    /// Also give the `X-RateLimit-*` headers (see [`crate::Limiter::header_options`]).
    pub legacy_headers: bool,
    /// Count per-rule metrics ([`crate::Limiter::metrics`]; default on).
    pub metrics: bool,
    /// Watch the policy's file and reload it when it changes (default off;
    /// see [`LimiterBuilder::reload_on_change`]).
    pub reload_on_change: bool,
    /// Where the backend's outages and recoveries are reported (see
    /// [`LimiterBuilder::on_health`]); `None` reports nothing.
    pub on_health: Option<HealthSink>,
    /// Check the backend when the limiter is made (see [`LimiterBuilder::strict`]).
    pub strict: bool,
}

impl Default for LimiterOptions {
    fn default() -> Self {
        LimiterOptions {
            url: None,
            timeout: None,
            on_backend_error: None,
            prefix: None,
            clock: Clock::default(),
            key_secret: None,
            tls_root_cert: None,
            tls_client_cert: None,
            deny_cache: false,
            legacy_headers: false,
            metrics: true,
            reload_on_change: false,
            on_health: None,
            strict: false,
        }
    }
}

/// Builds a [`Limiter`]; see [`Limiter::builder`].
#[derive(Debug, Clone)]
pub struct LimiterBuilder {
    policy: Policy,
    options: LimiterOptions,
}

impl LimiterBuilder {
    pub(super) fn new(policy: Policy) -> LimiterBuilder {
        LimiterBuilder { policy, options: LimiterOptions::default() }
    }

    /// Replace every setting with `options`.
    pub fn options(mut self, options: LimiterOptions) -> Self {
        self.options = options;
        self
    }

    /// For `rediss://` URLs: trust this CA certificate (PEM) instead of the
    /// system's roots (a private CA, a self-signed server).
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.options.tls_root_cert = Some(pem.into());
        self
    }

    /// For `rediss://` URLs: present this client certificate and key (PEM), for mutual TLS.
    pub fn tls_client_cert(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.options.tls_client_cert = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// The backend: `redis://host:port/db`, `rediss://...` (TLS),
    /// `redis+unix:///path`, or `memory://` (the embedded backend, the default).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.options.url = Some(url.into());
        self
    }

    /// Bound on the whole of one call (overrides the policy's `timeout`).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.options.timeout = Some(timeout);
        self
    }

    /// What to do when the backend fails (overrides the policy's setting;
    /// rules' own overrides still win).
    pub fn on_backend_error(mut self, mode: FailureMode) -> Self {
        self.options.on_backend_error = Some(mode);
        self
    }

    /// Key prefix (overrides the policy's `prefix`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.options.prefix = Some(prefix.into());
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
        self.options.deny_cache = on;
        self
    }

    /// Also give the legacy `X-RateLimit-*` headers with every decision's
    /// headers, where a front end makes them per limiter (default off).
    pub fn legacy_headers(mut self, on: bool) -> Self {
        self.options.legacy_headers = on;
        self
    }

    /// Count per-rule metrics (default on): a few atomic additions per
    /// applicable rule, and a clock reading around each backend call.
    pub fn metrics(mut self, on: bool) -> Self {
        self.options.metrics = on;
        self
    }

    /// Watch the file the policy was read from ([`Policy::from_file`]) and
    /// [`Limiter::reload`] it when it changes (default off): its
    /// modification time, size and inode are read every
    /// [`reload::RELOAD_POLL_INTERVAL`] on the core's runtime. A file that
    /// does not parse, or that a reload refuses, leaves the policy in force
    /// and is reported by [`Limiter::reload_status`] and the metrics
    /// (`throttlegate_policy_reload_errors_total`). Replace the file
    /// atomically (write another, then rename it over) so that a half-written
    /// file is never read. The watch ends when the limiter is closed or
    /// dropped; a forked child does not watch.
    pub fn reload_on_change(mut self, on: bool) -> Self {
        self.options.reload_on_change = on;
        self
    }

    /// Where "now" comes from (default: the backend's clock).
    pub fn clock(mut self, clock: Clock) -> Self {
        self.options.clock = clock;
        self
    }

    /// Hash attribute values with this secret (HMAC-SHA-256) before they go
    /// into keys, so raw values such as API keys never reach the backend.
    /// Every process sharing the backend must use the same secret.
    pub fn key_secret(mut self, secret: impl Into<Vec<u8>>) -> Self {
        self.options.key_secret = Some(secret.into());
        self
    }

    /// Report the backend's outages to `sink`: one [`crate::HealthEvent::Down`]
    /// with its cause when calls start failing, one [`crate::HealthEvent::Up`]
    /// when a call succeeds again; never one per call.
    pub fn on_health(mut self, sink: HealthSink) -> Self {
        self.options.on_health = Some(sink);
        self
    }

    /// Check the backend when the limiter is made, within the timeout, and
    /// fail fast instead of degrading every call: [`LimiterBuilder::build`]
    /// then connects, sends `PING` and runs the check script once (on no
    /// key), so a wrong URL ([`crate::ErrorKind::BackendUnavailable`]), a server
    /// that does not answer ([`crate::ErrorKind::Timeout`]), or a wrong password or
    /// a user without the script's commands ([`crate::ErrorKind::Backend`]) is an
    /// error of the build, its message naming the failed step. Default off:
    /// a limiter can then be built while Redis is down. The check blocks
    /// the building thread (on a thread of its own, so it may be called
    /// from inside an async runtime).
    pub fn strict(mut self, on: bool) -> Self {
        self.options.strict = on;
        self
    }

    /// Validate the settings and make the limiter. Connections are made on
    /// first use, so a limiter can be built while Redis is down (unless
    /// [`LimiterBuilder::strict`]).
    pub fn build(self) -> Result<Limiter> {
        let LimiterBuilder { mut policy, options: o } = self;
        if let Some(p) = &o.prefix {
            policy = policy.with_prefix(p.clone())?;
        }
        if let Some(t) = o.timeout {
            policy = policy.with_timeout(t)?;
        }
        if let Some(m) = o.on_backend_error {
            policy = policy.with_on_backend_error(m);
        }
        if o.key_secret.as_ref().is_some_and(Vec::is_empty) {
            return Err(Error::invalid_argument("key_secret: must not be empty"));
        }
        let watching = match (o.reload_on_change, policy.source()) {
            (false, _) => None,
            (true, Some(path)) => Some(path.to_path_buf()),
            (true, None) => {
                return Err(Error::invalid_argument(
                    "reload_on_change: the policy was not read from a file; read it with a policy-from-file call",
                ))
            }
        };
        let tls = (o.tls_root_cert.is_some() || o.tls_client_cert.is_some())
            .then_some(TlsOptions { root_cert_pem: o.tls_root_cert, client_cert_pem: o.tls_client_cert });
        let remote = Connection::open(o.url.as_deref(), policy.timeout, tls, policy.wait_replicas)?;
        let memory = remote.is_none().then(MemoryBackend::new);
        let deny_cache = (o.deny_cache && remote.is_some()).then(DenyCache::new);
        let rules = Rules::compile(&policy, o.key_secret.as_deref());
        let metrics = o.metrics.then(|| RuleCounters::new(rules.names()).with_reserved(rules.reserved()));
        let limiter = Limiter {
            inner: Arc::new(Inner {
                current: super::current::Current::new(Generation { policy, rules, metrics, deny_cache }),
                memory,
                remote,
                overrides: Overrides {
                    prefix: o.prefix,
                    on_backend_error: o.on_backend_error,
                    key_secret: o.key_secret,
                    watching: watching.clone(),
                    added: Default::default(),
                },
                reloads: ReloadCounters::default(),
                clock: o.clock,
                headers: HeaderOptions { legacy: o.legacy_headers },
                started_us: crate::clock::monotonic_us(),
                epoch_us: system_now_us(),
                closed: AtomicBool::new(false),
                counters: Counters::default(),
                waiters: Default::default(),
                outage: Outage::new(o.on_health),
                reserves: Default::default(),
            }),
        };
        if o.strict {
            limiter.probe()?;
        }
        if let Some(path) = watching {
            reload::watch(Arc::downgrade(&limiter.inner), path)?;
        }
        Ok(limiter)
    }
}

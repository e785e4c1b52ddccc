//! Outages of the backend as a limiter sees them: one [`HealthEvent::Down`]
//! when calls start failing, with its cause, and one [`HealthEvent::Up`]
//! when a call succeeds again, never one per call. A limiter reports them to
//! its [`HealthSink`] ([`crate::LimiterBuilder::on_health`]); each front end
//! maps them to its ecosystem's logger (Python's `logging` under
//! `"throttlegate"`, Node's `logger` option, C's log callback, the command
//! line's stderr).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind};

/// Why calls to the backend fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OutageCause {
    /// The connection was refused (nothing listens at the URL's address).
    Refused,
    /// The backend did not answer within the timeout (a paused, overloaded or
    /// unreachable server).
    Timeout,
    /// The server refused the URL's credentials, or the user lacks a
    /// permission the script needs (`WRONGPASS`, `NOAUTH`, `NOPERM`).
    AuthFailed,
    /// The script went missing again and again (`NOSCRIPT` after every load).
    NoScript,
    /// The cluster cannot serve the slot (`CLUSTERDOWN`, no node for it).
    ClusterDown,
    /// The backend cannot be reached for another reason (a lost connection,
    /// an unknown host, a server still loading).
    Unavailable,
    /// The backend answered with another error (out of memory, a script error).
    BackendError,
}

impl OutageCause {
    /// Every cause.
    pub const ALL: [OutageCause; 7] = [
        OutageCause::Refused,
        OutageCause::Timeout,
        OutageCause::AuthFailed,
        OutageCause::NoScript,
        OutageCause::ClusterDown,
        OutageCause::Unavailable,
        OutageCause::BackendError,
    ];

    /// Stable identifier: `"refused"`, `"timeout"`, `"auth_failed"`,
    /// `"noscript"`, `"cluster_down"`, `"unavailable"` or `"backend_error"`.
    pub fn as_str(self) -> &'static str {
        match self {
            OutageCause::Refused => "refused",
            OutageCause::Timeout => "timeout",
            OutageCause::AuthFailed => "auth_failed",
            OutageCause::NoScript => "noscript",
            OutageCause::ClusterDown => "cluster_down",
            OutageCause::Unavailable => "unavailable",
            OutageCause::BackendError => "backend_error",
        }
    }

    /// The cause of a failed call's error; `None` for an error that is not
    /// the backend's (bad arguments, a closed limiter).
    pub fn of(error: &Error) -> Option<OutageCause> {
        if !error.kind().is_backend_failure() {
            return None;
        }
        if error.kind() == ErrorKind::Timeout {
            return Some(OutageCause::Timeout);
        }
        let mut text = error.to_string();
        let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
        while let Some(e) = cur {
            if let Some(r) = e.downcast_ref::<redis::RedisError>() {
                use redis::{ErrorKind as K, ServerErrorKind as S};
                match r.kind() {
                    _ if r.is_connection_refusal() => return Some(OutageCause::Refused),
                    K::AuthenticationFailed => return Some(OutageCause::AuthFailed),
                    K::Server(S::NoScript) => return Some(OutageCause::NoScript),
                    K::Server(S::ClusterDown) | K::ClusterConnectionNotFound => return Some(OutageCause::ClusterDown),
                    _ => {}
                }
            }
            text.push(' ');
            text.push_str(&e.to_string());
            cur = e.source();
        }
        let has = |s: &str| text.contains(s);
        Some(if has("onnection refused") {
            OutageCause::Refused
        } else if has("WRONGPASS") || has("NOAUTH") || has("NOPERM") || has("uthentication") {
            OutageCause::AuthFailed
        } else if has("NOSCRIPT") || has("NoScript") {
            OutageCause::NoScript
        } else if has("CLUSTERDOWN") {
            OutageCause::ClusterDown
        } else if error.kind() == ErrorKind::BackendUnavailable {
            OutageCause::Unavailable
        } else {
            OutageCause::BackendError
        })
    }
}

impl std::fmt::Display for OutageCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A change in the backend's health, reported once per outage.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum HealthEvent {
    /// Calls started failing: `cause`, and the first failed call's `error`.
    /// Until [`HealthEvent::Up`], calls are answered by the failure policy.
    Down {
        /// Why.
        cause: OutageCause,
        /// The first failed call's error.
        error: Error,
    },
    /// A call succeeded again after an outage.
    Up {
        /// The outage's cause (as reported by its `Down`).
        cause: OutageCause,
        /// From the first failed call to this success.
        down_for: Duration,
        /// How many calls failed during the outage.
        failed_calls: u64,
    },
}

impl HealthEvent {
    /// True for [`HealthEvent::Down`] (a warning), false for [`HealthEvent::Up`].
    pub fn is_down(&self) -> bool {
        matches!(self, HealthEvent::Down { .. })
    }

    /// The outage's cause.
    pub fn cause(&self) -> OutageCause {
        match self {
            HealthEvent::Down { cause, .. } | HealthEvent::Up { cause, .. } => *cause,
        }
    }

    /// One line for a log, the same in every language, e.g.
    /// `throttlegate: backend outage (refused): ...; checks are answered by
    /// the failure policy until it answers again`.
    pub fn message(&self) -> String {
        match self {
            HealthEvent::Down { cause, error } => format!(
                "throttlegate: backend outage ({cause}): {error}; checks are answered by the failure policy until it answers again"
            ),
            HealthEvent::Up { cause, down_for, failed_calls } => format!(
                "throttlegate: backend recovered after {:.1} s ({cause} outage; {failed_calls} calls answered by the failure policy)",
                down_for.as_secs_f64()
            ),
        }
    }
}

impl std::fmt::Display for HealthEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
}

/// Where a limiter reports its [`HealthEvent`]s: a function called on the
/// thread of the call that changed the health (keep it short; it never
/// runs twice at once for one limiter).
#[derive(Clone)]
pub struct HealthSink(Arc<dyn Fn(&HealthEvent) + Send + Sync>);

impl HealthSink {
    /// A sink calling `f`.
    pub fn new(f: impl Fn(&HealthEvent) + Send + Sync + 'static) -> HealthSink {
        HealthSink(Arc::new(f))
    }

    /// A sink writing each event's [`HealthEvent::message`] as one line on stderr.
    pub fn stderr() -> HealthSink {
        HealthSink::new(|e| eprintln!("{}", e.message()))
    }

    /// Report `event`.
    pub fn report(&self, event: &HealthEvent) {
        (self.0)(event)
    }
}

impl std::fmt::Debug for HealthSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HealthSink(..)")
    }
}

/// A limiter's view of its backend's health: down from the first failed
/// call until the next success. The calls' fast path reads one flag.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    down: AtomicBool,
    failed: AtomicU64,
    /// When the outage began and its cause, while down.
    state: Mutex<Option<(Instant, OutageCause)>>,
    sink: Option<HealthSink>,
}

impl Outage {
    pub fn new(sink: Option<HealthSink>) -> Outage {
        Outage { sink, ..Outage::default() }
    }

    /// A call reached the backend and had its answer.
    pub fn succeeded(&self) {
        if !self.down.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some((since, cause)) = state.take() else { return };
        self.down.store(false, Ordering::Relaxed);
        let failed_calls = self.failed.swap(0, Ordering::Relaxed);
        if let Some(sink) = &self.sink {
            sink.report(&HealthEvent::Up { cause, down_for: since.elapsed(), failed_calls });
        }
    }

    /// A call failed with `error` (ignored unless it is the backend's failure).
    pub fn failed(&self, error: &Error) {
        let Some(cause) = OutageCause::of(error) else { return };
        self.failed.fetch_add(1, Ordering::Relaxed);
        if self.down.load(Ordering::Relaxed) {
            return;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.is_some() {
            return;
        }
        *state = Some((Instant::now(), cause));
        self.down.store(true, Ordering::Relaxed);
        if let Some(sink) = &self.sink {
            sink.report(&HealthEvent::Down { cause, error: error.clone() });
        }
    }

    /// True between a failed call and the next success.
    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_event_per_outage_and_one_per_recovery() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        let o = Outage::new(Some(HealthSink::new(move |e| log.lock().unwrap().push(e.message()))));
        o.succeeded();
        for _ in 0..100 {
            o.failed(&Error::timeout(Duration::from_millis(100)));
        }
        // Not the backend's failure: no outage.
        o.failed(&Error::closed());
        assert!(o.is_down());
        o.succeeded();
        o.succeeded();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen[0].contains("outage (timeout)"), "{}", seen[0]);
        assert!(seen[1].contains("recovered") && seen[1].contains("100 calls"), "{}", seen[1]);
    }

    #[test]
    fn causes_are_read_from_the_redis_error() {
        let refused = Error::from(redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
        assert_eq!(OutageCause::of(&refused), Some(OutageCause::Refused));
        let auth = Error::from(redis::RedisError::from((redis::ErrorKind::AuthenticationFailed, "WRONGPASS")));
        assert_eq!(OutageCause::of(&auth), Some(OutageCause::AuthFailed));
        assert_eq!(OutageCause::of(&Error::timeout(Duration::from_millis(5))), Some(OutageCause::Timeout));
        assert_eq!(OutageCause::of(&Error::invalid_argument("cost")), None);
    }
}

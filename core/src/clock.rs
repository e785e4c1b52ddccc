//! Where a check's "now" comes from.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The clock a limiter decides with.
#[derive(Debug, Clone, Default)]
pub enum Clock {
    /// The backend's own clock (the default): Redis's `TIME` inside the
    /// script, so skew between application hosts cannot change a decision;
    /// a monotonic clock in the embedded backend.
    #[default]
    Backend,
    /// This host's wall clock, for Redis services that refuse `TIME` in scripts.
    /// Hosts sharing a Redis must then keep their clocks in sync.
    System,
    /// An explicit clock, moved by hand (tests, simulations of hours of traffic).
    Manual(ManualClock),
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    /// A manual clock reading `start_us` microseconds.
    pub fn new(start_us: i64) -> ManualClock {
        ManualClock(Arc::new(AtomicI64::new(start_us)))
    }

    /// The current reading in microseconds.
    pub fn now_us(&self) -> i64 {
        self.0.load(Ordering::SeqCst)
    }

    /// Set the reading (it may move backwards; the algorithms tolerate it).
    pub fn set_us(&self, now_us: i64) {
        self.0.store(now_us, Ordering::SeqCst);
    }

    /// Move forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(d.as_micros() as i64, Ordering::SeqCst);
    }
}

/// Microseconds since the Unix epoch on this host.
pub(crate) fn system_now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Microseconds on this host's monotonic clock, from an arbitrary origin
/// (the embedded backend's clock is a start time plus the difference of
/// two readings). Read through `quanta`: the CPU's time-stamp counter
/// scaled to nanoseconds by a calibration against `CLOCK_MONOTONIC` made
/// once per process, or `CLOCK_MONOTONIC` itself where the counter is not
/// invariant. A counter read costs a third of a `clock_gettime` call, which
/// was a fifth of an embedded check.
pub(crate) fn monotonic_us() -> i64 {
    static CLOCK: std::sync::OnceLock<quanta::Clock> = std::sync::OnceLock::new();
    let clock = CLOCK.get_or_init(quanta::Clock::new);
    (clock.delta_as_nanos(0, clock.raw()) / 1_000) as i64
}

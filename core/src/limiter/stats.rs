//! The limiter's counters for operators.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::decision::Decision;

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
    /// Settles that corrected at least one rule ([`crate::Limiter::settle`],
    /// [`crate::Limiter::settle_call`]).
    pub settled: u64,
    /// Units settles gave back, summed over the rules they corrected.
    pub refunded: u64,
    /// Units settles took beyond the checks' costs, summed over the rules they corrected.
    pub debited: u64,
}

impl Stats {
    /// Every counter with its name (the names every front end uses), in
    /// declaration order.
    pub fn fields(&self) -> [(&'static str, u64); 10] {
        [
            ("calls", self.calls),
            ("allowed", self.allowed),
            ("denied", self.denied),
            ("degraded_allowed", self.degraded_allowed),
            ("degraded_denied", self.degraded_denied),
            ("backend_errors", self.backend_errors),
            ("timeouts", self.timeouts),
            ("settled", self.settled),
            ("refunded", self.refunded),
            ("debited", self.debited),
        ]
    }
}

/// The per-call counters, striped over cache lines so that threads counting
/// at once do not contend for one line; [`Counters::read`] sums the stripes.
#[derive(Default)]
#[repr(align(64))]
struct Stripe {
    calls: AtomicU64,
    denied: AtomicU64,
}

pub(super) const STRIPES: usize = 8;

/// This thread's stripe (threads take stripes in turn).
pub(super) fn stripe_index() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static MINE: usize = NEXT.fetch_add(1, Ordering::Relaxed) % STRIPES;
    }
    MINE.with(|i| *i)
}

/// What a limiter counts.
#[derive(Default)]
pub(crate) struct Counters {
    stripes: [Stripe; STRIPES],
    pub degraded_allowed: AtomicU64,
    pub degraded_denied: AtomicU64,
    pub backend_errors: AtomicU64,
    pub timeouts: AtomicU64,
    pub settled: AtomicU64,
    pub refunded: AtomicU64,
    pub debited: AtomicU64,
}

impl Counters {
    /// Count an answer (`allowed` is derived: calls less denials).
    pub fn count(&self, d: &Decision) {
        let c = &self.stripes[stripe_index()];
        c.calls.fetch_add(1, Ordering::Relaxed);
        if !d.allowed {
            c.denied.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Add one to `counter`.
    pub fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The totals.
    pub fn read(&self) -> Stats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let sum = |f: fn(&Stripe) -> &AtomicU64| self.stripes.iter().map(|s| get(f(s))).sum::<u64>();
        // Denials are read first: a call counted in between shows as allowed.
        let denied = sum(|s| &s.denied);
        let calls = sum(|s| &s.calls);
        Stats {
            calls,
            allowed: calls.saturating_sub(denied),
            denied,
            degraded_allowed: get(&self.degraded_allowed),
            degraded_denied: get(&self.degraded_denied),
            backend_errors: get(&self.backend_errors),
            timeouts: get(&self.timeouts),
            settled: get(&self.settled),
            refunded: get(&self.refunded),
            debited: get(&self.debited),
        }
    }
}

//! The limiter's counters for operators.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

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

/// Stripes `0..OWNED` are each held by one live thread at a time, which
/// adds to them with a plain load and store; the rest are shared by the
/// threads beyond those, which add with an atomic read-modify-write.
pub(super) const OWNED: usize = 16;
const _: () = assert!(OWNED <= 32, "FREE has a bit per held stripe");
/// Every stripe, owned and shared.
pub(super) const STRIPES: usize = OWNED + 4;

/// The stripe a thread counts in: its index, and whether the thread holds
/// it alone (see [`OWNED`]).
#[derive(Clone, Copy, Debug)]
pub(super) struct StripeRef {
    pub index: usize,
    owned: bool,
}

impl StripeRef {
    /// Whether this thread holds the stripe alone.
    #[inline]
    pub fn held(self) -> bool {
        self.owned
    }

    /// Add `n` to `counter` of this stripe. A held stripe has one writer,
    /// so a load and a store are exact there (and spare the locked
    /// instruction that was a tenth of an embedded check); readers may see
    /// the value a moment late, as with any relaxed counter.
    #[inline]
    pub fn add(self, counter: &AtomicU64, n: u64) {
        if self.owned {
            counter.store(counter.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        } else {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }
}

/// A thread's claim on a stripe, given back when the thread ends.
struct Claim(StripeRef);

/// The held stripes free to take, a bit each. Taken with a
/// compare-and-swap (acquire) and given back with an `or` (release), so the
/// last writes of the thread that gave a stripe back come before the first
/// of the next; no lock, so a `fork()` in the middle leaves nothing held.
static FREE: AtomicU32 = AtomicU32::new(u32::MAX >> (32 - OWNED));

impl Claim {
    fn new() -> Claim {
        static NEXT_SHARED: AtomicUsize = AtomicUsize::new(0);
        let taken = FREE.fetch_update(Ordering::Acquire, Ordering::Relaxed, |free| {
            (free != 0).then(|| free & (free - 1))
        });
        Claim(match taken {
            Ok(free) => StripeRef { index: free.trailing_zeros() as usize, owned: true },
            Err(_) => shared(NEXT_SHARED.fetch_add(1, Ordering::Relaxed)),
        })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if self.0.owned {
            FREE.fetch_or(1 << self.0.index, Ordering::Release);
        }
    }
}

fn shared(n: usize) -> StripeRef {
    StripeRef { index: OWNED + n % (STRIPES - OWNED), owned: false }
}

/// This thread's stripe: held alone by the first [`OWNED`] live threads,
/// shared beyond them (and while the thread's locals are being torn down).
#[inline]
pub(super) fn stripe() -> StripeRef {
    thread_local! {
        static MINE: Claim = Claim::new();
    }
    MINE.try_with(|c| c.0).unwrap_or_else(|_| shared(0))
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
    pub fn count(&self, stripe: StripeRef, d: &Decision) {
        self.count_one(stripe, d.allowed);
    }

    /// [`Counters::count`] of a decision that is `allowed` or not, before it is made.
    #[inline]
    pub fn count_one(&self, stripe: StripeRef, allowed: bool) {
        let c = &self.stripes[stripe.index];
        stripe.add(&c.calls, 1);
        if !allowed {
            stripe.add(&c.denied, 1);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// More threads than held stripes, in waves (so that stripes given back
    /// are held again), each counting on its own and all at once: not one
    /// count lost, held or shared.
    #[test]
    fn counts_are_exact_with_more_threads_than_held_stripes() {
        let counters = Counters::default();
        let (threads, waves, each) = (3 * OWNED, 3, 200_000u64);
        let mut yes = Decision::unlimited();
        yes.allowed = true;
        let mut no = yes.clone();
        no.allowed = false;
        for wave in 0..waves {
            let start = std::sync::Barrier::new(threads);
            let held = std::thread::scope(|s| {
                let handles: Vec<_> = (0..threads)
                    .map(|t| {
                        let (counters, start, yes, no) = (&counters, &start, &yes, &no);
                        s.spawn(move || {
                            let mine = stripe();
                            start.wait();
                            for i in 0..each {
                                counters.count(stripe(), if (i + t as u64) % 4 == 0 { no } else { yes });
                            }
                            mine.owned as usize
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).sum::<usize>()
            });
            // Stripes come back when their threads end, so every wave holds
            // most of them (threads of other tests may hold a few).
            assert!(held >= OWNED / 2, "wave {wave}: {held} threads held a stripe");
        }
        let s = counters.read();
        let calls = (threads * waves) as u64 * each;
        assert_eq!(s.calls, calls);
        assert_eq!(s.denied, calls / 4);
        assert_eq!(s.allowed, calls - calls / 4);
    }
}

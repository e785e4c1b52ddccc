//! The sliding window of counters against the exact sliding-window log, on
//! random traffic (property tests on the embedded backend, whose arithmetic
//! the conformance vectors hold equal to Redis's):
//!
//! - it never admits more than the log allows: after every admission, the
//!   units it admitted in the last `window` are at most `limit`, so no window
//!   of that length anywhere holds more;
//! - it under-admits by at most one sub-window: whenever it denies, an exact
//!   log of `window + precision` over the same admissions denies too, and its
//!   `retry_after` is no shorter than the exact log's (of `window`) and at
//!   most one `precision` longer;
//! - `retry_after` is exact: a peek one microsecond earlier is denied, a
//!   peek at it admitted.
//!
//! The suite runs a few hundred cases; `PROPTEST_CASES=100000` runs more.

use std::time::Duration;

use proptest::prelude::*;
use throttlegate::{Algorithm, CheckOptions, Clock, Limiter, ManualClock, Policy, Rule};

fn cases(default: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    ProptestConfig { cases: n, failure_persistence: None, ..ProptestConfig::default() }
}

/// Units admitted at a time later than `floor`.
fn units_after(admitted: &[(i64, u64)], floor: i64) -> u64 {
    admitted.iter().filter(|(t, _)| *t > floor).map(|(_, c)| c).sum()
}

/// The exact log's wait for `cost` at `now` over these admissions (0: it admits now).
fn log_wait(admitted: &[(i64, u64)], now: i64, window: i64, limit: u64, cost: u64) -> i64 {
    let inside: Vec<(i64, u64)> = admitted.iter().copied().filter(|(t, _)| *t > now - window).collect();
    let count: u64 = inside.iter().map(|(_, c)| c).sum();
    if count + cost <= limit {
        return 0;
    }
    let need = count + cost - limit;
    let mut left = 0;
    for (t, c) in inside {
        left += c;
        if left >= need {
            return t + window - now;
        }
    }
    unreachable!("cost is at most the limit")
}

proptest! {
    #![proptest_config(cases(300))]

    #[test]
    fn counters_never_admit_more_than_the_log_and_lag_it_by_at_most_one_sub_window(
        limit in 1u64..20,
        window_ms in 1u64..5_000,
        sub_windows in 1u64..=120,
        start_us in 0i64..4_000_000_000_000_000,
        steps in prop::collection::vec((0i64..2_000_000, 1u64..=8), 1..150),
    ) {
        let window = Duration::from_millis(window_ms);
        let precision = Duration::from_millis(window_ms.div_ceil(sub_windows));
        let (w, p) = (window.as_micros() as i64, precision.as_micros() as i64);
        let rule = Rule::new("counters", "all", Algorithm::SlidingWindow { limit, window, precision });
        let clock = ManualClock::new(start_us);
        let limiter = Limiter::builder(Policy::new(vec![rule]).unwrap())
            .clock(Clock::Manual(clock.clone()))
            .build()
            .unwrap();
        let attrs: &[(&str, &str)] = &[];
        let mut admitted: Vec<(i64, u64)> = Vec::new();
        for (advance, cost) in steps {
            clock.set_us(clock.now_us() + advance);
            let now = clock.now_us();
            let cost = cost.min(limit);
            let d = limiter.check_blocking(attrs, &CheckOptions { cost, ..CheckOptions::default() }).unwrap();
            if d.allowed {
                admitted.push((now, cost));
                prop_assert!(units_after(&admitted, now - w) <= limit, "more than {} in a window at {}", limit, now);
                continue;
            }
            prop_assert!(units_after(&admitted, now - w - p) + cost > limit,
                "denied at {} although a log of window + precision admits", now);
            let r = d.retry_after.as_micros() as i64;
            let r_log = log_wait(&admitted, now, w, limit, cost);
            prop_assert!(r_log <= r && r <= r_log + p, "retry_after {} against the log's {} (precision {})", r, r_log, p);
            clock.set_us(now + r - 1);
            prop_assert!(!limiter.peek_blocking(attrs, cost).unwrap().allowed);
            clock.set_us(now + r);
            prop_assert!(limiter.peek_blocking(attrs, cost).unwrap().allowed);
            clock.set_us(now);
        }
    }
}

//! The embedded backend on its own: exactness under threads, bounded memory.

use std::time::Duration;

use throttlegate::{Clock, Limiter, ManualClock, Policy, Rule};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn many_threads_admit_exactly_the_limit() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for rep in 0..20 {
        let l = Limiter::in_memory(
            Policy::new(vec![
                Rule::sliding_window_log("w", "k:{k}", 100, ms(60_000)),
                Rule::token_bucket("b", "k:{k}", 1000, 0.001),
            ])
            .unwrap(),
        );
        let admitted: u32 = std::thread::scope(|s| {
            let handles: Vec<_> = (0..64)
                .map(|_| {
                    let l = l.clone();
                    s.spawn(move || {
                        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                        (0..4)
                            .filter(|_| rt.block_on(l.check(&[("k", "hot")], 1)).unwrap().allowed)
                            .count() as u32
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(admitted, 100, "repetition {rep}");
        // The bucket was charged only for admitted requests (the peek is
        // denied by the log, so the bucket shows all it has).
        let d = rt.block_on(l.peek(&[("k", "hot")], 1)).unwrap();
        assert_eq!(d.results[1].remaining, 900);
    }
}

#[test]
fn a_million_keys_through_a_small_window_leave_few_entries() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let clock = ManualClock::new(0);
    let l = Limiter::builder(
        Policy::new(vec![
            Rule::sliding_window_log("w", "ip:{ip}", 5, ms(10)),
            Rule::token_bucket("b", "b:{ip}", 5, 1000.0),
        ])
        .unwrap(),
    )
    .clock(Clock::Manual(clock.clone()))
    .build()
    .unwrap();
    let mut peak = 0;
    for i in 0..1_000_000u32 {
        let ip = format!("k{i}");
        let d = rt.block_on(l.check(&[("ip", ip.as_str())], 1)).unwrap();
        assert!(d.allowed);
        clock.advance(Duration::from_micros(5));
        if i % 10_000 == 0 {
            peak = peak.max(l.memory_entries().unwrap());
        }
    }
    let entries = l.memory_entries().unwrap();
    // 10 ms window at 200k keys/s: ~2,000 live keys per rule. Sweeps keep the
    // map within a small multiple of that (plus the per-shard floor).
    assert!(peak < 200_000, "peak of {peak} entries for 2 million keys");
    assert!(entries < 200_000, "{entries} entries left");
}

#[test]
fn memory_and_manual_clock_are_exact() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let clock = ManualClock::new(1_000_000);
    let l = Limiter::builder(Policy::new(vec![Rule::sliding_window_log("w", "ip:{ip}", 2, ms(1000))]).unwrap())
        .clock(Clock::Manual(clock.clone()))
        .build()
        .unwrap();
    let a = [("ip", "1")];
    assert!(rt.block_on(l.check(&a, 1)).unwrap().allowed);
    clock.advance(ms(250));
    assert!(rt.block_on(l.check(&a, 1)).unwrap().allowed);
    let d = rt.block_on(l.check(&a, 1)).unwrap();
    assert!(!d.allowed);
    assert_eq!(d.retry_after, ms(750));
    assert_eq!(rt.block_on(l.reset(&a)).unwrap(), 1);
    assert!(rt.block_on(l.check(&a, 1)).unwrap().allowed);
}

#[test]
fn in_process_answers_need_no_runtime() {
    let l = Limiter::in_memory(Policy::new(vec![Rule::sliding_window_log("w", "ip:{ip}", 1, ms(1000))]).unwrap());
    assert!(l.is_in_process());
    let opts = throttlegate::CheckOptions { cost: 1, call_id: None };
    assert!(l.check_in_process(&[("ip", "1")], &opts).unwrap().unwrap().allowed);
    assert!(!l.check_in_process(&[("ip", "1")], &opts).unwrap().unwrap().allowed);
    assert!(!l.peek_in_process(&[("ip", "1")], 1).unwrap().unwrap().allowed);
    let bad = throttlegate::CheckOptions { cost: 0, call_id: None };
    assert!(l.check_in_process(&[("ip", "1")], &bad).unwrap().is_err());
    l.close();
    assert_eq!(
        l.check_in_process(&[("ip", "1")], &opts).unwrap().unwrap_err().kind(),
        throttlegate::ErrorKind::Closed
    );
    let remote = Limiter::builder(Policy::new(vec![Rule::sliding_window_log("w", "ip:{ip}", 1, ms(1000))]).unwrap())
        .url("redis://127.0.0.1:1")
        .build()
        .unwrap();
    assert!(remote.check_in_process(&[("ip", "1")], &opts).is_none());
}
